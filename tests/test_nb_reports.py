"""Checks moved out of `nbs/08a_reports.ipynb` (the shared report chapter): the edge cases of `run_comparability`
and `RunScale` that the chapter's shown example does not need on the page."""

from depthbench_nb.report_common import PaperPlan, RunScale, planned_steps, run_comparability, scale_label

PLAN_400M = PaperPlan("400M L32", dict(n_layer=32, d_model=896), tokens=7600 * 512 * 2048, steps=7600)
RECORD_400M = {
    "status": "completed",
    "n_layer": 32,
    "d_model": 896,
    "steps": 7600,
    "train.global_batch": 512,
    "train.seq_len": 2048,
    "preset": "my-cluster",
}


def test_a_tokens_per_param_budget_is_read_as_the_trainer_reads_it():
    "20 tokens per parameter: steps = round(20 x Pre-LN params / tokens per step), 7,617 at 400M L32, not 7,600."
    rec = RECORD_400M | {
        "train.tokens_per_param": 20.0,
        "n_head": 16,
        "n_kv_head": 16,
        "ffn_hidden": 2400,
        "vocab_size": 50280,
        "steps": 7617,
    }
    assert planned_steps(rec) == round(20 * 399_358_848 / (512 * 2048)) == 7617
    assert run_comparability(rec, PLAN_400M)[1] == ["7,617 steps completed (the paper: 7,600)"]


def test_run_scale_labels():
    "Only a report whose every completed run is at the paper's setting drops NOT comparable from its label."
    assert "NOT comparable" in RunScale(("tiny",), False, "demo", n_runs=3).label
    assert "NOT comparable" in RunScale(("tiny",), False, "runs", 3, 0).label
    assert "NOT comparable" in RunScale(("400m", "tiny"), False, "runs", n_runs=3, n_comparable=1).label
    assert "NOT comparable" not in RunScale(("400m",), True, "runs", n_runs=2, n_comparable=2).label
    assert "all 3" in RunScale(("looped",), True, "runs", 3, 3).label


def test_a_looped_cell_read_under_dotted_names():
    "A record of dotted `model.` / `train.` names (a collected table) against a looped cell with a recurrence."
    plan = PaperPlan("a test cell", dict(d_model=640, recurrence=4), tokens=1000 * 2**18, steps=1000)
    rec = {
        "model.d_model": 640,
        "model.recurrence": 4,
        "train.tokens": 1000 * 2**18,
        "train.global_batch": 128,
        "train.seq_len": 2048,
        "steps": 1000,
        "status": "completed",
    }
    assert run_comparability(rec, plan) == (True, [])
    assert scale_label(True, []) == "paper scale"
    ok, why = run_comparability(dict(rec, **{"train.max_steps": 20, "steps": 20}), plan)  # capped at 20 steps
    assert (
        not ok and any(w.startswith("planned tokens") for w in why) and "20 steps completed (the paper: 1,000)" in why
    )
    assert (
        scale_label(*run_comparability(dict(rec, **{"model.d_model": 128}), plan))
        == "reduced scale: d_model 128 (the paper: 640)"
    )
    assert run_comparability(dict(rec, status="diverged"), plan)[1] == ["status diverged"]
    assert run_comparability(rec, None) == (False, ["the paper has no run at this setting"])
