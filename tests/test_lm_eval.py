"""lm-eval: the model type `depthbench` on offline tasks defined here (tests/data/lm_eval: YAML over a local JSONL) for
two designs and the looped model, every request type checked against an independent computation with our model; run
folders and exports; the `lm_eval` command itself; the domain NLL through lm-eval agrees with our own scorer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
import torch.nn.functional as F

lm_eval = pytest.importorskip(
    "lm_eval", reason="lm-eval is the optional 'eval' extra (pip install 'depthbench-nb[eval]')"
)
from lm_eval.tasks import TaskManager  # noqa: E402
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: E402

from depthbench_nb.config import ConfigError  # noqa: E402
from depthbench_nb.hf_export import export_hf, load_for_eval  # noqa: E402
from depthbench_nb.interop import generate as our_generate  # noqa: E402
from depthbench_nb.lmeval import DepthBenchLM, cli_downstream, compare_nll_routes, domain_nll, looped_downstream  # noqa: E402

TASKS_DIR = Path(__file__).resolve().parent / "data" / "lm_eval"
TASKS = ["depthbench_tiny_choice", "depthbench_tiny_rolling", "depthbench_tiny_generate"]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def task_manager():
    return TaskManager(
        include_path=str(TASKS_DIR), include_defaults=False
    )  # only the tasks of this folder: fast, offline


def evaluate(pretrained, task_manager, tasks=TASKS, **model_args):
    args = ",".join(f"{k}={v}" for k, v in dict(pretrained=pretrained, **model_args).items())
    return lm_eval.simple_evaluate(
        model="depthbench",
        model_args=args,
        tasks=tasks,
        task_manager=task_manager,
        batch_size=4,
        device="cpu",
        log_samples=True,
    )


class Reference:
    "Independent scoring with the run's own model and tokenizer: one unpadded, unbatched forward per request."

    def __init__(self, path):
        got = load_for_eval(path)
        self.model, self.tok, self.eos = got["model"], got["tokenizer"], got["eos_id"]

    def encode(self, s):
        return self.tok.encode(s, add_special_tokens=False).ids

    def pair(self, ctx: str, cont: str):
        """lm-eval's rule, written out: trailing context spaces join the continuation;
        the whole string encoded, then split."""
        n = len(ctx) - len(ctx.rstrip())
        if n:
            ctx, cont = ctx[:-n], ctx[-n:] + cont
        whole, c = self.encode(ctx + cont), self.encode(ctx)
        return c, whole[len(c) :]

    @torch.no_grad()
    def score(self, ctx_ids, cont_ids) -> float:
        ids = list(ctx_ids) + list(cont_ids)
        logp = F.log_softmax(self.model(torch.tensor([ids[:-1]]))[0], -1)  # [T, V]
        first = len(ids) - 1 - len(cont_ids)
        return float(sum(logp[first + j, t] for j, t in enumerate(cont_ids)))

    def rolling(self, text: str, window: int) -> float:
        pairs = get_rolling_token_windows(self.encode(text), self.eos, window, 1)
        return sum(self.score(c, x) for c, x in map(make_disjoint_window, pairs))

    def generate(self, ctx: str, max_new: int, until) -> str:
        ids = self.encode(ctx)
        new = our_generate(self.model, torch.tensor([ids]), max_new)[0, len(ids) :].tolist()
        new = new[: new.index(self.eos)] if self.eos in new else new
        text = self.tok.decode(new, skip_special_tokens=False)
        for term in until:
            text = text.split(term)[0]
        return text


@pytest.mark.parametrize("arch", ["hc", "attnres", "looped"])
def test_every_request_type_matches_our_model(arch, trained_run, task_manager):
    run = trained_run(arch)
    out = evaluate(run, task_manager)
    ref = Reference(run)
    res, samples = out["results"], out["samples"]
    assert {"acc,none", "word_perplexity,none", "exact_match,none"} <= set(res[TASKS[0]]) | set(res[TASKS[1]]) | set(
        res[TASKS[2]]
    )
    # loglikelihood (multiple choice): every choice of every document, batched by lm-eval vs alone
    for s in samples["depthbench_tiny_choice"]:
        for (ctx, cont), ((ll, greedy),) in zip(s["arguments"], s["resps"]):
            assert abs(ll - ref.score(*ref.pair(ctx, cont))) < 1e-4, (ctx, cont)
    acc = sum(
        int(max(range(len(s["resps"])), key=lambda i: s["resps"][i][0][0]) == s["target"]) for s in samples[TASKS[0]]
    )
    assert res[TASKS[0]]["acc,none"] == pytest.approx(acc / len(samples[TASKS[0]]))
    # loglikelihood_rolling: whole passages
    for s in samples["depthbench_tiny_rolling"]:
        ((text,),) = s["arguments"]
        assert abs(s["resps"][0][0] - ref.rolling(text, 2048)) < 1e-3, text
    # generate_until: greedy continuation cut at the stop strings == our cached greedy generation
    for s in samples["depthbench_tiny_generate"]:
        ((ctx, gen),) = s["arguments"]
        assert s["resps"][0][0] == ref.generate(ctx, gen["max_gen_toks"], gen["until"]), ctx


def test_rolling_windows_and_an_export_give_the_run_folders_numbers(trained_run, task_manager, tmp_path):
    run = trained_run("hc")
    export_hf(run, tmp_path / "export")
    small = evaluate(run, task_manager, tasks=["depthbench_tiny_rolling"], max_length=8)  # several windows per passage
    ref = Reference(run)
    for s in small["samples"]["depthbench_tiny_rolling"]:
        ((text,),) = s["arguments"]
        assert len(ref.encode(text)) > 8 and abs(s["resps"][0][0] - ref.rolling(text, 8)) < 1e-3
    a = evaluate(run, task_manager, tasks=["depthbench_tiny_choice"])
    b = evaluate(str(tmp_path / "export"), task_manager, tasks=["depthbench_tiny_choice"])
    ra = [r for s in a["samples"]["depthbench_tiny_choice"] for r in s["resps"]]
    rb = [r for s in b["samples"]["depthbench_tiny_choice"] for r in s["resps"]]
    assert len(ra) == 18 and all(abs(x[0][0] - y[0][0]) < 1e-5 for x, y in zip(ra, rb))


def test_domain_nll_through_lm_eval_agrees_with_our_scorer(trained_run):
    run = trained_run("mhc")
    rows = {r["set"]: r for r in compare_nll_routes(run, limit=8)}
    assert set(rows) == {"humaneval", "sciq"}  # the offline domain sets (coding, STEM)
    for r in rows.values():
        assert r["max_rel_diff_same_ids"] < 1e-5  # the same token ids: the scorers agree
        assert r["max_rel_diff_alike_docs"] < 1e-5  # the same documents tokenized alike: the routes agree
    # our scorer splits (context, completion) as lm-eval's _encode_pair does: every document is tokenized alike,
    # HumanEval's prompts that end in an indent (moved into the target before encoding) included
    assert rows["sciq"]["docs_tokenized_alike"] == 8 and rows["humaneval"]["docs_tokenized_alike"] == 8
    official = domain_nll(run, "lm-eval", limit=8)
    assert set(official["by_category"]) == {"coding", "stem"}
    assert official["sets"]["sciq"]["nll_mean"] == pytest.approx(rows["sciq"]["nll_mean_lm_eval"])


def test_the_lm_eval_command_finds_the_model_type(trained_run, tmp_path):
    "`lm_eval --model depthbench` from the shell (the package is never imported by the command itself)."
    run = trained_run("attnres")
    cmd = [
        str(BIN / "lm_eval"),
        "--model",
        "depthbench",
        "--model_args",
        f"pretrained={run}",
        "--tasks",
        "depthbench_tiny_choice",
        "--include_path",
        str(TASKS_DIR),
        "--batch_size",
        "4",
        "--output_path",
        str(tmp_path / "results"),
    ]
    env = dict(os.environ, HF_DATASETS_CACHE=str(tmp_path / "hf-datasets"))
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )  # --device: lm-eval's default cuda:0
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = list((tmp_path / "results").rglob("results_*.json"))
    acc = json.loads(result.read_text())["results"]["depthbench_tiny_choice"]["acc,none"]
    assert 0.0 <= acc <= 1.0
    bad = subprocess.run(
        cmd[:-2] + ["--tasks", "no_such_task"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert bad.returncode != 0 and "Tasks not found: no_such_task" in bad.stderr  # lm-eval's own message
    assert "depthbench_nb" not in bad.stderr  # not a traceback through our code


def test_bad_model_arguments_are_clear(trained_run, tmp_path):
    run = trained_run("hc")
    with pytest.raises(ConfigError, match="neither a run folder"):
        DepthBenchLM(str(tmp_path))
    with pytest.raises(ConfigError, match="is not a folder"):
        DepthBenchLM(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="unknown model_args \\['temprature'\\]"):
        DepthBenchLM(str(run), temprature=1)
    lm = DepthBenchLM(str(run), device="cpu")
    from lm_eval.api.instance import Instance

    with pytest.raises(ConfigError, match="generation options \\['top_k'\\] are not supported"):
        lm.generate_until([Instance("generate_until", {}, ("In the", dict(until=["\n"], top_k=5)), 0)])


def _bundle(root: Path, folder: str, config: str, key: str, entries: list, files: dict):
    "A bundle as the official prepare scripts write it: the configuration file and eval_data/<uri> JSONL files."
    for uri, rows in files.items():
        path = root / folder / "eval_data" / uri
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / folder / config).write_text(yaml.safe_dump({key: entries}))


def test_looped_downstream_on_local_bundles(trained_run, tmp_path, monkeypatch, capsys):
    """The looped paper's downstream evaluation (arXiv 2604.21106 Tables 8-10) through the model type `depthbench` on
    bundles made here: a 0-shot language-modelling task (TriviaQA's format) and a 0-shot multiple-choice task
    (ARC-Easy's), scored as continuation loss against an independent computation of the official prompt; a 2-shot
    task has two examples before its document; every task of the paper's list that is absent is named with why."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    run = trained_run("looped")
    root = tmp_path / "bundles"
    qa = [
        dict(context="Question: who created the heaven?\nAnswer: ", continuation="God"),
        dict(context="Question: in the beginning\nAnswer: ", continuation="God created the heaven"),
        dict(context="Question: and the earth was\nAnswer: ", continuation="without form"),
    ]
    math_rows = [
        dict(context=f"Question: {a} plus {b}?\nAnswer: ", continuation=str(a + b))
        for a, b in ((1, 2), (3, 4), (5, 6), (7, 1))
    ]
    _bundle(
        root,
        "saunshi_bundle",
        "saunshi.yaml",
        "tasks",
        [
            dict(
                label="triviaqa",
                dataset_uri="closed_book_qa/triviaqa.jsonl",
                task_type="language_modeling",
                num_fewshot=0,
                continuation_delimiter=" ",
                group="closed_book_qa",
            ),
            dict(
                label="svamp",
                dataset_uri="math_word_problems/svamp.jsonl",
                task_type="language_modeling",
                num_fewshot=2,
                continuation_delimiter=" ",
                group="math_word_problems",
            ),
        ],
        {"closed_book_qa/triviaqa.jsonl": qa, "math_word_problems/svamp.jsonl": math_rows},
    )
    arc = [
        dict(
            query="Question: what did God create first?\nAnswer:", choices=["the heaven", "the sea", "a tree"], gold=0
        ),
        dict(query="Question: the earth was\nAnswer:", choices=["full", "without form"], gold=1),
    ]
    _bundle(
        root,
        "eval_bundle",
        "core.yaml",
        "icl_tasks",
        [
            dict(
                label="arc_easy",
                dataset_uri="world_knowledge/arc_easy.jsonl",
                num_fewshot=[0],
                icl_task_type="multiple_choice",
                continuation_delimiter=" ",
            )
        ],
        {"world_knowledge/arc_easy.jsonl": arc},
    )
    rec = looped_downstream(run, root)
    ref = Reference(run)

    def official(context: str, continuation: str):
        """nats and tokens of the gold continuation of the official 0-shot prompt:
        the trimmed context, ' ', the continuation."""
        ctx, cont = ref.pair(context.strip(), " " + continuation)
        return -ref.score(ctx, cont), len(cont)

    for label, docs in (
        ("triviaqa", [(d["context"], d["continuation"]) for d in qa]),
        ("arc_easy", [(d["query"], d["choices"][d["gold"]]) for d in arc]),
    ):
        nats, toks = map(sum, zip(*(official(c, x) for c, x in docs)))
        assert rec["tasks"][label]["loss"] == pytest.approx(nats / toks, rel=1e-4), label
        assert rec["tasks"][label]["docs"] == len(docs)
    assert rec["groups"]["parametric_knowledge"]["loss"] == pytest.approx(rec["tasks"]["triviaqa"]["loss"])
    assert rec["groups"]["math"]["tasks"] == ["svamp"] and rec["groups"]["math"]["missing"] == ["asdiv", "mawps"]
    assert set(rec["groups"]) == {
        "parametric_knowledge",
        "reading_comprehension",
        "math",
        "reasoning_primitives",
        "compositional_symbolic",
    }
    assert (
        "no owned_bundle/owned.yaml" in rec["missing"]["induction_head"]
        and "has no task 'lambada_openai'" in rec["missing"]["lambada_openai"]
    )
    written = json.loads((run / "downstream" / "downstream.json").read_text())
    assert written["tasks"]["svamp"]["num_fewshot"] == 2 and written["missing"] == rec["missing"]
    # the 2-shot prompt: two solved examples (neither the document itself), a blank line after each, then the document
    lm = DepthBenchLM(str(run), device="cpu")
    manager = TaskManager(include_path=str(run / "downstream" / "lm_eval_tasks"), include_defaults=False)
    out = lm_eval.simple_evaluate(
        model=lm, tasks=["looped_svamp"], task_manager=manager, log_samples=True, bootstrap_iters=0
    )
    for s in out["samples"]["looped_svamp"]:
        ((ctx, cont),) = s["arguments"]
        assert (
            ctx.count("\n\n") == 2
            and ctx.endswith(s["doc"]["context"].strip() + " ")  # the delimiter: lm-eval moves it to the answer
            and cont == s["doc"]["continuation"]
        )
        assert s["doc"]["context"].strip() not in ctx.rstrip()[: -len(s["doc"]["context"].strip())]
    # the command: JSON with the groups, and a missing bundles folder is every task missing, not a crash
    capsys.readouterr()
    assert cli_downstream([str(run), "--bundles", str(tmp_path / "none"), "--json"]) == 0
    empty = json.loads(capsys.readouterr().out)
    assert (
        empty["tasks"] == {}
        and len(empty["missing"]) == 3 + 5 + 3 + 5 + 4
        and "no saunshi_bundle/saunshi.yaml" in empty["missing"]["nq"]
    )


def _official_prompts(task_type: str, doc: dict, delimiter: str, examples: list) -> list:
    """The prompts the official nanochat/core_eval.py renders (render_prompts_mc / _schema / _lm), written out
    independently: one per choice (multiple choice), per context option (schema); (without, with) for language
    modelling, `without` stripped as core_eval strips it."""
    if task_type == "multiple_choice":
        shots = "".join(f"{e['query']}{delimiter}{e['choices'][e['gold']]}\n\n" for e in examples)
        return [f"{shots}{doc['query']}{delimiter}{c}" for c in doc["choices"]]
    if task_type == "schema":
        shots = "".join(f"{e['context_options'][e['gold']]}{delimiter}{e['continuation']}\n\n" for e in examples)
        return [f"{shots}{o}{delimiter}{doc['continuation']}" for o in doc["context_options"]]
    shots = "".join(f"{e['context'].strip()}{delimiter}{e['continuation']}\n\n" for e in examples)
    without = f"{shots}{doc['context'].strip()}{delimiter}"
    return [without.strip(), without + doc["continuation"]]


def test_bundle_delimiter_is_in_the_prompt_lm_eval_renders(trained_run, tmp_path, monkeypatch):
    """A bundle task whose continuation_delimiter is not a space ("\\nAnswer: ", as several CORE tasks use): the
    prompt lm-eval renders (its logged requests) is the official core_eval prompt, for a language-modelling, a
    multiple-choice and a schema task, each with one few-shot example; the scored continuation starts after the
    delimiter (language modelling, multiple choice) or carries it (schema), as core_eval's token spans do."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    run, delim = trained_run("looped"), "\nAnswer: "
    qa = [
        dict(context=f"Question: {q}? ", continuation=a)
        for q, a in (("who", "God"), ("what", "light"), ("when", "first"))
    ]
    arc = [
        dict(query="Question: what came first?", choices=["the heaven", "the sea"], gold=0),
        dict(query="Question: the earth was", choices=["full", "without form"], gold=1),
        dict(query="Question: God said", choices=["let there be light", "no"], gold=0),
    ]
    wino = [
        dict(context_options=["The heaven was made", "The sea was made"], continuation="first", gold=0),
        dict(context_options=["The earth was void", "The earth was full"], continuation="then", gold=1),
        dict(context_options=["Light was", "Darkness was"], continuation="good", gold=0),
    ]
    entry = dict(num_fewshot=[1], continuation_delimiter=delim)
    _bundle(
        tmp_path / "b",
        "eval_bundle",
        "core.yaml",
        "icl_tasks",
        [
            dict(entry, label="arc_easy", dataset_uri="arc.jsonl", icl_task_type="multiple_choice"),
            dict(entry, label="winograd", dataset_uri="wino.jsonl", icl_task_type="schema"),
        ],
        {"arc.jsonl": arc, "wino.jsonl": wino},
    )
    _bundle(
        tmp_path / "b",
        "saunshi_bundle",
        "saunshi.yaml",
        "tasks",
        [
            dict(
                label="triviaqa",
                dataset_uri="qa.jsonl",
                task_type="language_modeling",
                num_fewshot=1,
                continuation_delimiter=delim,
            )
        ],
        {"qa.jsonl": qa},
    )
    rec = looped_downstream(run, tmp_path / "b", regime="flagship")
    assert {"arc_easy", "winograd", "triviaqa"} <= set(rec["tasks"])
    lm = DepthBenchLM(str(run), device="cpu")
    manager = TaskManager(include_path=str(run / "downstream" / "lm_eval_tasks"), include_defaults=False)
    tasks = {
        "looped_arc_easy": ("multiple_choice", arc),
        "looped_winograd": ("schema", wino),
        "looped_triviaqa": ("language_modeling", qa),
    }
    out = lm_eval.simple_evaluate(
        model=lm, tasks=list(tasks), task_manager=manager, log_samples=True, bootstrap_iters=0
    )
    for name, (kind, docs) in tasks.items():
        assert len(out["samples"][name]) == 3, name
        for s in out["samples"][name]:
            doc = next(d for d in docs if all(s["doc"][k] == v for k, v in d.items()))
            renders = [
                _official_prompts(kind, doc, delim, [e]) for e in docs if e is not doc
            ]  # the example: another doc
            texts = [ctx + cont for ctx, cont in s["arguments"]]
            if kind == "language_modeling":
                ((ctx, cont),) = s["arguments"]
                assert any(texts == [r[1]] and ctx.strip() == r[0] for r in renders), (name, ctx, cont)
                assert cont == doc["continuation"] and ctx.endswith(delim)  # the ' ' joins the answer when encoded
            else:
                assert any(texts == r for r in renders), (name, texts)
                ctx, cont = s["arguments"][0]
                assert ctx.endswith(delim) if kind == "multiple_choice" else cont == delim + doc["continuation"]
