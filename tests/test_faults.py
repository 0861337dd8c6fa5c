"""The fault suite: faults lose nothing and run nothing.

kill -9 anywhere in a run (between checkpoints, at one, in the middle of writing one, before the result) resumes
to the record of an uninterrupted run; a sweep whose driver is killed twice finishes every run exactly once; one
writer per run folder; a damaged checkpoint is survived; nothing read from a run folder or a checkpoint runs code;
a sweep whose runs crash exits non-zero and lists them; bad input is one clear error (JSON with --json) and leaves
no empty run folder; folders a user did not make are verified before they are trusted (a changed source shard is
redone, a changed token file refused on first use) and no write follows a symbolic link out of its folder; records of
the wrong type are `corrupt`. Marked `faults` (CI runs it: `scripts/test.sh` deselects nothing); run it alone with
`pytest -m faults`. The session's summary line (`conftest.py`) adds up the faults injected, the runs that
survived them and the records lost (must be 0).

Every fault is injected into a real process: the killed trainer is `depthbench-nb train` in a child process whose
own code kills itself (SIGKILL) at the chosen point, the kill points and the trials drawn from a seeded RNG."""

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from depthbench_nb.cli import main
from depthbench_nb.runs import list_checkpoints, load_run, read_metrics, read_result, run_dir
from depthbench_nb.run_params import make_run_config
from depthbench_nb.trainer import train

pytestmark = pytest.mark.faults

TIMING = ("tokens_per_s", "peak_mem_bytes", "mfu")  # wall-clock measurements: the only fields a resume changes
CLI = [sys.executable, "-c", "import sys; from depthbench_nb.cli import main; sys.exit(main())"]


# ------------------------------------------------------------------------------------------------------ helpers
def lock_holder(folder: Path):
    "The pid in a run folder's lock record while a live writer holds it (read from the file, as a person would)."
    try:
        rec = json.loads((Path(folder) / ".lock").read_text() or "null")
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("released"):
        return None
    try:
        os.kill(rec["pid"], 0)
    except ProcessLookupError:
        return None
    return rec["pid"]


def ledger(faults: int = 0, runs: int = 0, survived: int = 0, lost: int = 0) -> None:
    "Add to the session's fault summary (printed by conftest.py at the end of the run)."
    path = os.environ.get("DEPTHBENCH_FAULT_LEDGER")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(faults=faults, runs=runs, survived=survived, lost=lost)) + "\n")


def tiny(data, steps: int = 12, study: str = "faults", seed: int = 42, **kw):
    "A CPU-sized run (L2 d32, 4 x 32 tokens per step) with checkpoints every 3 steps, the newest 2 kept."
    kw.setdefault("checkpoint_every", 3)
    kw.setdefault("eval_every", 4)
    run = make_run_config(
        "preln",
        L=2,
        d_model=32,
        preset="tiny",
        max_steps=steps,
        study=study,
        seed=seed,
        data=str(data),
        verbose=False,
        **kw,
    )
    return run.replace(train=run.train.replace(seq_len=32, global_batch=4, eval_batches=1, keep_checkpoints=2))


def deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def lost_records(got: list[dict], want: list[dict]) -> int:
    "Rows of the uninterrupted record missing from (or changed in) a resumed one, plus rows it holds twice or extra."
    g, w = (
        [json.dumps(r, sort_keys=True) for r in deterministic(got)],
        [json.dumps(r, sort_keys=True) for r in deterministic(want)],
    )
    return sum(max(0, w.count(x) - g.count(x)) for x in set(w)) + max(0, len(g) - len(w))


def weights_digest(folder: Path) -> str:
    return hashlib.sha256((list_checkpoints(folder)[-1][1] / "model.safetensors").read_bytes()).hexdigest()


def planted_pickle(marker: Path, zip_format: bool = False) -> bytes:
    "A pickle whose __reduce__ calls os.system (touch marker): what someone who can write to a runs folder would plant."

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    if not zip_format:
        return pickle.dumps(Planted(), protocol=2)
    buf = io.BytesIO()
    torch.save({"state": Planted()}, buf)  # torch's own zip layout, with the payload inside
    return buf.getvalue()


def run_cli(args: list[str], env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=timeout)


def json_error(capsys, argv: list[str]) -> dict:
    "Run `depthbench-nb ARGV --json` in this process: exit 2, stdout exactly one {error, kind} object, no traceback."
    capsys.readouterr()  # what earlier steps of the test printed
    rc = main(argv + ["--json"])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    obj = json.loads(out)
    assert set(obj) == {"error", "kind"} and "Traceback" not in err, (out, err)
    return obj


@pytest.fixture(scope="module")
def reference(tiny_data, tmp_path_factory):
    "The uninterrupted record of the tiny run: metrics, result and final weights."
    runs = tmp_path_factory.mktemp("reference")
    old = os.environ.get("DEPTHBENCH_RUNS")
    os.environ["DEPTHBENCH_RUNS"] = str(runs)
    try:
        run = tiny(tiny_data)
        res = train(run, progress=False)
        return dict(
            run=run,
            rows=read_metrics(run_dir(run)),
            result=res,
            digest=weights_digest(run_dir(run)),
            folder=run_dir(run),
        )
    finally:
        if old is None:
            del os.environ["DEPTHBENCH_RUNS"]
        else:
            os.environ["DEPTHBENCH_RUNS"] = old


# --------------------------------------------------------------------------------------- kill -9 at random points
KILLER = r"""
import json, os, signal, sys
point, step = os.environ['DEPTHBENCH_TEST_KILL'].split(':'); step = int(step)
import torch
import depthbench_nb.runs as R
import depthbench_nb.trainer as T
import depthbench_nb.callbacks as CB
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
if point == 'row':                 # between checkpoints: after step's row, half of the next row on disk
    append = R.MetricsLog.append
    def hook(self, row):
        append(self, row)
        if row['step'] == step:
            with open(self.path, 'a') as f: f.write('{"step": %d, "loss": 3.' % (step + 1))
            die()
    R.MetricsLog.append = hook
elif point == 'in-write':          # in the middle of writing checkpoint `step`: weights done, train state half written
    save = torch.save
    def hook(obj, f, *a, **k):
        save(obj, f, *a, **k)
        if f'.tmp-step_{step:08d}' in str(f):
            data = open(f, 'rb').read(); open(f, 'wb').write(data[:len(data) // 2]); die()
    torch.save = hook
elif point == 'before-rename':     # checkpoint `step` complete with its checksums, not yet renamed into place
    sums = R.write_checksums
    def hook(folder, names):
        out = sums(folder, names)
        if f'.tmp-step_{step:08d}' in str(folder): die()
        return out
    R.write_checksums = hook
elif point == 'at-checkpoint':     # right after checkpoint `step` landed
    save_ckpt = CB.save_checkpoint
    def hook(folder, s, *a, **k):
        out = save_ckpt(folder, s, *a, **k)
        if s == step: die()
        return out
    CB.save_checkpoint = hook
elif point == 'before-result':     # the last checkpoint written, result.json not yet
    T.write_result = lambda *a, **k: die()
from depthbench_nb.cli import main
sys.exit(main(sys.argv[1:]))
"""
KILL_POINTS = ("row", "in-write", "before-rename", "at-checkpoint", "before-result", "time")


def kill_run(
    params: Path, folder: Path, env: dict, point: str, step: int, rng: random.Random
) -> subprocess.CompletedProcess:
    "Train the run of `params` in a child process that is killed with SIGKILL at `point` (a seeded time for 'time')."
    cmd = [sys.executable, "-c", KILLER, "train", "--run-config", str(params), "--no-progress"]
    if point != "time":
        res = subprocess.run(
            cmd, env=dict(env, DEPTHBENCH_TEST_KILL=f"{point}:{step}"), capture_output=True, text=True, timeout=300
        )
        assert res.returncode == -signal.SIGKILL, (point, step, res.returncode, res.stdout[-1500:], res.stderr[-1500:])
        return res
    proc = subprocess.Popen(
        cmd, env=dict(env, DEPTHBENCH_TEST_KILL="none:0"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 300  # a fresh run: wait for `step` rows, then a seeded delay
    while len(read_metrics(folder)) < step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.05))
    proc.kill()
    out = proc.communicate()[0]
    assert proc.returncode == -signal.SIGKILL, ("the run ended before its kill", out[-1500:])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, "")


def test_kill_minus_9_anywhere_resumes_to_the_uninterrupted_record(reference, tmp_path, monkeypatch, capsys):
    """Six seeded trials, one per kind of kill point first (a random moment, between checkpoints, in the middle of a
    checkpoint write, before its rename, right after it, before the result), then maybe a second kill at a later
    random point; the resumed metrics.jsonl, result and final weights equal the uninterrupted run's."""
    rng = random.Random(16)
    run, steps = reference["run"], reference["run"].train.max_steps
    ckpt_steps = list(range(3, steps + 1, 3))
    faults = lost = 0
    for trial, first in enumerate(KILL_POINTS):
        runs = tmp_path / f"trial{trial}"
        monkeypatch.setenv("DEPTHBENCH_RUNS", str(runs))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        folder = run_dir(run)
        params = runs / "run.json"
        runs.mkdir()
        params.write_text(json.dumps(run.to_dict()))
        kills, last = [], 0
        for point in [first] + (
            [rng.choice(KILL_POINTS[:5])] if first not in ("before-result",) and rng.random() < 0.6 else []
        ):
            if point == "time":
                step = rng.randint(1, 6)  # rows to wait for, then a random delay
            elif point == "row":
                if last > steps - 1:
                    break
                step = rng.randint(last, steps - 1)
            elif point == "before-result":
                step = steps
            else:
                later = [c for c in ckpt_steps if c > last]
                if not later:
                    break
                step = rng.choice(later)
            kill_run(params, folder, env, point, step, rng)  # asserts that the child died of its SIGKILL
            kills.append((point, step))
            faults += 1
            last = max(step, len(read_metrics(folder))) + 1
            if point == "before-result":
                break
        capsys.readouterr()
        result = train(run, progress=False)  # resume in this process, to the end
        said = capsys.readouterr().out
        got = read_metrics(folder)
        lost += lost_records(got, reference["rows"])
        assert deterministic(got) == deterministic(reference["rows"]), (trial, kills)
        keys = ("status", "steps", "tokens", "final_val_loss", "best_val_loss")
        assert {k: result[k] for k in keys} == {k: reference["result"][k] for k in keys}, (trial, kills)
        assert weights_digest(folder) == reference["digest"], (trial, kills)  # bit-identical final weights
        assert "took over the lock of pid" in said and "which no longer runs" in said, said  # the killed writer's lock
        if kills[-1][0] in ("in-write", "before-rename"):
            assert "temporary checkpoint folder" in said, said
        assert not list((folder / "checkpoints").glob(".tmp-step_*"))
        print(f"trial {trial}: kills {kills}: resumed to the same record")
    ledger(faults=faults, runs=len(KILL_POINTS), survived=len(KILL_POINTS), lost=lost)
    assert lost == 0


# --------------------------------------------------------------------------------- 1. one writer per run folder
def test_two_identical_train_commands_have_one_writer(tiny_data, runs_dir, tmp_path, capsys, monkeypatch):
    """Two writers of one run: the same `train` twice at once. One trains; the other is refused naming it (or, with
    --wait, waits and reports the finished run); metrics.jsonl holds every step once."""
    args = [
        "train",
        "--arch",
        "preln",
        "--L",
        "2",
        "--preset",
        "tiny",
        "--max-steps",
        "12",
        "--checkpoint-every",
        "4",
        "--data",
        str(tiny_data),
        "--json",
    ]  # 12 steps (the same race, less CPU)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(CLI + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]

    def folders():
        return [p for p in (runs_dir / "default").glob("preln-*") if p.is_dir()]

    deadline = time.time() + 120  # until one of them is training
    while time.time() < deadline and not (folders() and read_metrics(folders()[0])):
        assert any(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.02)
    folder = folders()[0]
    # meanwhile a third, in this process: refused, the holder named; with --wait it returns the holder's result
    busy = json_error(capsys, args[:-1])
    holder = int(busy["error"].split(" pid ")[1].split()[0])
    assert busy["kind"] == "busy" and holder in [p.pid for p in procs] and "--wait" in busy["error"], busy
    assert main(args + ["--wait"]) == 0
    waited = json.loads(capsys.readouterr().out)
    outs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    winner = [o for p, o in zip(procs, outs) if p.pid == holder][0]
    loser = [o for p, o in zip(procs, outs) if p.pid != holder][0]
    assert winner[0] == 0 and json.loads(winner[1])["status"] == "completed"
    assert waited == json.loads(winner[1])  # the finished record, not a second training
    if loser[0] == 2:  # refused while the winner trained ...
        err = json.loads(loser[1])
        assert err["kind"] == "busy" and f"pid {holder}" in err["error"], loser
    else:  # ... or came after it and found the run complete
        assert loser[0] == 0 and "already completed" in loser[2], loser
    steps = [r["step"] for r in read_metrics(folder)]
    assert steps == list(range(12)), steps  # every step exactly once
    ledger(faults=2, runs=1, survived=1, lost=len(steps) - len(set(steps)) + 12 - len(set(steps)))


def test_lock_where_the_filesystem_has_no_flock(tmp_path, monkeypatch):
    "Without flock (some NFS and Lustre mounts) the lock record is the lock: held, stale (dead pid) or on another host."
    import errno
    import fcntl
    import socket
    from depthbench_nb.config import RunBusy
    from depthbench_nb.runs import RunFolderLock, run_folder_holder

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    folder = tmp_path / "study" / "run"
    with RunFolderLock(folder, say=lambda m: None) as a:
        assert a.mode == "link" and run_folder_holder(folder)["pid"] == os.getpid()
        with pytest.raises(RunBusy, match=f"pid {os.getpid()}"):
            RunFolderLock(folder).acquire()
    assert not (folder / ".lock").exists()  # released: the record is gone
    dead = subprocess.Popen(["true"])
    dead.wait()
    (folder / ".lock").write_text(
        json.dumps(dict(pid=dead.pid, host=socket.gethostname(), released=False, since="then"))
    )
    assert run_folder_holder(folder) is None  # its process is gone: nobody writes the run
    with RunFolderLock(folder, say=lambda m: None) as b:
        assert b.took_over["pid"] == dead.pid  # stale: taken over
    (folder / ".lock").write_text(json.dumps(dict(pid=1, host="other-node", released=False, since="then")))
    assert run_folder_holder(folder)["host"] == "other-node"  # another host: cannot tell, so it counts as held
    with pytest.raises(RunBusy, match=r"other-node.*delete .*\.lock"):
        RunFolderLock(folder).acquire()


# ------------------------------------------------------------------------- 2. a damaged checkpoint is survived
@pytest.fixture
def stopped_run(reference, tiny_data, runs_dir):
    "The tiny run stopped after step 8: checkpoints 6 and 8 (the newest two), no result."
    run = reference["run"]
    assert train(run, progress=False, stop_after=8)["status"] == "stopped"
    assert [s for s, _ in list_checkpoints(run_dir(run))] == [6, 8]
    return run


@pytest.mark.parametrize("damage", ["model.safetensors", "train_state.pt", "meta.json", "SHA256SUMS"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_intact_one(reference, stopped_run, damage, capsys):
    folder = run_dir(stopped_run)
    newest = list_checkpoints(folder)[-1][1]
    data = (newest / damage).read_bytes()
    (newest / damage).write_bytes(data[: len(data) // 2])  # truncated
    stale = folder / "checkpoints" / ".tmp-step_00000009-4242"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    capsys.readouterr()
    res = train(stopped_run, progress=False)
    said = capsys.readouterr().out
    assert res["status"] == "completed"
    assert (
        f"step_00000008 is damaged ({damage}" in said
        and "resuming from the newest intact checkpoint instead, step_00000006" in said
    )
    assert "removed 1 temporary checkpoint folder" in said and not stale.exists()
    assert (folder / "checkpoints" / "corrupt-step_00000008").is_dir()  # kept for inspection, out of the way
    assert deterministic(read_metrics(folder)) == deterministic(
        reference["rows"]
    )  # the same record as without the fault
    assert weights_digest(folder) == reference["digest"]
    ledger(faults=2, runs=1, survived=1, lost=lost_records(read_metrics(folder), reference["rows"]))


def test_load_run_skips_a_damaged_checkpoint(stopped_run, capsys):
    folder = run_dir(stopped_run)
    w = list_checkpoints(folder)[-1][1] / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-16])
    model, _ = load_run(folder)  # reads, never moves anything
    assert "step_00000008 is damaged" in capsys.readouterr().err and [s for s, _ in list_checkpoints(folder)] == [6, 8]
    from depthbench_nb.costs import measured_costs  # diagnose's reading of the metrics

    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "loss": 3.')  # a writer killed mid-line
    assert measured_costs(folder)["steps"] == 8


def _to_format_1(ckpt: Path) -> None:
    "Rewrite a checkpoint as checkpoints were written before checksums: numpy/Python RNG pickled, no SHA256SUMS."
    import numpy as np

    st = torch.load(ckpt / "train_state.pt", weights_only=True)
    n, p = st["rng"]["numpy"], st["rng"]["python"]
    st["rng"]["numpy"] = ("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"])
    st["rng"]["python"] = (p["version"], tuple(p["state"].tolist()), p["gauss_next"])
    torch.save(st, ckpt / "train_state.pt")
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["format"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    (ckpt / "SHA256SUMS").unlink()


def test_checkpoints_written_before_checksums_still_resume(reference, stopped_run, capsys):
    folder = run_dir(stopped_run)
    for _, ckpt in list_checkpoints(folder):
        _to_format_1(ckpt)
    old = list_checkpoints(folder)[-1][1] / "train_state.pt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(old)  # numpy arrays in the pickle
    res = train(stopped_run, progress=False)
    assert res["status"] == "completed" and "resuming from checkpoint step 8" in capsys.readouterr().out
    assert deterministic(read_metrics(folder)) == deterministic(reference["rows"])
    assert weights_digest(folder) == reference["digest"]


# ------------------------------------------------------------------------------- 3. nothing read runs code
def test_resume_never_runs_a_planted_train_state(reference, stopped_run, tmp_path, capsys):
    "The newest checkpoint's train_state.pt replaced by a pickle calling os.system: it never runs; the run resumes."
    folder = run_dir(stopped_run)
    marker = tmp_path / "ran"
    (list_checkpoints(folder)[-1][1] / "train_state.pt").write_bytes(planted_pickle(marker, zip_format=True))
    try:
        res = train(stopped_run, progress=False)
    finally:
        assert not marker.exists(), "resuming ran code planted in the checkpoint"
    assert (
        res["status"] == "completed"
        and "step_00000008 is damaged (train_state.pt fails its checksum" in capsys.readouterr().out
    )
    assert deterministic(read_metrics(folder)) == deterministic(reference["rows"])
    ledger(faults=1, runs=1, survived=1, lost=lost_records(read_metrics(folder), reference["rows"]))


def test_resume_refuses_a_planted_train_state_with_forged_checksums(stopped_run, tmp_path, capsys):
    "The same, its checksum forged too (a careful attacker): refused with a clear error, nothing ran."
    from depthbench_nb.config import UnsafeFile
    from depthbench_nb.runs import write_checksums

    folder = run_dir(stopped_run)
    marker = tmp_path / "ran"
    newest = list_checkpoints(folder)[-1][1]
    (newest / "train_state.pt").write_bytes(planted_pickle(marker, zip_format=True))
    write_checksums(newest, ["model.safetensors", "meta.json", "train_state.pt"])
    with pytest.raises(
        UnsafeFile, match=r"step_00000008/train_state.pt would run code .*posix.system.*nothing was executed"
    ):
        train(stopped_run, progress=False)
    assert json_error(capsys, ["train", "--run-config", str(folder / "params.json")])["kind"] == "unsafe"
    assert not marker.exists()
    ledger(faults=1)


def test_resume_refuses_a_planted_format_1_train_state(stopped_run, tmp_path):
    folder = run_dir(stopped_run)
    for _, ckpt in list_checkpoints(folder):
        _to_format_1(ckpt)
    marker = tmp_path / "ran"
    (list_checkpoints(folder)[-1][1] / "train_state.pt").write_bytes(planted_pickle(marker, zip_format=True))
    from depthbench_nb.config import UnsafeFile

    with pytest.raises(UnsafeFile, match="posix.system"):
        train(stopped_run, progress=False)
    assert not marker.exists()
    ledger(faults=1)


def _dcp_with_planted_shard(folder: Path, marker: Path) -> None:
    "A torch DCP checkpoint whose index points one tensor at a planted pickle appended to its data file."
    import torch.distributed.checkpoint as dcp
    import warnings
    from depthbench_nb.interop import _DCPIndexUnpickler

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"embeddings.weight": torch.ones(4, 2)}}, checkpoint_id=str(folder))
    with open(folder / ".metadata", "rb") as f:
        meta = _DCPIndexUnpickler(f).load()
    ((index, info),) = [(k, v) for k, v in meta.storage_data.items() if k.fqn == "model.embeddings.weight"]
    blob = planted_pickle(marker, zip_format=True)
    data = folder / info.relative_path
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(blob)
    meta.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob))
    (folder / ".metadata").write_bytes(pickle.dumps(meta))


PLACES = [
    "resume",
    "import .pt",
    "import .bin",
    "import .safetensors",
    "import DCP index",
    "import DCP data file",
    "diagnose",
    "collect result.json",
    "collect params.json",
    "sweep state",
    "study file",
    "fit CSV",
    "data manifest",
]


@pytest.mark.parametrize("place", PLACES)
def test_a_planted_pickle_runs_nowhere(place, reference, tiny_data, runs_dir, tmp_path, capsys):
    """Each place the project reads from, fed a pickle whose __reduce__ calls os.system: nothing runs, the error is
    clear."""
    marker = tmp_path / "ran"
    evil, evil_zip = planted_pickle(marker), planted_pickle(marker, zip_format=True)
    study = tmp_path / "study.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="faults",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], max_steps=1)],
            )
        )
    )

    def trained():
        r = tiny(tiny_data, steps=2, checkpoint_every=1)
        train(r, progress=False)
        capsys.readouterr()
        return run_dir(r)

    if place == "resume":
        from depthbench_nb.runs import write_checksums

        folder = trained()
        ckpt = list_checkpoints(folder)[-1][1]
        (folder / "result.json").unlink()
        (ckpt / "train_state.pt").write_bytes(evil_zip)
        write_checksums(ckpt, ["model.safetensors", "meta.json", "train_state.pt"])
        argv, kind = ["train", "--run-config", str(folder / "params.json")], "unsafe"
    elif place.startswith("import"):
        src = tmp_path / "ckpt"
        src.mkdir()
        if place == "import DCP index":
            (src / ".metadata").write_bytes(evil)
            kind = "unsafe"
        elif place == "import DCP data file":
            _dcp_with_planted_shard(src, marker)
            kind = "unsafe"
        else:
            ext = place.split(".")[-1]
            (src / f"model.{ext}").write_bytes(evil if ext != "bin" else evil_zip)
            kind = "corrupt" if ext == "safetensors" else "unsafe"
        argv = ["import-checkpoint", str(src), "--arch", "preln"]
    elif place == "diagnose":
        from depthbench_nb.runs import write_checksums

        folder = trained()
        for c in list_checkpoints(folder):
            (c[1] / "model.safetensors").write_bytes(evil)
            write_checksums(c[1], ["model.safetensors", "meta.json", "train_state.pt"])
        argv, kind = ["diagnose", str(folder), "--metrics", "angular"], "corrupt"
    elif place == "collect result.json":
        from depthbench_nb.sweep import expand_study, load_study

        r = expand_study(load_study(study))[0].run
        folder = run_dir(r)
        folder.mkdir(parents=True)
        (folder / "params.json").write_text(json.dumps(dict(r.to_dict(), run_id=r.run_id)))
        (folder / "result.json").write_bytes(evil)
        argv, kind = ["collect", str(study)], "corrupt"
    elif place == "collect params.json":  # a run folder outside the plan: listed as stale, never read
        folder = runs_dir / "faults" / "someone-elses-run"
        folder.mkdir(parents=True)
        (folder / "params.json").write_bytes(evil)
        assert main(["collect", str(study), "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["rows"] == 1 and [r["run_id"] for r in out["stale"]] == ["someone-elses-run"], out
        assert not marker.exists()
        return ledger(faults=1)
    elif place == "sweep state":
        from depthbench_nb.sweep import _attempts_path, expand_study, load_study

        p = _attempts_path("faults", expand_study(load_study(study))[0].run_id)
        p.parent.mkdir(parents=True)
        p.write_bytes(evil)
        argv, kind = ["sweep", "status", str(study)], "corrupt"
    elif place == "study file":
        study.write_text('name: !!python/object/apply:os.system ["touch %s"]\ngroups: []\n' % marker)
        argv, kind = ["sweep", "plan", str(study)], "config"
    elif place == "fit CSV":
        csv = tmp_path / "runs.csv"
        csv.write_bytes(evil)
        argv, kind = ["fit", "--csv", str(csv), "--restarts", "2"], "corrupt"
    elif place == "data manifest":
        data = tmp_path / "data"
        shutil.copytree(tiny_data, data)
        (data / "manifest.json").write_bytes(evil)
        argv, kind = (
            ["train", "--arch", "preln", "--L", "2", "--preset", "tiny", "--max-steps", "1", "--data", str(data)],
            "config",
        )
    err = json_error(capsys, argv)
    assert err["kind"] == kind, err
    assert not marker.exists(), f"{place}: the planted code ran"
    ledger(faults=1)


# ------------------------------------------------------------------- 4. a sweep that crashed says so
def test_sweep_on_an_unwritable_runs_folder_fails_before_any_run(tiny_data, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # root ignores chmod: a file in the way
    monkeypatch.setenv("DEPTHBENCH_RUNS", str(blocker / "runs"))
    study = tmp_path / "s.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="ro",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], lrs=[1e-3, 2e-3], max_steps=1)],
            )
        )
    )
    err = json_error(capsys, ["sweep", "run", str(study), "--executor", "python"])
    assert err["kind"] == "config" and "not writable" in err["error"] and "none of the 2 runs" in err["error"]


def test_sweep_with_a_crashed_worker_exits_non_zero_and_lists_the_run(tiny_data, runs_dir, tmp_path, capsys):
    "One run's lock path is blocked (the driver's thread for it crashes); the other run completes; exit 1, listed."
    from depthbench_nb.sweep import expand_study, load_study

    study = tmp_path / "s.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="crash",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], lrs=[1e-3, 2e-3], max_steps=1)],
            )
        )
    )
    bad, good = expand_study(load_study(study))
    (runs_dir / "crash" / ".sweep" / "locks" / f"{bad.run_id}.lock").mkdir(
        parents=True
    )  # a folder where a file must go
    rc = main(["sweep", "run", str(study), "--executor", "python", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert [r["run_id"] for r in out["not_done"]] == [bad.run_id] and "IsADirectoryError" in out["not_done"][0]["error"]
    assert read_result(run_dir(good.run))["status"] == "completed"
    assert {o["run_id"]: o["action"] for o in out["outcomes"]} == {bad.run_id: "error", good.run_id: "ran"}
    ledger(faults=1, runs=1, survived=1)  # the other run of the sweep went on


# ------------------------------------------------------------------ 5. clear errors, no empty run folder
def _import_inputs(tmp_path: Path, reference) -> dict:
    rnd = random.Random(16).randbytes
    torch.save({"w": torch.ones(64, 64)}, tmp_path / "whole.pt")
    whole = (tmp_path / "whole.pt").read_bytes()
    from safetensors.torch import save_file

    save_file({"w": torch.ones(64, 64)}, str(tmp_path / "whole.safetensors"))
    st = (tmp_path / "whole.safetensors").read_bytes()
    return {
        "random.bin": rnd(4096),
        "random.pt": rnd(4096),
        "random.safetensors": rnd(4096),
        "empty.pt": b"",
        "truncated.pt": whole[: len(whole) // 2],
        "truncated.safetensors": st[: len(st) // 2],
    }


BAD_INPUTS = [
    "fit: text in a number column",
    "fit: binary CSV",
    "fit: empty CSV",
    "study: random bytes",
    "import: random.bin",
    "import: random.pt",
    "import: random.safetensors",
    "import: empty.pt",
    "import: truncated.pt",
    "import: truncated.safetensors",
]


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_clear_error(case, reference, tmp_path, capsys, runs_dir):
    if case.startswith("fit"):
        csv = tmp_path / "runs.csv"
        csv.write_bytes(
            {
                "fit: text in a number column": b"N,D,loss\n1e8,2e9,3.1\n2e8,many,3.0\n",
                "fit: binary CSV": random.Random(1).randbytes(2048),
                "fit: empty CSV": b"",
            }[case]
        )
        argv, kind, says = ["fit", "--csv", str(csv), "--law", "chinchilla"], ("config", "corrupt"), "runs.csv"
        if "number" in case:
            says = "column 'D' must hold numbers; row 1 holds 'many'"
    elif case.startswith("study"):
        (tmp_path / "s.yaml").write_bytes(random.Random(2).randbytes(2048))
        argv, kind, says = ["sweep", "plan", str(tmp_path / "s.yaml")], ("corrupt",), "s.yaml"
    else:
        name = case.split(": ")[1]
        (tmp_path / name).write_bytes(_import_inputs(tmp_path, reference)[name])
        argv, kind, says = ["import-checkpoint", str(tmp_path / name), "--arch", "preln"], ("corrupt",), name
    err = json_error(capsys, argv)
    assert err["kind"] in kind and says in err["error"], err
    assert main(argv) == 2  # without --json: one line on stderr
    out, text = capsys.readouterr()
    assert text.startswith(f"depthbench-nb {argv[0]}: error: ") and len(text.strip().splitlines()) == 1 and not out
    assert not any(p.is_dir() for p in runs_dir.glob("*/*")), "an error left a run folder behind"


def test_an_error_after_the_run_folder_was_made_leaves_none(tiny_data, runs_dir, capsys):
    "Train with a tracker that is not installed: refused after the folder was made, and the folder is gone again."
    err = json_error(
        capsys,
        [
            "train",
            "--arch",
            "preln",
            "--L",
            "2",
            "--d-model",
            "32",
            "--preset",
            "tiny",
            "--max-steps",
            "1",
            "--data",
            str(tiny_data),
            "--trackers",
            "mlflow-x",
        ],
    )
    assert err["kind"] == "config" and "unknown tracker" in err["error"]
    assert not runs_dir.exists() or not any(runs_dir.rglob("*")), list(runs_dir.rglob("*"))


def test_usage_errors_are_json_too(capsys):
    err = json_error(capsys, ["train", "--L", "two"])
    assert (
        err["kind"] == "usage"
        and "invalid int value: 'two'" in err["error"]
        and "usage: depthbench-nb train" in err["error"]
    )


def study_entries_in(study, runs):
    """The entries (run ids) of a study file as a driver with DEPTHBENCH_RUNS=runs expands them; the session's folder
    after."""
    from depthbench_nb.sweep import expand_study, load_study

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPTHBENCH_RUNS", str(runs))
        return expand_study(load_study(study))


# ------------------------------------------------------------------- a sweep whose driver is killed twice
def test_a_sweep_whose_driver_is_killed_twice_finishes_every_run_once(tiny_data, tmp_path):
    """Kill 1: the driver and its child, mid-run. Kill 2: the driver alone (its child trains on, orphaned). The next
    driver leaves the orphan's run alone (busy while it trains: one writer) and the last one finds every run complete
    (exit 0). Each run's metrics equal its uninterrupted record."""
    runs = tmp_path / "runs"
    env = dict(os.environ, DEPTHBENCH_RUNS=str(runs), OMP_NUM_THREADS="1")
    study = tmp_path / "k.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="killed",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], lrs=[1e-3, 2e-3], max_steps=8)],
            )
        )
    )
    entries = study_entries_in(study, runs)
    folders = [runs / "killed" / e.run_id for e in entries]
    driver = CLI + ["sweep", "run", str(study), "--executor", "python", "--no-progress"]

    def start():
        return subprocess.Popen(
            driver, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def wait_rows(folder, n, proc):
        deadline = time.time() + 300
        while len(read_metrics(folder)) < n and time.time() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert len(read_metrics(folder)) >= n, "the run never got going"

    d1 = start()
    wait_rows(folders[0], 2, d1)
    os.killpg(d1.pid, signal.SIGKILL)
    d1.wait()  # kill 1: the driver and its child
    d2 = start()
    wait_rows(folders[1], 2, d2)
    orphan = lock_holder(folders[1])
    os.kill(d2.pid, signal.SIGKILL)
    d2.wait()  # kill 2: the driver only; its child trains on
    d3 = subprocess.run(driver + ["--json"], env=env, capture_output=True, text=True, timeout=600)
    third = {o["run_id"]: o["action"] for o in json.loads(d3.stdout)["outcomes"]}
    assert third[entries[1].run_id] in ("busy", "skipped"), third  # never a second writer of the orphan's run
    deadline = time.time() + 300
    while lock_holder(folders[1]) is not None and time.time() < deadline:
        time.sleep(0.05)
    d4 = subprocess.run(driver + ["--json"], env=env, capture_output=True, text=True, timeout=600)
    final = json.loads(d4.stdout)
    assert d4.returncode == 0 and final["status"]["completed"] == 2 and final["not_done"] == [], final
    lost = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPTHBENCH_RUNS", str(tmp_path / "reference"))
        for e, folder in zip(entries, folders):
            train(e.run, progress=False)
            want = read_metrics(run_dir(e.run))
            lost += lost_records(read_metrics(folder), want)
            assert deterministic(read_metrics(folder)) == deterministic(want), e.run_id
    assert orphan > 0 and lost == 0
    ledger(faults=2, runs=2, survived=2, lost=lost)


def test_a_killed_holder_not_yet_reaped_holds_nothing():
    "A lock holder killed but not yet reaped (a zombie: its parent died, init reaps it later) is dead, not busy."
    import socket
    from depthbench_nb.config import _process_start, _holder_alive

    child = subprocess.Popen(["sleep", "60"])
    record = dict(host=socket.gethostname(), pid=child.pid, start=_process_start(child.pid))
    assert _holder_alive(record) is True
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.time() < deadline:
        time.sleep(0.01)
    assert _holder_alive(record) is False  # still in the process table (not reaped yet), holding nothing
    child.wait()


# =================================================================================================================
# Preemption, edited studies and hostile files: signals checkpoint, an operational option keeps the run, a study is
# its current plan, every unpickler has an exact allow-list, resources and disks are checked, messages stay short.
# =================================================================================================================
# A hook every Python process of a test's process tree loads (sitecustomize on PYTHONPATH): the training process
# (the CLI, an accelerate rank, a papermill kernel) pauses after the row of step DEPTHBENCH_TEST_PAUSE so that the test
# can send a real signal at a known step; DEPTHBENCH_TEST_SLOW_SAVE holds the next checkpoint write for 2 s (a second
# signal then arrives while it is saved); DEPTHBENCH_TEST_MEMORY_LIMIT caps the address space at the first training
# step.
HOOK = r"""
import os
if os.environ.get('DEPTHBENCH_TEST_PAUSE') or os.environ.get('DEPTHBENCH_TEST_MEMORY_LIMIT'):
    import time
    from pathlib import Path
    import depthbench_nb.runs as _R
    _mark = Path(os.environ.get('DEPTHBENCH_TEST_MARK', '.'))
    if os.environ.get('DEPTHBENCH_TEST_PAUSE'):
        _pause, _append = int(os.environ['DEPTHBENCH_TEST_PAUSE']), _R.MetricsLog.append
        def _paused_append(self, row):
            _append(self, row)
            if row.get('step') == _pause and not (_mark / 'paused').exists():
                (_mark / 'paused').write_text(str(os.getpid()))
                time.sleep(float(os.environ.get('DEPTHBENCH_TEST_PAUSE_S', '3')))
        _R.MetricsLog.append = _paused_append
    if os.environ.get('DEPTHBENCH_TEST_SLOW_SAVE'):
        _sums = _R.write_checksums
        def _slow_sums(folder, names):
            if (_mark / 'paused').exists() and not (_mark / 'saving').exists():
                (_mark / 'saving').write_text('1'); time.sleep(2)
            return _sums(folder, names)
        _R.write_checksums = _slow_sums
    if os.environ.get('DEPTHBENCH_TEST_MEMORY_LIMIT'):
        import resource
        import depthbench_nb.trainer as _T
        _fb = _T._forward_backward
        def _capped(state):
            if not getattr(_capped, 'done', False):
                _capped.done = True
                mapped = int(Path('/proc/self/statm').read_text().split()[0]) * os.sysconf('SC_PAGE_SIZE')
                limit = mapped + int(os.environ['DEPTHBENCH_TEST_MEMORY_LIMIT'])
                resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
            return _fb(state)
        _T._forward_backward = _capped
"""


def hooked_env(tmp_path: Path, **env) -> dict:
    "The environment of a child process tree with the test hook loaded (and a private marker folder)."
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(HOOK)
    mark = tmp_path / "mark"
    mark.mkdir(exist_ok=True)
    path = os.pathsep.join([str(hook)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, DEPTHBENCH_TEST_MARK=str(mark), **env)


def wait_file(path: Path, proc, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, ("the process ended first", proc.communicate())
        assert time.time() < deadline, f"timed out waiting for {path}"
        time.sleep(0.02)


def alive(pid: int) -> bool:
    "A process that runs (a zombie, killed and waiting for its parent to reap it, runs nothing)."
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def processes_with(token: str) -> list[int]:
    "Live processes whose environment holds `token` (the whole tree of a command started with it)."
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            env = (p / "environ").read_bytes()
        except OSError:
            continue
        if token.encode() in env and alive(int(p.name)):
            out.append(int(p.name))
    return out


# ------------------------------------------------------------------- 1. a signal: checkpoint at the step, exact resume
SIGNAL_CASES = [
    ("SIGTERM", False),
    ("SIGINT", True),
    ("SIGUSR1", False),
]  # SIGINT: pressed twice, the second while saving


@pytest.mark.parametrize("sig,twice", SIGNAL_CASES, ids=[s for s, _ in SIGNAL_CASES])
def test_a_signal_checkpoints_at_its_step_and_the_resume_is_exact(sig, twice, reference, runs_dir, tmp_path, capsys):
    """`depthbench-nb train`, sent SIGTERM (preemption, scancel), SIGINT (Ctrl-C) or SIGUSR1 (Slurm's warning) after
    step 4: it finishes the step, writes checkpoint step 5 (not one of its every-3 checkpoints), records result.json as
    interrupted with the signal and the step, prints one JSON line and exits 3. A second Ctrl-C while the checkpoint
    is written changes nothing. Training again resumes there and ends with the uninterrupted record."""
    from depthbench_nb.runs import _verify_checkpoint

    run = reference["run"]
    folder = run_dir(run)
    params = tmp_path / "run.json"
    params.write_text(json.dumps(run.to_dict()))
    env = hooked_env(tmp_path, DEPTHBENCH_TEST_PAUSE="4", **({"DEPTHBENCH_TEST_SLOW_SAVE": "1"} if twice else {}))
    proc = subprocess.Popen(
        CLI + ["train", "--run-config", str(params), "--no-progress", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_file(tmp_path / "mark" / "paused", proc)
    os.kill(proc.pid, getattr(signal, sig))  # a real signal, from outside, as Slurm or a shell sends it
    if twice:
        wait_file(tmp_path / "mark" / "saving", proc)
        os.kill(proc.pid, getattr(signal, sig))  # again, while the checkpoint is being written
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, (proc.returncode, out[-2000:], err[-3000:])
    assert len(out.strip().splitlines()) == 1 and "Traceback" not in err, (out, err[-3000:])
    said = json.loads(out)
    assert said["status"] == "interrupted" and said["signal"] == sig and said["interrupted_at_step"] == 5, said
    assert f"interrupted by {sig} at step 5 of 12: checkpoint step_00000005 written" in err, err[-2000:]
    if twice:
        assert f"{sig} again: already stopping" in err
    assert read_result(folder)["status"] == "interrupted"
    ckpt = dict(list_checkpoints(folder))[5]
    assert _verify_checkpoint(ckpt) is None and not list((folder / "checkpoints").glob(".tmp-step_*"))
    assert [r["step"] for r in read_metrics(folder)] == list(range(5))
    capsys.readouterr()
    result = train(run, progress=False)  # the same run again: it resumes at the signal's step
    assert "resuming from checkpoint step 5" in capsys.readouterr().out
    lost = lost_records(read_metrics(folder), reference["rows"])
    assert deterministic(read_metrics(folder)) == deterministic(reference["rows"])  # every step once, the same rows
    keys = ("status", "steps", "tokens", "final_val_loss", "best_val_loss")
    assert {k: result[k] for k in keys} == {k: reference["result"][k] for k in keys}
    assert weights_digest(folder) == reference["digest"] and lost == 0
    ledger(faults=1 + twice, runs=1, survived=1, lost=lost)


def test_a_signal_stops_every_rank_of_a_two_process_run(reference, runs_dir, tmp_path):
    """`train` on 2 processes (accelerate launch, DDP over gloo) sent SIGTERM: the launcher's parent passes it on to the
    ranks, every rank stops after the same step, one checkpoint is written there, the run is interrupted (exit 3); the
    resume on 2 processes completes every step once with the losses of the uninterrupted single-process run."""
    run = reference["run"].replace(num_processes=2)
    folder = run_dir(run)
    params = tmp_path / "run.json"
    params.write_text(json.dumps(run.to_dict()))
    env = hooked_env(tmp_path, DEPTHBENCH_TEST_PAUSE="4")
    proc = subprocess.Popen(
        CLI + ["train", "--run-config", str(params), "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    wait_file(tmp_path / "mark" / "paused", proc, timeout=400)
    os.kill(proc.pid, signal.SIGTERM)
    out = proc.communicate(timeout=400)[0]
    assert proc.returncode == 3, out[-4000:]
    assert "interrupted by SIGTERM at step 5 of 12" in out and "passed on to 2 process(es)" in out, out[-4000:]
    res = read_result(folder)
    assert (
        res["status"] == "interrupted" and res["world_size"] == 2 and [s for s, _ in list_checkpoints(folder)] == [3, 5]
    )
    assert processes_with(str(tmp_path / "mark")) == []  # no rank outlived the run
    env.pop("DEPTHBENCH_TEST_PAUSE")
    again = subprocess.run(
        CLI + ["train", "--run-config", str(params), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert again.returncode == 0 and "resuming from checkpoint step 5" in again.stdout, (
        again.stdout[-3000:] + again.stderr[-2000:]
    )
    rows, want = read_metrics(folder), reference["rows"]
    assert [r["step"] for r in rows] == list(range(12))
    lost = sum(abs(a["loss"] - b["loss"]) > 1e-5 * abs(b["loss"]) for a, b in zip(rows, want))
    assert lost == 0 and read_result(folder)["status"] == "completed"
    ledger(faults=1, runs=1, survived=1, lost=lost)


# ----------------------------------------------------- 2. the sweep driver passes a signal on and leaves no orphan
def test_a_signalled_sweep_driver_stops_its_children_and_records_them(tiny_data, tmp_path):
    """`sweep run` (papermill executor: driver -> papermill -> kernel) sent SIGTERM while its first run trains: the
    signal reaches the kernel, which checkpoints; the driver waits, records the run as interrupted, starts nothing
    else and exits 3; no process of its tree is left. The next driver resumes the run to its uninterrupted record."""
    runs = tmp_path / "runs"
    study = tmp_path / "sig.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="sig",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], lrs=[1e-3, 2e-3], max_steps=10)],
            )
        )
    )
    entries = study_entries_in(study, runs)
    tree = f"depthbench-test-tree-{os.getpid()}-{time.time_ns()}"
    env = hooked_env(tmp_path, DEPTHBENCH_RUNS=str(runs), DEPTHBENCH_TEST_PAUSE="3", DEPTHBENCH_TEST_TREE=tree)
    driver = subprocess.Popen(
        CLI + ["sweep", "run", str(study), "--executor", "papermill", "--no-progress", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    wait_file(tmp_path / "mark" / "paused", driver, timeout=400)
    os.kill(driver.pid, signal.SIGTERM)  # the driver only: the children are reached through it
    out, err = driver.communicate(timeout=400)
    assert driver.returncode == 3, (driver.returncode, out[-2000:], err[-3000:])
    assert processes_with(tree) == [], "a child of the signalled driver outlived it"
    report = json.loads(out)
    assert report["interrupted"] == "SIGTERM" and "passed on to 1 process(es)" in err, (report, err[-2000:])
    first = read_result(runs / "sig" / entries[0].run_id)
    assert first["status"] == "interrupted" and first["interrupted_at_step"] == 4 and first["signal"] == "SIGTERM"
    assert not (runs / "sig" / entries[1].run_id).exists()  # nothing new was started after the signal
    assert {r["run_id"]: r["status"] for r in report["not_done"]} == {
        entries[0].run_id: "interrupted",
        entries[1].run_id: "pending",
    }
    history = json.loads((runs / "sig" / ".sweep" / "attempts" / f"{entries[0].run_id}.json").read_text())
    assert history["attempts"] == 0 and history["history"][-1]["status"] == "interrupted"  # a signal is not a failure
    env = dict(env)
    env.pop("DEPTHBENCH_TEST_PAUSE")
    again = subprocess.run(
        CLI + ["sweep", "run", str(study), "--executor", "python", "--no-progress", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0 and json.loads(again.stdout)["status"]["completed"] == 2, again.stderr[-3000:]
    log = (runs / "sig" / ".sweep" / "logs" / f"{entries[0].run_id}.log").read_text()
    assert "resuming from checkpoint step 4" in log
    lost = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPTHBENCH_RUNS", str(tmp_path / "reference"))
        train(entries[0].run, progress=False)
        want = read_metrics(run_dir(entries[0].run))
    got = read_metrics(runs / "sig" / entries[0].run_id)
    lost = lost_records(got, want)
    assert deterministic(got) == deterministic(want) and lost == 0
    ledger(faults=1, runs=2, survived=2, lost=lost)


# --------------------------------------------------------------- 3. operational options are not the run's identity
LEGACY = Path(__file__).parent / "data" / "records_before_identity"


def test_records_made_before_keep_their_ids_and_a_rerun_finds_them(tiny_data, runs_dir, capsys):
    """Run records written before the run id left out the operational options keep their ids: the default-cadence one
    by the same id, the one trained with checkpoint_every=3 by being moved (once, said) to its id on the next run."""
    from depthbench_nb.runs import read_params

    (default,), (cadence,) = [list((LEGACY / k).iterdir()) for k in ("default-cadence", "checkpoint-every-3")]
    assert read_params(default).run_id == default.name == json.loads((default / "params.json").read_text())["run_id"]
    assert read_params(cadence).legacy_run_id == cadence.name  # what its id was
    for src, kw in ((default, {}), (cadence, dict(checkpoint_every=3))):
        root = runs_dir / src.parent.name
        shutil.copytree(src, root / "legacy" / src.name)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("DEPTHBENCH_RUNS", str(root))
            run = make_run_config(
                "preln", L=2, d_model=32, preset="tiny", max_steps=6, study="legacy", seed=7, verbose=False, **kw
            )
            run = run.replace(train=run.train.replace(seq_len=32, global_batch=4, eval_batches=1, eval_every=3))
            assert run.run_id == default.name  # one id for both cadences
            capsys.readouterr()
            res = train(run, progress=False)
            said = capsys.readouterr().out
            assert res["status"] == "completed" and "already completed; not retraining" in said, said
            assert (root / "legacy" / run.run_id / "result.json").exists() and len(
                list((root / "legacy").iterdir())
            ) == 1
            if src is cadence:
                assert f"run {cadence.name} was recorded under its old id" in said
    ledger(faults=1, runs=2, survived=2)


def test_another_checkpoint_cadence_resumes_the_same_run(reference, runs_dir, capsys):
    """A run stopped at step 6 (checkpoints every 3), trained again with --checkpoint-every 4 and trackers changed:
    the same run id and folder, what changed is said, the resume starts at step 6 and ends with the uninterrupted
    record (which was trained with a cadence of 3)."""
    run = reference["run"]
    assert train(run, progress=False, stop_after=6)["status"] == "stopped"
    other = run.replace(train=run.train.replace(checkpoint_every=4, keep_checkpoints=3, layer_stats_every=5))
    assert other.run_id == run.run_id and run_dir(other) == run_dir(run)
    capsys.readouterr()
    res = train(other, progress=False)
    said = capsys.readouterr().out
    assert "operational options changed since its last start: train.checkpoint_every: 3 -> 4" in said, said
    assert "resuming from checkpoint step 6" in said
    folder = run_dir(run)
    lost = lost_records(read_metrics(folder), reference["rows"])
    assert deterministic(read_metrics(folder)) == deterministic(reference["rows"]) and lost == 0
    assert (
        res["final_val_loss"] == reference["result"]["final_val_loss"] and weights_digest(folder) == reference["digest"]
    )
    assert (folder / "layer_stats.jsonl").exists()  # the new options took effect
    ledger(faults=1, runs=1, survived=1, lost=lost)


# ------------------------------------------------------------------------------ 4. a study is its current plan
def test_an_edited_study_never_mixes_stale_runs(tiny_data, runs_dir, tmp_path, capsys):
    """A 2-run study (LRs 1e-3, 2e-3; 2 steps) trained, then edited (LR 2e-3 -> 4e-3, 3 steps) and trained again:
    status counts the 2 planned runs and lists the 2 stale ones; collect returns the 2 planned rows (the same counts);
    the LR optimum and the report's table use only them."""
    from depthbench_nb.report_common import study_table
    from depthbench_nb.sweep import collect, expand_study, load_study, lr_optima

    study = tmp_path / "edit.yaml"

    def write(lrs, steps):
        study.write_text(
            yaml.safe_dump(
                dict(
                    name="edit",
                    preset="tiny",
                    data=str(tiny_data),
                    groups=[dict(name="g", archs=["preln"], depths=[2], lrs=lrs, max_steps=steps)],
                )
            )
        )
        return expand_study(load_study(study))

    old = write([1e-3, 2e-3], 2)
    for e in old:
        train(e.run, progress=False)
    collect(load_study(study))
    new = write([1e-3, 4e-3], 3)
    for e in new:
        train(e.run, progress=False)
    capsys.readouterr()
    assert main(["sweep", "status", str(study), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["total"] == 2 and st["counts"]["completed"] == 2
    assert sorted(r["run_id"] for r in st["stale"]) == sorted(e.run_id for e in old)
    assert main(["collect", str(study), "--json"]) == 0
    col = json.loads(capsys.readouterr().out)
    assert col["rows"] == 2 and col["status"] == {"completed": 2} and len(col["stale"]) == 2
    df = collect(load_study(study))
    assert sorted(df.run_id) == sorted(e.run_id for e in new) and set(df["train.max_steps"]) == {3}
    opt = lr_optima(df)
    assert opt.n_lrs.tolist() == [2] and opt.best_lr.iloc[0] in (1e-3, 4e-3)
    table = study_table("edit")  # what the report notebooks read
    assert sorted(table.run_id) == sorted(e.run_id for e in new)
    assert "left out 2 stale run(s)" in capsys.readouterr().out
    assert main(["sweep", "status", str(study)]) == 0 and "2 stale run folder(s)" in capsys.readouterr().out
    ledger(faults=1, runs=4, survived=4)


# ------------------------------------------------------ 5. an exact allow-list for every unpickler (exploit corpus)
def _su(text: str) -> bytes:
    b = text.encode()
    return b"\x8c" + bytes([len(b)]) + b


def exploit_corpus(marker: Path) -> dict:
    "Pickles that would run `touch MARKER` (or other code) if unpickled without an exact allow-list."
    cmd = f"touch {marker}"

    class Reduce:
        def __reduce__(self):
            return (os.system, (cmd,))

    class Nested:  # a harmless-looking container whose member reduces to os.system
        def __reduce__(self):
            return (collections_od(), ([("w", Reduce())],))

    corpus = {f"os.system, protocol {p}": pickle.dumps(Reduce(), protocol=p) for p in range(6)}
    corpus["nested __reduce__ in an OrderedDict"] = pickle.dumps({"model": Nested()}, protocol=2)

    def call(module, name, arg):
        return b"\x80\x04" + _su(module) + _su(name) + b"\x93" + _su(arg) + b"\x85R."

    corpus["dotted name through an allowed module (DCP)"] = call(
        "torch.distributed.checkpoint.filesystem", "os.system", cmd
    )
    corpus["dotted name through an allowed module (torch._utils)"] = call("torch._utils", "os.system", cmd)
    corpus["dotted attribute chain of an allowed class"] = (
        b"\x80\x04" + _su("collections") + _su("OrderedDict.__init__.__globals__") + b"\x93."
    )
    corpus["builtins.eval"] = call("builtins", "eval", f"__import__('os').system({cmd!r})")
    corpus["builtins.exec"] = call("builtins", "exec", f"import os; os.system({cmd!r})")
    corpus["builtins.getattr"] = (
        b"\x80\x04"
        + _su("builtins")
        + _su("getattr")
        + b"\x93"
        + _su("builtins")
        + _su("__import__")
        + b"\x93"
        + _su("os")
        + b"\x85R"
        + _su("system")
        + b"\x86R"
        + _su(cmd)
        + b"\x85R."
    )
    corpus["builtins.__import__"] = call("builtins", "__import__", "os")
    corpus["names from the memo (STACK_GLOBAL)"] = (
        b"\x80\x04" + _su("posix") + b"\x94" + _su("system") + b"\x94" + b"00h\x00h\x01\x93" + _su(cmd) + b"\x85R."
    )
    corpus["INST opcode (protocol 0)"] = f"(S{cmd!r}\nios\nsystem\n.".encode()

    class RebuildAbuse:  # torch's _rebuild_from_type_v2 calls its first argument: here eval
        def __reduce__(self):
            return (torch._tensor._rebuild_from_type_v2, (eval, object, (f"__import__('os').system({cmd!r})",), {}))

    corpus["torch._tensor._rebuild_from_type_v2 with eval"] = pickle.dumps(RebuildAbuse(), protocol=2)
    corpus["torch._utils._rebuild_parameter_with_state"] = call("torch._utils", "_rebuild_parameter_with_state", cmd)
    return corpus


def collections_od():
    import collections

    return collections.OrderedDict


def _torch_zip(payload: bytes) -> bytes:
    "A torch zip file (torch.save's layout) whose data.pkl is `payload`."
    import zipfile

    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    src, out = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name in src.namelist():
            z.writestr(name, payload if name.endswith("data.pkl") else src.read(name))
    return out.getvalue()


UNPICKLING_PLACES = [
    "import .pt",
    "import .bin (torch zip)",
    "import DCP index",
    "import DCP data file",
    "resume train_state.pt",
    "resume a format-1 checkpoint",
]


def test_every_unpickler_refuses_the_exploit_corpus(reference, tiny_data, runs_dir, tmp_path, capsys):
    """Each pickle of the corpus (dotted names through allowed modules, builtins eval/exec/getattr/__import__, nested
    __reduce__, torch _rebuild_* abuse, INST, names from the memo, protocols 0-5) at every place the project unpickles:
    nothing runs and the error kind is `unsafe`. The established scanner picklescan reads every one of them as not
    innocuous and finds the same globals as our own reader."""
    import picklescan.scanner as scanner
    from depthbench_nb.config import UnsafeFile
    from depthbench_nb.runs import pickle_globals, write_checksums

    marker = tmp_path / "ran"
    corpus = exploit_corpus(marker)
    faults = 0
    for label, payload in corpus.items():  # the cross-check with an established scanner
        scan = scanner.scan_pickle_bytes(io.BytesIO(payload), label)
        seen = {(g.module, g.name) for g in scan.globals}
        assert any(g.safety.value != "innocuous" for g in scan.globals), (label, scan.globals)
        assert seen == set(pickle_globals(io.BytesIO(payload))), (label, seen)
    stopped = tiny(tiny_data, steps=6, checkpoint_every=3, study="exploit")
    assert train(stopped, progress=False, stop_after=3)["status"] == "stopped"
    folder = run_dir(stopped)
    ckpt = list_checkpoints(folder)[-1][1]
    for place in UNPICKLING_PLACES:
        for label, payload in corpus.items():
            src = tmp_path / "src" / f"{abs(hash((place, label)))}"
            src.mkdir(parents=True)
            if place == "import .pt":
                (src / "model.pt").write_bytes(payload)
            elif place == "import .bin (torch zip)":
                (src / "model.bin").write_bytes(_torch_zip(payload))
            elif place == "import DCP index":
                (src / ".metadata").write_bytes(payload)
            elif place == "import DCP data file":
                _dcp_with_planted_shard(src, marker)
                data = next(src.glob("*.distcp"))
                blob = _torch_zip(payload)
                meta = pickle.loads((src / ".metadata").read_bytes())
                ((index, info),) = [(k, v) for k, v in meta.storage_data.items() if k.fqn == "model.embeddings.weight"]
                with open(data, "ab") as f:
                    offset = f.tell()
                    f.write(blob)
                meta.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(blob))
                (src / ".metadata").write_bytes(pickle.dumps(meta))
            if place.startswith("import"):
                err = json_error(capsys, ["import-checkpoint", str(src), "--arch", "preln"])
            else:
                saved = (ckpt / "train_state.pt").read_bytes()
                (ckpt / "train_state.pt").write_bytes(_torch_zip(payload))
                meta = json.loads((ckpt / "meta.json").read_text())
                if place == "resume a format-1 checkpoint":  # numpy admitted, still nothing else
                    (ckpt / "meta.json").write_text(json.dumps(dict(meta, format=1)))
                    (ckpt / "SHA256SUMS").unlink()
                else:
                    write_checksums(ckpt, ["model.safetensors", "meta.json", "train_state.pt"])
                with pytest.raises(UnsafeFile) as caught:
                    train(stopped, progress=False)
                err = dict(kind=caught.value.kind, error=str(caught.value))
                (ckpt / "train_state.pt").write_bytes(saved)
                (ckpt / "meta.json").write_text(json.dumps(meta))
                write_checksums(ckpt, ["model.safetensors", "meta.json", "train_state.pt"])
            assert err["kind"] == "unsafe" and "nothing was executed" in err["error"], (place, label, err)
            assert not marker.exists(), f"{place}: {label} ran"
            faults += 1
    assert train(stopped, progress=False)["status"] == "completed"  # and the real checkpoint still resumes
    ledger(faults=faults, runs=1, survived=1)


# ------------------------------------------------------------------------ 6. memory: refused before, caught during
def test_a_run_that_cannot_fit_is_refused_before_anything_is_built(tiny_data, runs_dir):
    """--L 100000 (82 GB of activations by the cost model): refused in seconds, one line naming both figures and the
    override."""
    t0 = time.time()
    res = run_cli(
        ["train", "--arch", "preln", "--L", "100000", "--preset", "tiny", "--data", str(tiny_data), "--json"],
        dict(os.environ),
        timeout=120,
    )
    err = json.loads(res.stdout)
    assert res.returncode == 2 and err["kind"] == "resources", (res.stdout, res.stderr[-2000:])
    assert "needs about" in err["error"] and " on cpu is " in err["error"] and "--no-memory-check" in err["error"], err
    assert time.time() - t0 < 90 and not any(runs_dir.rglob("*.safetensors"))
    assert not any(p.is_dir() for p in runs_dir.glob("*/*")), "the refused run left a folder"
    ledger(faults=1)


def test_out_of_memory_while_training_is_one_line_and_a_failed_run(tiny_data, runs_dir, tmp_path):
    """The address space capped just above what the process maps at its first step (ulimit -v: the CPU allocator's
    real failure): one JSON error of kind `resources`, exit 2, no traceback, the run recorded as failed."""
    env = hooked_env(tmp_path, DEPTHBENCH_TEST_MEMORY_LIMIT=str(48 << 20))
    res = run_cli(
        [
            "train",
            "--arch",
            "preln",
            "--L",
            "2",
            "--d-model",
            "64",
            "--preset",
            "tiny",
            "--max-steps",
            "3",
            "--data",
            str(tiny_data),
            "--no-memory-check",
            "--json",
        ],
        env,
    )
    assert res.returncode == 2, (res.stdout, res.stderr[-3000:])
    err = json.loads(res.stdout)
    assert (
        err["kind"] == "resources" and err["error"].startswith("out of memory") and "recorded as failed" in err["error"]
    ), err
    (folder,) = [p for p in (runs_dir / "default").iterdir()]
    result = read_result(folder)
    assert result["status"] == "failed" and result["error"].startswith("out of memory"), result
    ledger(faults=1, runs=1, survived=1)


# ------------------------------------------------------------------------ 7. a YAML bomb and long messages
def test_a_yaml_alias_bomb_and_huge_inputs_give_short_errors(tmp_path, capsys):
    "A 600-byte study whose aliases expand to 10^9 nodes, and inputs holding megabytes: refused fast, messages short."
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)
    ]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(levels) + "\nname: bomb\ngroups: [{name: g, archs: *a8}]\n")
    assert bomb.stat().st_size < 700
    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump(dict(name="huge", groups=[dict(name="g" * 10**6, archs=["x" * 10**6])])))
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump(dict(name="keys", groups=[{f"k{i}": i for i in range(20000)}])))
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(dict(model=dict(arch="preln" * 200000), study="s")))
    for argv in (
        ["sweep", "plan", str(bomb)],
        ["sweep", "plan", str(huge)],
        ["sweep", "plan", str(keys)],
        ["train", "--run-config", str(cfg)],
        ["train", "--arch", "q" * 10**6],
    ):
        t0 = time.time()
        err = json_error(capsys, argv)
        assert time.time() - t0 < 20 and err["kind"] in ("config", "usage") and len(err["error"]) <= 600, (
            argv[:2],
            len(err["error"]),
        )
        assert main(argv) == 2
        text = capsys.readouterr().err
        assert len(text) <= 700 and len(text.strip().splitlines()) == 1, len(text)
    ledger(faults=5)


# ---------------------------------------------------------------------------------------------- 8. a full disk
def test_a_full_disk_leaves_no_partial_checkpoint_and_the_resume_cleans_first(reference, tmp_path, monkeypatch, capsys):
    """The runs folder on a small tmpfs: the second checkpoint does not fit. The failed write removes its temporary
    folder and says where and how much it needs. A stale temporary folder that fills the disk is removed by the resume
    before it checks that the folder is writable; once there is space, the resume ends with the uninterrupted record."""
    from depthbench_nb.config import ResourceError

    mnt = tmp_path / "disk"
    mnt.mkdir()
    ckpt = sum(f.stat().st_size for f in list_checkpoints(reference["folder"])[-1][1].iterdir())
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a full disk) needs root")
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(1.5 * ckpt) + (256 << 10)}", "tmpfs", str(mnt)], check=True
    )
    try:
        monkeypatch.setenv("DEPTHBENCH_RUNS", str(mnt / "runs"))
        run = reference["run"]
        folder = run_dir(run)
        with pytest.raises(ResourceError) as caught:
            train(run, progress=False)
        msg = str(caught.value)
        assert f"checkpoint step 6 could not be written to {folder / 'checkpoints'}" in msg and "needs about" in msg, (
            msg
        )
        assert "free" in msg and "partial checkpoint was removed" in msg and len(msg) < 600
        assert not list((folder / "checkpoints").glob(".tmp-step_*")) and [s for s, _ in list_checkpoints(folder)] == [
            3
        ]
        stale = folder / "checkpoints" / ".tmp-step_00000006-4242"
        stale.mkdir()
        with contextlib.suppress(OSError), open(stale / "model.safetensors", "wb") as f:  # a killed writer's leftovers
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        capsys.readouterr()
        with pytest.raises(ResourceError) as again:
            train(run, progress=False)  # cleaned first: it trains, then the same
        assert "removed 1 temporary checkpoint folder" in capsys.readouterr().out and "could not be written" in str(
            again.value
        )
        subprocess.run(["mount", "-o", f"remount,size={4 * ckpt + (1 << 20)}", str(mnt)], check=True)  # space freed
        res = train(run, progress=False)
        lost = lost_records(read_metrics(folder), reference["rows"])
        assert res["status"] == "completed" and deterministic(read_metrics(folder)) == deterministic(reference["rows"])
        assert weights_digest(folder) == reference["digest"] and lost == 0
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    ledger(faults=2, runs=1, survived=1, lost=lost)


# ------------------------------------------------------------------------ 9. report: nothing to report is not 0
def test_report_with_nothing_to_report_exits_non_zero(tiny_data, runs_dir, tmp_path, capsys):
    "A study whose only run failed: report writes its Missing list and exits 1."
    run = tiny(tiny_data, steps=2, study="empty-report")
    folder = run_dir(run)
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(dict(run.to_dict(), run_id=run.run_id)))  # started, never finished
    rc = main(["report", "empty-report", "--only", "depthbench", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["completed_runs"] == 0, out
    index = (runs_dir / "empty-report" / "report" / "depthbench_index.md").read_text()
    assert "## Missing" in index
    ledger(faults=1)


# ---------------------------------------------------------- 10. the notebooks' tests ignore the checkout's runs
def test_notebook_tests_ignore_a_runs_folder_that_holds_a_demo(tmp_path):
    """The runs folder the notebooks' tests would otherwise read (the checkout's, where `depthbench-nb demo` leaves its
    extra runs in .sweep/) holds the demo's records: nbdev_test of the sweep notebook (its Slurm-script cell included)
    still passes. And this test session's runs folder is its own, never the checkout's."""
    from depthbench_nb.config import repo_root, runs_root
    from depthbench_nb.demo import _demo_extra_entries
    from depthbench_nb.sweep import _add_extra_entries, load_study

    if repo_root() is not None:
        assert not runs_root().is_relative_to(repo_root() / "papermill_runs"), runs_root()
    polluted = tmp_path / "checkout-runs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPTHBENCH_RUNS", str(polluted))
        _add_extra_entries(load_study("demo"), _demo_extra_entries())
    assert (polluted / "demo" / ".sweep" / "extra_entries.json").exists()
    nbdev_test = Path(sys.executable).parent / "nbdev_test"
    repo = Path(__file__).resolve().parent.parent
    res = subprocess.run(
        [str(nbdev_test), "--path", "nbs/07b_sweep.ipynb", "--n_workers", "1"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, DEPTHBENCH_RUNS=str(polluted)),
    )
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    ledger(faults=1)


# =================================================================================================================
# Folders and moments a user did not choose: a hostile model folder is refused in one line of the right kind, a
# model beyond memory is refused before it is built, a report reads the study file as status does, and a signal while
# a command or a run's kernel starts is an interruption like any other.
# =================================================================================================================
def _safetensors(folder: Path) -> tuple[bytes, int, dict]:
    "(the bytes, the header length, the header) of a folder's model.safetensors."
    raw = (folder / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return raw, n, json.loads(raw[8 : 8 + n])


def _pickle_in_bin(zip_format: bool):
    def plant(folder: Path, marker: Path) -> None:
        (folder / "model.safetensors").unlink()  # Transformers then reads pytorch_model.bin
        (folder / "pytorch_model.bin").write_bytes(planted_pickle(marker, zip_format))

    return plant


def _tensor_of_10_12_elements(folder: Path, marker: Path) -> None:
    raw, n, head = _safetensors(folder)
    head[next(k for k in head if k != "__metadata__")]["shape"] = [10**6, 10**6]  # the same offsets, 10^12 elements
    text = json.dumps(head).encode()
    (folder / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n :])


def _header_of_2_60_bytes(folder: Path, marker: Path) -> None:
    raw = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes((1 << 60).to_bytes(8, "little") + raw[8:])


def _weights_link_out(folder: Path, marker: Path) -> None:
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors").symlink_to("/etc/passwd")


def _negative_context(folder: Path, marker: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = -5
    (folder / "config.json").write_text(json.dumps(cfg))


HOSTILE_FOLDERS = {  # case: (what is planted, the kind of refusal, what the line says)
    "pickle-zip": (_pickle_in_bin(True), "unsafe", "would run code to be loaded"),
    "pickle-raw": (_pickle_in_bin(False), "unsafe", "would run code to be loaded"),
    "tensor-10^12": (_tensor_of_10_12_elements, "corrupt", "claims shape [1000000, 1000000]"),
    "header-2^60": (_header_of_2_60_bytes, "corrupt", "its header claims 1,152,921,504,606,846,976 bytes"),
    "link-to-etc-passwd": (_weights_link_out, "unsafe", "links outside the model folder (to /etc/passwd)"),
    "negative-context": (_negative_context, "config", "max_position_embeddings -5"),
}
DIAGNOSE_SMALL = ["--n-samples", "2", "--seq-len", "16", "--device", "cpu", "--no-figures"]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "plain"])
@pytest.mark.parametrize("case", HOSTILE_FOLDERS)
def test_a_hostile_model_folder_is_a_one_line_refusal(case, as_json, llama_folder, tmp_path, capsys):
    """`diagnose --hf` on a model folder with a pickle in pytorch_model.bin (torch's zip layout or a raw pickle), a
    safetensors header claiming a 10^12-element tensor or a 2^60-byte header, model.safetensors linking to
    /etc/passwd, or a negative max_position_embeddings: exit 2 and one line of the right kind (JSON with --json), no
    traceback; nothing planted ran and nothing was written."""
    plant, kind, said = HOSTILE_FOLDERS[case]
    folder, marker, out = tmp_path / "model", tmp_path / "ran", tmp_path / "out"
    shutil.copytree(llama_folder, folder)
    plant(folder, marker)
    argv = ["diagnose", "--hf", str(folder), *DIAGNOSE_SMALL, "--out", str(out)]
    if as_json:
        obj = json_error(capsys, argv)
        assert obj["kind"] == kind and said in obj["error"], obj
    else:
        capsys.readouterr()
        rc = main(argv)
        got, err = capsys.readouterr()
        assert rc == 2 and got == "" and len(err.strip().splitlines()) == 1, (rc, got, err[-3000:])
        assert err.startswith("depthbench-nb diagnose: error: ") and said in err, err
    assert not marker.exists() and not out.exists()
    ledger(faults=1)


def _deep(folder: Path, hidden: int) -> None:
    "The folder's LLaMA config made 100,000 blocks deep at width `hidden` (its small weights file kept)."
    cfg = json.loads((folder / "config.json").read_text())
    heads = dict(num_attention_heads=2, num_key_value_heads=2, head_dim=hidden // 2)
    cfg.update(num_hidden_layers=100_000, hidden_size=hidden, intermediate_size=2 * hidden, **heads)
    (folder / "config.json").write_text(json.dumps(cfg))


def _address_space(gib: int):
    "A child's address space capped at `gib` GiB: what it may allocate, whatever this machine has."
    import resource

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))

    return cap


@pytest.mark.parametrize("case", ["llama-d64", "depthbench-export"])
def test_a_model_beyond_memory_is_refused_before_it_is_built(case, llama_folder, trained_run, tmp_path, capsys):
    """`diagnose --hf` on a LLaMA config of 100,000 blocks (d 64, with a real small weights file) or on an export whose
    `depthbench.n_layer` is 100,000, in a process that may allocate 8 GiB: refused by train's memory rule from the
    config alone, `resources`, exit 2, in seconds (building it took minutes and gigabytes)."""
    folder = tmp_path / "model"
    if case == "llama-d64":
        shutil.copytree(llama_folder, folder)
        _deep(folder, 64)
    else:
        assert main(["export-hf", str(trained_run("preln")), str(folder), "--json"]) == 0
        cfg = json.loads((folder / "config.json").read_text())
        cfg["depthbench"]["n_layer"] = cfg["num_hidden_layers"] = 100_000
        (folder / "config.json").write_text(json.dumps(cfg))
    t0 = time.time()
    proc = subprocess.run(
        CLI
        + ["diagnose", "--hf", str(folder), "--device", "cpu", "--no-figures", "--out", str(tmp_path / "o"), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_address_space(8),
    )
    took = time.time() - t0
    assert proc.returncode == 2 and len(proc.stdout.strip().splitlines()) == 1, (proc.stdout, proc.stderr[-3000:])
    obj = json.loads(proc.stdout)
    assert obj["kind"] == "resources" and "100,000 blocks" in obj["error"] and "--no-memory-check" in obj["error"]
    assert took < 60 and "Traceback" not in proc.stderr, (took, proc.stderr[-2000:])
    ledger(faults=1)


def test_no_memory_check_lets_diagnose_go_ahead(llama_folder, tmp_path, capsys, monkeypatch):
    """A LLaMA config of 100,000 blocks at d 4,096 (50 TiB) is refused (`resources`) before anything loads;
    `--no-memory-check` goes past the check (here to the next check: the folder holds no tokenizer)."""
    monkeypatch.setenv("DEPTHBENCH_MEMORY_CHECK", "1")  # the option sets it to 0: restored after the test
    folder = tmp_path / "deep"
    folder.mkdir()
    shutil.copy(llama_folder / "config.json", folder / "config.json")
    _deep(folder, 4096)
    argv = ["diagnose", "--hf", str(folder), "--device", "cpu", "--no-figures", "--out", str(tmp_path / "o")]
    refused = json_error(capsys, argv)
    assert refused["kind"] == "resources" and "TiB" in refused["error"], refused
    past = json_error(capsys, argv + ["--no-memory-check"])
    assert past["kind"] == "config" and "no tokenizer could be loaded" in past["error"], past
    ledger(faults=1)


def test_a_dropped_lr_leaves_the_report_at_once(tiny_data, runs_dir, tmp_path, capsys):
    """A study of two LRs trained and collected (its plan recorded), then one LR dropped from its file: `sweep status`
    lists that run as stale, and the report's table (the study by name, as `report STUDY` reads it) leaves it out
    at once: best_lr is the remaining LR and n_lrs is 1 (it read the recorded plan: n_lrs 2)."""
    from depthbench_nb.report_common import best_lr_rows, study_table
    from depthbench_nb.sweep import expand_study, load_study

    study = tmp_path / "drop.yaml"

    def write(lrs):
        group = dict(name="g", archs=["preln"], depths=[2], lrs=lrs, max_steps=2)
        study.write_text(yaml.safe_dump(dict(name="drop", preset="tiny", data=str(tiny_data), groups=[group])))
        return expand_study(load_study(study))

    both = write([1e-3, 2e-3])
    for e in both:
        assert train(e.run, progress=False)["status"] == "completed"
    assert main(["collect", str(study), "--json"]) == 0  # records the plan, as `sweep run` does
    kept = write([1e-3])
    capsys.readouterr()
    assert main(["sweep", "status", str(study), "--json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["stale"]] == [both[1].run_id]
    table = study_table("drop")
    assert table.run_id.tolist() == [kept[0].run_id], table.run_id.tolist()
    best = best_lr_rows(table)
    assert best.n_lrs.tolist() == [1] and best.lr.tolist() == [1e-3], best[["lr", "n_lrs"]]
    ledger(faults=1, runs=2, survived=2)


def _catches(pid: int, signum: int) -> bool:
    "Whether process `pid` has a handler for `signum` (Linux: the SigCgt mask of /proc/PID/status)."
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


@pytest.mark.parametrize("when", ["first-handler", "0.3s"])
def test_a_signal_while_train_imports_is_exit_3_and_one_line(when, tiny_data, runs_dir, tmp_path):
    """`depthbench-nb train` (the console script) sent SIGTERM while it imports: as soon as it can catch one, before
    torch is loaded, or 0.3 s in. Exit 3 and one line (JSON with --json), no traceback, no run folder."""
    script = Path(sys.executable).parent / "depthbench-nb"
    assert script.exists(), script
    args = ["train", "--arch", "preln", "--preset", "tiny", "--L", "2", "--d-model", "32", "--max-steps", "2"]
    as_json = when == "first-handler"
    proc = subprocess.Popen(
        [sys.executable, str(script), *args, "--data", str(tiny_data), *(["--json"] if as_json else [])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, DEPTHBENCH_RUNS=str(runs_dir)),
    )
    if when == "first-handler":
        deadline = time.time() + 60
        while not _catches(proc.pid, signal.SIGTERM):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()
            time.sleep(0.002)
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()  # still importing: torch not loaded
    else:
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "Traceback" not in err, (proc.returncode, out, err[-3000:])
    line = (out if as_json else err).strip().splitlines()
    assert len(line) == 1 and "interrupted by SIGTERM" in line[0], (out, err)
    if as_json:
        assert json.loads(out)["kind"] == "interrupted"
    assert not runs_dir.exists() or not any(runs_dir.rglob("params.json"))  # no run folder
    ledger(faults=1)


def test_a_signal_as_a_runs_kernel_starts_is_an_interruption(tiny_data, tmp_path):
    """`sweep run` (papermill executor) sent SIGTERM one second after its first run's kernel started (the kernel still
    importing, so it dies of the signal passed on): the run is recorded `interrupted`, no attempt is used, nothing new
    starts, exit 3, no process of its tree is left."""
    runs = tmp_path / "runs"
    study = tmp_path / "early.yaml"
    group = dict(name="g", archs=["preln"], depths=[2], lrs=[1e-3, 2e-3], max_steps=2)
    study.write_text(yaml.safe_dump(dict(name="early", preset="tiny", data=str(tiny_data), groups=[group])))
    entries = study_entries_in(study, runs)
    tree = f"depthbench-test-tree-{os.getpid()}-{time.time_ns()}"
    env = hooked_env(tmp_path, DEPTHBENCH_RUNS=str(runs), DEPTHBENCH_TEST_TREE=tree)
    driver = subprocess.Popen(
        CLI + ["sweep", "run", str(study), "--executor", "papermill", "--no-progress", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def kernel() -> bool:
        for pid in processes_with(tree):
            with contextlib.suppress(OSError):
                if b"ipykernel" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
        return False

    deadline = time.time() + 300
    while not kernel():
        assert driver.poll() is None and time.time() < deadline, driver.communicate()
        time.sleep(0.02)
    time.sleep(1.0)
    os.kill(driver.pid, signal.SIGTERM)
    out, err = driver.communicate(timeout=300)
    assert driver.returncode == 3, (driver.returncode, out[-2000:], err[-3000:])
    assert processes_with(tree) == [], "a child of the signalled driver outlived it"
    report = json.loads(out)
    history = json.loads((runs / "early" / ".sweep" / "attempts" / f"{entries[0].run_id}.json").read_text())
    assert history["attempts"] == 0 and history["history"][-1]["status"] == "interrupted", history
    assert {r["run_id"]: r["status"] for r in report["not_done"]} == {
        entries[0].run_id: "interrupted",
        entries[1].run_id: "pending",
    }, report["not_done"]
    ledger(faults=1, runs=1, survived=1)


# ---------------------------------------------- 11. folders a user did not make: verify before trusting (data)
DATA_KILLER = r"""
import os, signal, sys
from depthbench_nb import data as D
from depthbench_nb.cli import main
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
where, argv = sys.argv[1], sys.argv[2:]
if where == 'second-record':                     # one worker: kill -9 once the second source shard is recorded
    real, seen = D._Inline.get, []
    def get(self, timeout):
        msg = real(self, timeout)
        if msg and msg[0] == 'shard': seen.append(msg[1])
        if len(seen) == 2: die()
        return msg
    D._Inline.get = get
elif where == 'worker':                          # two workers: the one given source shard 1 is killed (kill -9)
    coordinator, real_shard = os.getpid(), D._prepare_shard
    def prepare_shard(job, *a, **k):
        if os.getpid() != coordinator and job['shard']['index'] == 1: die()
        return real_shard(job, *a, **k)
    D._prepare_shard = prepare_shard
sys.exit(main(argv))
"""
N_SOURCE_FILES = 4


@pytest.fixture(scope="module")
def data_source(tiny_data, tmp_path_factory):
    "Four JSON-lines files of KJV chapters (four source shards), the session's tokenizer, and a clean preparation."
    from depthbench_nb import data as D
    from depthbench_nb.config import DataConfig

    root = tmp_path_factory.mktemp("data-faults")
    (root / "src").mkdir()
    chapters = list(D._kjv_chapters())[:240]
    for i in range(N_SOURCE_FILES):
        lines = [json.dumps(dict(text=text)) + "\n" for text in chapters[i::N_SOURCE_FILES]]
        (root / "src" / f"{i:03d}.jsonl").write_text("".join(lines))
    tokenizer = str(tiny_data / "tokenizer.json")
    clean = D.prepare(
        DataConfig(source=str(root / "src"), tokenizer=tokenizer, path=str(root / "clean")), progress=False
    )
    return dict(root=root, source=str(root / "src"), tokenizer=tokenizer, clean=clean)


def data_argv(src: dict, out: Path, workers: int = 1) -> list[str]:
    return [
        "data",
        "prepare",
        "--source",
        src["source"],
        "--tokenizer",
        src["tokenizer"],
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--no-progress",
    ]


def packed(out: Path) -> dict:
    "What a preparation must give whatever happened to it: the packed streams and the source shard mapping."
    man = json.loads((out / "manifest.json").read_text())
    assert man["complete"] is True
    return dict(splits=man["splits"], source_shards=man["source_shards"])


def killed_preparation(src: dict, out: Path) -> None:
    "A `data prepare --workers 1` killed (kill -9) right after its second source shard's record was written."
    r = subprocess.run(
        [*CLI[:1], "-c", DATA_KILLER, "second-record", *data_argv(src, out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert (out / "shards" / "00001" / "shard.json").exists() and not (out / "shards" / "00002" / "shard.json").exists()


def resume(src: dict, out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(data_argv(src, out))
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def test_1a_a_changed_token_file_is_redone_on_resume(data_source, tmp_path, capsys):
    """kill -9 after the second source shard's record, then 1,000 tokens of shards/00000/train_00000.bin
    changed (same size): the resume finds it (checked as it is kept), says so, tokenizes the shard again and packs
    what a clean preparation packs."""
    from depthbench_nb.data import TokenData

    out = tmp_path / "killed"
    killed_preparation(data_source, out)
    f = out / "shards" / "00000" / "train_00000.bin"
    raw = bytearray(f.read_bytes())
    raw[2:2002] = bytes(2000)  # 1,000 uint16 tokens set to 0
    f.write_bytes(bytes(raw))
    capsys.readouterr()
    assert main(["data", "inspect", str(out), "--json"]) == 1  # the folder being prepared: its finished shards
    assert "source shard 0" in json.loads(capsys.readouterr().out)["checksums"]
    rc, said = resume(data_source, out, capsys)
    assert rc == 0 and "redone: source shard 0" in said and "train_00000.bin" in said, said
    assert "kept 1 of 4" in said, said
    assert packed(out) == packed(data_source["clean"])
    assert TokenData(out, verify=True).verify() == []
    ledger(faults=2, runs=1, survived=1)


def test_1b_a_shifted_document_index_is_redone_and_found(data_source, tmp_path, capsys):
    """10 entries of shards/00000/train.docs.bin shifted by 3 in a killed preparation: the resume redoes
    the shard (the packed document index is the clean one's); the same damage in a complete folder is found by
    verify(), `data inspect` and `data verify` (exit 1, naming source shard 0)."""
    from depthbench_nb.data import TokenData

    def shift(folder: Path) -> None:
        f = folder / "shards" / "00000" / "train.docs.bin"
        starts = np.frombuffer(f.read_bytes(), dtype="<i8").copy()
        starts[1:11] += 3
        f.write_bytes(starts.tobytes())

    out = tmp_path / "killed"
    killed_preparation(data_source, out)
    shift(out)
    rc, said = resume(data_source, out, capsys)
    assert rc == 0 and "redone: source shard 0" in said and "train.docs.bin" in said, said
    assert packed(out) == packed(data_source["clean"])
    done = tmp_path / "complete"
    shutil.copytree(data_source["clean"], done)
    shift(done)
    assert TokenData(done).verify() == ["shards/00000/train.docs.bin"]
    capsys.readouterr()
    assert main(["data", "inspect", str(done)]) == 1 and "source shard 0" in capsys.readouterr().out
    assert main(["data", "verify", str(done), "--json"]) == 1
    bad = json.loads(capsys.readouterr().out)["damaged"]
    assert [(b["source_shard"], b["file"], b["problem"]) for b in bad] == [
        (0, "shards/00000/train.docs.bin", "checksum mismatch")
    ]
    assert main(["data", "verify", str(data_source["clean"])]) == 0
    ledger(faults=2)


def test_1_the_loader_checks_every_size_on_first_use(data_source, tmp_path, monkeypatch):
    """the loader checks checksums whatever the folder's size (no 1 GiB cap: here the cap is set to 0
    bytes, as a folder of 8B tokens is above any cap), on a token file's first use, naming the file and its source
    shard."""
    from depthbench_nb import data as D

    monkeypatch.setattr(D, "VERIFY_BYTES", 0, raising=False)
    out = tmp_path / "data"
    shutil.copytree(data_source["clean"], out)
    f = out / "shards" / "00002" / "train_00000.bin"
    raw = bytearray(f.read_bytes())
    raw[10] ^= 0xFF
    f.write_bytes(bytes(raw))
    td = D.TokenData(out)  # opening reads no token file
    first = td.manifest["splits"]["train"]["shards"][2]
    start = int(td._offsets["train"][2])
    with pytest.raises(D.CorruptFile, match=r"shards/00002/train_00000.bin \(source shard 2, 002.jsonl\)"):
        td.tokens("train", start, 8)
    assert first["source_shard"] == 2 and len(td.tokens("train", 0, 8)) == 8  # the intact shards still read
    ledger(faults=1)


def test_9_a_killed_data_worker_is_one_line_and_the_resume_is_exact(data_source, tmp_path, capsys):
    """kill -9 of the worker of a `--workers 2` preparation that tokenizes source shard 1: its coordinator
    ends with one JSON error of kind `resources` (no traceback), exit 2; the same command again gives the clean
    preparation."""
    out = tmp_path / "w2"
    r = subprocess.run(
        [*CLI[:1], "-c", DATA_KILLER, "worker", *data_argv(data_source, out, 2), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, (r.stdout, r.stderr[-2000:])
    err = json.loads(r.stdout)
    assert err["kind"] == "resources" and "worker died" in err["error"] and "SIGKILL" in err["error"], err
    rc, said = resume(data_source, out, capsys)
    assert rc == 0 and packed(out) == packed(data_source["clean"]), said
    ledger(faults=1, runs=1, survived=1)


# ----------------------------------------------- 12. writes stay inside: a symbolic link at every place written
def plant(link: Path, target: Path) -> Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_file():
        link.unlink()  # a lock file left by the last writer
    link.symlink_to(target)
    return link


def victim(tmp_path: Path) -> tuple[Path, Path, callable]:
    "A file and a folder outside every root, and a check that neither changed."
    f, d = tmp_path / "victim.txt", tmp_path / "victim-dir"
    f.write_text("precious\n")
    d.mkdir()
    (d / ".tmp-step_00000003-1").mkdir()
    (d / "step_00000006").mkdir()
    (d / "keep.txt").write_text("x")

    def unchanged() -> bool:
        return f.read_text() == "precious\n" and sorted(p.name for p in d.iterdir()) == [
            ".tmp-step_00000003-1",
            "keep.txt",
            "step_00000006",
        ]

    return f, d, unchanged


RUN_SITES = (
    ".lock",
    "params.json",
    "result.json",
    "metrics.jsonl",
    "layer_stats.jsonl",
    "checkpoints",
    "loss_curve.png",
    "train.ipynb",
)


@pytest.mark.parametrize("site", RUN_SITES)
def test_2_a_link_in_a_run_folder_writes_nothing_outside(site, tiny_data, runs_dir, tmp_path, capsys):
    """a symbolic link planted at each name `train` writes in a run folder (to a file or a folder outside
    it) is refused before anything is written: exit 2, kind `unsafe`, naming it; nothing outside changed."""
    f, d, unchanged = victim(tmp_path)
    run = tiny(tiny_data, steps=2)
    folder = run_dir(run)
    plant(folder / site, d if site == "checkpoints" else f)
    params = tmp_path / "params.json"
    params.write_text(json.dumps(dict(run.to_dict(), run_id=run.run_id)))
    err = json_error(capsys, ["train", "--run-config", str(params), "--no-progress"])
    assert err["kind"] == "unsafe" and site in err["error"], err
    assert unchanged()
    ledger(faults=1)


def test_2_a_checkpoints_link_on_resume_deletes_and_renames_nothing(stopped_run, tmp_path, capsys):
    """RUN/checkpoints -> DIR on a stopped run's resume: DIR's .tmp-step_* is not deleted and its step_*
    not renamed; the refusal is one line, and the run resumes exactly once
    the link is replaced by the real folder."""
    folder = run_dir(stopped_run)
    _, d, unchanged = victim(tmp_path)
    real = tmp_path / "real-checkpoints"
    shutil.move(str(folder / "checkpoints"), real)
    plant(folder / "checkpoints", d)
    err = json_error(capsys, ["train", "--run-config", str(folder / "params.json"), "--no-progress"])
    assert err["kind"] == "unsafe" and "checkpoints" in err["error"] and unchanged(), err
    (folder / "checkpoints").unlink()
    shutil.move(str(real), folder / "checkpoints")
    assert train(stopped_run, progress=False)["status"] == "completed"
    ledger(faults=1, runs=1, survived=1)


DATA_SITES = (
    ".lock",
    "shards",
    "train.docs.bin",
    ".train.docs.bin.tmp",
    "val.docs.bin",
    ".val.docs.bin.tmp",
    "train.cut.bin",
    ".train.cut.bin.tmp",
    "shards/00000",
    "shards/00000/.lock",
    "shards/00000/shard.json",
    "shards/00000/train_00000.bin",
    "shards/00000/train.docs.bin",
)


@pytest.mark.parametrize("site", DATA_SITES)
def test_2_a_link_in_a_data_folder_writes_nothing_outside(site, data_source, tmp_path, capsys):
    """A symbolic link planted at each name `data prepare` writes, in a folder whose preparation was stopped after its
    plan: refused in one line (kind `unsafe`), or (a token file, which a shard's writer removes before it writes) not
    followed; nothing outside the folder changed either way, and a folder that was finished verifies."""
    from depthbench_nb import data as D
    from depthbench_nb.config import DataConfig

    f, d, unchanged = victim(tmp_path)
    out = tmp_path / "data"
    D.prepare_folder(
        DataConfig(source=data_source["source"], tokenizer=data_source["tokenizer"], path=str(out)),
        progress=False,
        plan_only=True,
    )
    plant(out / site, d if site in ("shards", "shards/00000") else f)
    capsys.readouterr()
    rc = main(data_argv(data_source, out) + ["--json"])
    res = json.loads(capsys.readouterr().out)
    assert unchanged(), site
    if rc == 2:
        assert res["kind"] == "unsafe" and site.split("/")[-1] in res["error"], res
    else:
        assert rc == 0 and not (out / site).is_symlink() and D._verify_folder(out) == [], res
    ledger(faults=1)


def test_3_report_and_study_names_stay_inside_the_runs_root(tiny_data, runs_dir, tmp_path, capsys):
    """`report ../victim_report` (a folder beside the runs root), a study file
    named `..`, and a study's `report` folder that is a link out of it: each exit 2 in one line, nothing written
    outside."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    outside = runs_dir.parent / "victim_report"
    outside.mkdir()
    assert json_error(capsys, ["report", "../victim_report", "--only", "depthbench"])["kind"] == "config"
    assert list(outside.iterdir()) == []
    study = tmp_path / "up.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="..",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], max_steps=1)],
            )
        )
    )
    assert "study name" in json_error(capsys, ["collect", str(study)])["error"]
    assert not (runs_dir.parent / "collect.csv").exists()
    (runs_dir / "linked").mkdir()
    plant(runs_dir / "linked" / "report", outside)
    err = json_error(capsys, ["report", "linked", "--only", "depthbench"])
    assert err["kind"] == "unsafe" and list(outside.iterdir()) == [], err
    ledger(faults=3)


# ------------------------------------------------------------ 13. records checked by schema (result, params)
def one_run_study(tiny_data, tmp_path: Path):
    "A one-run study file (2 steps) and its run, with the run's folder holding params.json."
    from depthbench_nb.runs import write_params
    from depthbench_nb.sweep import expand_study, load_study

    study = tmp_path / "schema.yaml"
    study.write_text(
        yaml.safe_dump(
            dict(
                name="schema",
                preset="tiny",
                data=str(tiny_data),
                groups=[dict(name="g", archs=["preln"], depths=[2], max_steps=2)],
            )
        )
    )
    (entry,) = expand_study(load_study(study))
    folder = run_dir(entry.run)
    folder.mkdir(parents=True)
    write_params(folder, entry.run, say=lambda m: None)
    return study, entry.run, folder


def test_8_a_result_of_the_wrong_type_is_corrupt(tiny_data, runs_dir, tmp_path, capsys):
    """result.json with `final_val_loss: "abc"` is refused by collect (exit 2, kind `corrupt`, the file
    named, nothing in collect.csv); params.json with a depth that is not a number, the same."""
    from depthbench_nb.runs import result_identity

    study, run, folder = one_run_study(tiny_data, tmp_path)
    (folder / "result.json").write_text(
        json.dumps(dict(status="completed", **result_identity(run), final_val_loss="abc"))
    )
    err = json_error(capsys, ["collect", str(study)])
    assert err["kind"] == "corrupt" and "result.json" in err["error"] and "final_val_loss" in err["error"], err
    assert not (runs_dir / "schema" / "collect.csv").exists()
    (folder / "result.json").unlink()
    params = json.loads((folder / "params.json").read_text())
    params["model"]["n_layer"] = "abc"
    (folder / "params.json").write_text(json.dumps(params))
    given = tmp_path / "p.json"  # the same run, given from outside its folder
    given.write_text(json.dumps(dict(run.to_dict(), run_id=run.run_id)))
    err = json_error(capsys, ["train", "--run-config", str(given), "--no-progress"])
    assert err["kind"] == "corrupt" and "params.json" in err["error"], err
    ledger(faults=2)


def test_8_a_dict_loss_without_run_id_is_not_a_key_error(tiny_data, runs_dir, tmp_path, capsys):
    """a result.json holding a dict loss and no run_id is a damaged record for `train --json` (no KeyError):
    said, ignored, and the run trains and writes a valid one."""
    from depthbench_nb.runs import read_result

    _, run, folder = one_run_study(tiny_data, tmp_path)
    (folder / "result.json").write_text(json.dumps(dict(status="completed", final_val_loss={"x": 1.0})))
    capsys.readouterr()
    rc = main(["train", "--run-config", str(folder / "params.json"), "--no-progress", "--json"])
    cap = capsys.readouterr()
    assert rc == 0 and "KeyError" not in cap.err and "result.json is not a run result" in cap.err + cap.out, cap
    assert json.loads(cap.out)["run_id"] == run.run_id
    assert read_result(folder)["run_id"] == run.run_id
    ledger(faults=1, runs=1, survived=1)


@pytest.mark.parametrize("site", ["collect.csv", ".sweep", "report/20_depthbench_report.ipynb", "notebooks"])
def test_2_a_link_at_a_study_or_notebooks_output_writes_nothing_outside(site, tiny_data, runs_dir, tmp_path, capsys):
    """A symbolic link at a name `collect` writes in a study folder (collect.csv, the driver's .sweep folder), at the
    notebook `report` executes into the report folder, or at a notebook `notebooks DIR` copies: refused in one line
    (kind `unsafe`), nothing outside changed."""
    f, d, unchanged = victim(tmp_path)
    if site == "notebooks":
        dest = tmp_path / "nbs"
        plant(dest / "10_train.ipynb", f)
        argv = ["notebooks", str(dest), "--force"]
    else:
        study, _, _ = one_run_study(tiny_data, tmp_path)
        plant(runs_dir / "schema" / site, d if site == ".sweep" else f)
        argv = ["report", "schema", "--only", "depthbench"] if site.startswith("report") else ["collect", str(study)]
    err = json_error(capsys, argv)
    assert err["kind"] == "unsafe" and unchanged(), err
    ledger(faults=1)
