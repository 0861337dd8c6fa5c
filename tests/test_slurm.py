"""Studies on a real Slurm, on a one-node cluster started from Debian's packages (tests/slurm_cluster.py):
a three-run study completes as a job array; submitting it again queues nothing; a task cancelled mid-run resumes
from its checkpoint with the metrics of an uninterrupted run; `sweep status` follows queued / running / completed;
requests are checked against sinfo before anything is submitted and every option reaches the script; a two-node
run, simulated on the one node, trains to the loss of a single process; a data preparation spread over a job array
(and a packing job after it) writes the folder a local preparation writes.

Each test stands alone (no trained run is shared between tests), so pytest-xdist may send them to any worker; a worker
starts its own cluster (in under a second) for the tests it gets. Outside CI a machine without Slurm (or not root)
skips the cluster tests with the reason; with CI=true that is a failure, so CI cannot pass without having run them.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from depthbench_nb.config import ConfigError, DataConfig
from depthbench_nb.runs import read_metrics, read_result
from depthbench_nb.sweep import expand_study, load_study, study_status, _write_slurm_script

sys.path.insert(0, str(Path(__file__).parent))
from slurm_cluster import SlurmCluster, free_port, why_not_available  # noqa: E402

pytestmark = pytest.mark.slurm

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
DRIVER = [sys.executable, "-c", "import sys; from depthbench_nb.cli import main; sys.exit(main())"]
MAX_TIME = "4:00:00"  # the test partition's time limit: the 24-hour default must be capped to it
FEATURES = ("cpu", "depthbench")  # the test node's features (--slurm-constraint)


def write_study(path: Path, name: str, data, archs, max_steps: int, **group) -> Path:
    path.write_text(
        yaml.safe_dump(
            dict(
                name=name,
                preset="tiny",
                data=str(data),
                groups=[dict(name="g", archs=list(archs), depths=[2], max_steps=max_steps, **group)],
            )
        )
    )
    return path


def cli(*args, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
    "The depthbench-nb command line, as a user runs it (a new process)."
    return subprocess.run(
        DRIVER + [str(a) for a in args], env=env or dict(os.environ), capture_output=True, text=True, timeout=timeout
    )


def wait_for(predicate, timeout: float, what: str, every: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def squeue(*args) -> list[list[str]]:
    "Rows of squeue for this user's jobs in every state the controller remembers: job id|array job|task|state|comment."
    out = subprocess.run(
        [shutil.which("squeue") or "/usr/bin/squeue", "-h", "-r", "--states=all", "-o", "%A|%F|%K|%T|%k", *args],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def study_jobs(study: str) -> list[list[str]]:
    "The study's array tasks the controller knows, in every state (sorted: squeue's order varies)."
    return sorted(r for r in squeue() if r[4].startswith(f"depthbench-nb:{study}:"))


def job_done(job: str) -> bool:
    "Every task of the array has left the queue's active states."
    rows = [r for r in squeue() if r[1] == job]
    return bool(rows) and all(r[3] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING") for r in rows)


# ------------------------------------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster():
    "A one-node Slurm for this module; SLURM_CONF and DEPTHBENCH_RUNS point at it and at a private runs folder."
    why = why_not_available()
    if why:
        if IN_CI:
            pytest.fail(f"CI=true: the Slurm tests must run here, but {why}")
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="slurm-"))  # short: slurmd and munge keep unix sockets in it
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "DEPTHBENCH_RUNS")}
    c = SlurmCluster(root / "cluster", max_time=MAX_TIME, features=FEATURES)
    try:
        c.start()
        os.environ.update(SLURM_CONF=str(c.conf), DEPTHBENCH_RUNS=str(root / "runs"))
        c.runs = root / "runs"
        yield c
    finally:
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not os.environ.get("DEPTHBENCH_KEEP_SLURM"):
            shutil.rmtree(root, ignore_errors=True)  # kept for a post-mortem


@pytest.fixture(scope="module")
def dead_conf(cluster) -> Path:
    "A client configuration whose controller port nobody listens on: a Slurm controller that is down."
    p = cluster.root / "down.conf"
    port = free_port()
    p.write_text(
        "".join(
            f"SlurmctldPort={port}\n" if line.startswith("SlurmctldPort=") else line + "\n"
            for line in cluster.conf.read_text().splitlines()
        )
    )
    return p


# ------------------------------------------------------------------------------------------------ 1, 2, 4: a study
# One test, so that the expensive part (three trained runs) is never repeated whatever worker runs it.
def test_three_run_study_as_a_job_array(cluster, tiny_data, tmp_path):
    """A three-design tiny study (10 steps each) submitted one task at a time (--slurm-parallel 1,
    so that queued tasks are seen on any machine) and watched with `sweep status` until every run is completed;
    then submitted again."""
    study = write_study(tmp_path / "tiny3.yaml", "tiny3", tiny_data, ["preln", "periln", "attnres"], 10)
    spec = load_study(study)
    res = cli(
        "sweep", "run", study, "--launcher", "slurm", "--submit", "--slurm-gpus", "0", "--slurm-parallel", "1", "--json"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    job, runs = out["job_id"], cluster.runs / "tiny3"
    seen: dict[str, list] = {e.run_id: [] for e in expand_study(spec)}

    def watch():
        st = study_status(spec)
        for row in st["runs"]:
            obs = (row["status"], row.get("slurm_state"), row.get("slurm_reason"))
            if not seen[row["run_id"]] or seen[row["run_id"]][-1] != obs:
                seen[row["run_id"]].append(obs)
        return st["counts"]["completed"] + st["counts"]["failed"] == 3

    wait_for(watch, 600, "the three array tasks to finish", every=1.0)
    wait_for(lambda: job_done(job), 120, "the last task to leave the queue")

    # 1. a job array whose defaults fit the node: 8 CPUs capped at its CPUs, their share of its memory, 24 h capped
    cpus, mem = int(cluster.node["CPUs"]), int(cluster.node["RealMemory"])
    assert out["submitted"] and job.isdigit() and out["to_submit"] == 3
    want = min(8, cpus)
    assert out["request"] == f"--cpus-per-task={want} --mem={mem * want // cpus}M --time=04:00:00"
    script = Path(out["script"]).read_text()
    assert "--gres" not in script and "#SBATCH --array=0-2%1" in script
    (array,) = [json.loads(p.read_text()) for p in (runs / ".sweep" / "slurm" / "arrays").glob("*.json")]
    assert sorted(array["run_ids"]) == sorted(seen)
    for i, run_id in enumerate(array["run_ids"]):
        res = read_result(runs / run_id)
        assert res["status"] == "completed" and res["steps"] == 10, res
        assert (runs / run_id / "train.ipynb").exists()  # the papermill template ran
        slurm = res["provenance"]["slurm"]  # the job and task in the run record
        assert slurm["array_job_id"] == job and slurm["array_task_id"] == str(i) and slurm["partition"] == "debug"
        log = runs / "logs" / f"slurm-{job}_{i}.out"  # the logs in the study's logs/
        assert log.exists() and f"run {run_id}" in log.read_text()
    st = json.loads(cli("sweep", "status", study, "--json").stdout)
    assert st["counts"]["completed"] == 3 and st["total"] == 3 and " is UP" in st["slurm"]["controller"]
    assert all(r["status"] == "completed" and r["slurm_state"] == "COMPLETED" for r in st["runs"]), st["runs"]

    # 4. while it ran, `sweep status` showed each run queued -> running -> completed, with its Slurm task and state
    order = {"queued": 0, "running": 1, "completed": 2}
    for run_id, obs in seen.items():
        statuses = [o[0] for o in obs]
        assert statuses[-1] == "completed" and all(x in order for x in statuses), (run_id, obs)
        assert [order[x] for x in statuses] == sorted(order[x] for x in statuses), (run_id, obs)  # never backwards
        assert all(state == "PENDING" and reason for x, state, reason in obs if x == "queued"), obs
        assert all(state in ("RUNNING", "COMPLETING") for x, state, _ in obs if x == "running"), obs
    last = seen[array["run_ids"][-1]]  # the third task waited for the others
    assert (
        last[0][0] == "queued" and "running" in [o[0] for o in last] and any(o[2] == "JobArrayTaskLimit" for o in last)
    )
    # no slurmdbd here: sacct says accounting is off, and status says so for a job the controller has forgotten
    from depthbench_nb.slurm import accounting_tasks, probe_slurm

    rows, note = accounting_tasks([job], probe_slurm(read_partitions=False))
    assert rows is None and "not configured" in note
    subs = runs / ".sweep" / "slurm" / "submissions.jsonl"
    saved = subs.read_text()
    subs.write_text(saved + json.dumps(dict(job_id="999999", array_id=array["array_id"])) + "\n")
    st = study_status(spec)
    subs.write_text(saved)
    assert any("sacct" in n and "not configured" in n for n in st["slurm"]["notes"]) and st["counts"]["completed"] == 3

    # 2. submitting again trains nothing: a clear message, exit 0, no job queued, no script rewritten
    before, stamp = [r[:3] for r in study_jobs("tiny3")], Path(out["script"]).stat().st_mtime_ns
    res = cli("sweep", "run", study, "--launcher", "slurm", "--submit", "--slurm-gpus", "0")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "nothing to submit" in res.stdout and "all 3 runs" in res.stdout and "no job queued" in res.stdout
    assert [r[:3] for r in study_jobs("tiny3")] == before and Path(out["script"]).stat().st_mtime_ns == stamp


# ------------------------------------------------------------------------------------------------ 3: scancel, resume
STEPS = 32  # checkpoints every 4 steps; the task is cancelled after its first one


def test_cancelled_task_resumes_from_its_checkpoint(cluster, tiny_data, tmp_path, capsys):
    from depthbench_nb.cli import main

    study = write_study(tmp_path / "resume.yaml", "resume", tiny_data, ["preln"], STEPS, checkpoint_every=4)
    submit = [
        "sweep",
        "run",
        str(study),
        "--launcher",
        "slurm",
        "--submit",
        "--slurm-gpus",
        "0",
        "--executor",
        "python",
        "--json",
    ]
    (entry,) = expand_study(load_study(study))
    folder = cluster.runs / "resume" / entry.run_id
    # the uninterrupted reference: the same run in another runs folder, trained meanwhile
    ref_env = dict(os.environ, DEPTHBENCH_RUNS=str(tmp_path / "reference"))
    reference = subprocess.Popen(
        DRIVER + ["sweep", "run", str(study), "--executor", "python", "--json"],
        env=ref_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert main(submit) == 0
        job = json.loads(capsys.readouterr().out)["job_id"]

        def past_a_checkpoint():
            ckpts = sorted((folder / "checkpoints").glob("step_*"))
            rows = read_metrics(folder) if (folder / "metrics.jsonl").exists() else []
            return ckpts and rows and rows[-1]["step"] >= int(ckpts[0].name.split("_")[1])

        wait_for(past_a_checkpoint, 300, "the task to write its first checkpoint")
        subprocess.run(["scancel", job], check=True, timeout=60)
        wait_for(lambda: job_done(job), 120, "the cancelled task to leave the queue")
        assert read_result(folder)["status"] == "interrupted", (
            "the run finished before the cancel landed (make it longer)"
        )
        steps = sorted(int(p.name.split("_")[1]) for p in (folder / "checkpoints").glob("step_*"))
        k, before = steps[-1], read_metrics(folder)
        assert 0 < k < STEPS and before[-1]["step"] >= k - 1
        # the queue says CANCELLED at once; the run is 'running' until Slurm's signals have ended its processes
        row = wait_for(
            lambda: next((r for r in study_status(load_study(study))["runs"] if r["status"] != "running"), None),
            60,
            "the cancelled task's processes to end (the run's lock released)",
        )
        assert (
            row["status"] == "interrupted" and row["slurm_state"] == "CANCELLED"
        )  # the queue's word, the record's status

        assert main(submit) == 0
        again = json.loads(capsys.readouterr().out)["job_id"]
        assert again != job
        wait_for(lambda: job_done(again), 300, "the resubmitted task to finish")
        assert reference.wait(timeout=600) == 0, reference.stderr.read()[-2000:]
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    got, result = read_metrics(folder), read_result(folder)
    assert result["status"] == "completed" and result["provenance"]["slurm"]["array_job_id"] == again
    log = (cluster.runs / "resume" / ".sweep" / "logs" / f"{entry.run_id}.log").read_text()
    assert f"resuming from checkpoint step {k}" in log  # resumed, not started over
    assert got[:k] == before[:k]  # the rows before the checkpoint were kept as they were, timings included
    want = read_metrics(tmp_path / "reference" / "resume" / entry.run_id)
    assert [r["step"] for r in got] == list(range(STEPS))
    for key in ("loss", "grad_norm", "lr", "tokens"):
        assert [r[key] for r in got] == [r[key] for r in want], key  # identical to the uninterrupted run
    assert result["final_val_loss"] == read_result(tmp_path / "reference" / "resume" / entry.run_id)["final_val_loss"]


# ------------------------------------------------------------------------------------------------ 5: requests
def test_requests_are_checked_against_sinfo_before_submission(cluster, tiny_data, tmp_path, capsys):
    from depthbench_nb.cli import main

    study = write_study(tmp_path / "checks.yaml", "checks", tiny_data, ["preln"], 2)
    cpus, mem = int(cluster.node["CPUs"]), int(cluster.node["RealMemory"])
    limit_shown = subprocess.run(["sinfo", "-h", "-o", "%l"], capture_output=True, text=True).stdout.strip()  # 4:00:00
    base = ["sweep", "run", str(study), "--launcher", "slurm", "--submit"]
    script = cluster.runs / "checks" / ".sweep" / "slurm_checks.sh"
    for args, limit in [
        (["--slurm-gpus", "0", "--slurm-cpus", str(cpus + 1)], f"has {cpus} CPUs, asked --slurm-cpus {cpus + 1}"),
        (["--slurm-gpus", "0", "--slurm-mem", f"{mem + 1024}M"], f"is {mem} MB, asked --slurm-mem"),
        ([], "its nodes have no GPUs, asked --slurm-gpus 1"),
        (
            ["--slurm-gpus", "0", "--slurm-time", "5:00:00"],
            f"the time limit is {limit_shown}, asked --slurm-time 5:00:00",
        ),
        (["--slurm-gpus", "0", "--nodes", "2"], "asked --nodes 2"),
        (["--slurm-gpus", "0", "--slurm-partition", "gpu"], "valid partitions: debug"),
        (["--slurm-gpus", "0", "--slurm-constraint", "a100"], "features there: cpu, depthbench"),
    ]:
        assert main(base + args) == 2, args
        err = capsys.readouterr().err
        assert limit in err, (args, err)
        assert not script.exists()  # refused before anything was written, let alone submitted
    assert study_jobs("checks") == []
    assert main(["slurm", "info", "--json"]) == 0  # what the user can look up first
    info = json.loads(capsys.readouterr().out)
    assert info["partitions"] == [
        dict(
            partition="debug*",
            state="up",
            nodes=1,
            cpus=cpus,
            memory_mb=mem,
            gpus=0,
            time_limit=limit_shown,
            features="cpu,depthbench",
        )
    ]
    assert info["defaults"]["gpus"] == 0 and info["defaults"]["cpus_per_task"] == min(8, cpus)
    # every option users need reaches the script, and a real sbatch accepts it (--test-only: checked, not queued)
    venv = Path(sys.executable).parent.parent
    assert (
        main(
            base[:-1]
            + [
                "--slurm-gpus",
                "0",
                "--slurm-partition",
                "debug",
                "--slurm-account",
                "depthbench-lab",
                "--slurm-qos",
                "normal",
                "--slurm-constraint",
                "cpu",
                "--slurm-time",
                "1:00:00",
                "--slurm-cpus",
                "1",
                "--slurm-mem",
                "1G",
                "--slurm-setup",
                f"source {venv}/bin/activate",
                "--slurm-setup",
                "export FOO=1",
                "--slurm-extra=--mail-type=NONE",
                "--slurm-parallel",
                "2",
            ]
        )
        == 0
    )
    text = script.read_text()
    for line in (
        "--partition=debug",
        "--account=depthbench-lab",
        "--qos=normal",
        "--constraint=cpu",
        "--time=1:00:00",
        "--cpus-per-task=1",
        "--mem=1G",
        "--mail-type=NONE",
        "--array=0-0%2",
    ):
        assert f"#SBATCH {line}\n" in text, line
    assert "--gres" not in text  # --slurm-gpus 0: a CPU cluster
    assert text.index(f"source {venv}/bin/activate") < text.index("export FOO=1") < text.index("set -euo pipefail")
    assert f"export DEPTHBENCH_RUNS={cluster.runs}\n" in text and f"{venv}/bin/depthbench-nb sweep run {study} " in text
    test = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "to start at" in test.stderr, test.stderr
    assert study_jobs("checks") == []


def test_submit_without_sbatch_or_controller_keeps_the_script(
    cluster, dead_conf, tiny_data, tmp_path, monkeypatch, capsys
):
    from depthbench_nb.cli import main

    study = write_study(tmp_path / "keep.yaml", "keep", tiny_data, ["preln"], 2)
    script = cluster.runs / "keep" / ".sweep" / "slurm_keep.sh"
    cmd = ["sweep", "run", str(study), "--launcher", "slurm", "--submit", "--slurm-gpus", "0"]
    monkeypatch.setenv("SLURM_CONF", str(dead_conf))  # the controller is down
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "controller (slurmctld) does not answer" in err and "is DOWN" in err and f"sbatch {script}" in err
    assert script.exists() and "RUN_IDS=(" in script.read_text()
    script.unlink()
    monkeypatch.setenv("PATH", str(tmp_path / "no-slurm-here"))  # no Slurm programs at all
    assert main(cmd) == 2
    err = capsys.readouterr().err
    assert "needs Slurm's sbatch, which is not on PATH" in err and f"sbatch {script}" in err and script.exists()
    assert study_jobs("keep") == []


# ------------------------------------------------------------------------------------------------ 6: two nodes
SRUN_AS_NODES = """#!/bin/bash
# Test double of an N-node job step on the one-node test cluster: the real srun runs N tasks on this node, and each
# gets the environment a node of an N-node step sees (SLURM_NNODES=N, SLURM_NODEID = its rank).
n=1; opts=()
while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
  case "$1" in
    --nodes=*) n="${1#--nodes=}"; opts+=(--nodes=1);;
    --ntasks-per-node=*) opts+=("--ntasks-per-node=$n");;
    *) opts+=("$1");;
  esac
  shift
done
exec REAL_SRUN "${opts[@]}" bash -c 'export SLURM_NNODES='"$n"' SLURM_NODEID=$SLURM_PROCID; exec "$@"' node "$@"
"""


def test_two_node_run_matches_one_process(cluster, dead_conf, tiny_data, tmp_path, capsys):
    """`--nodes 2`: the script asks for two nodes and its task runs one launcher per node through srun; on the one-node
    cluster the two nodes are two CPU processes given the environment two nodes would see. Loss = one process's."""
    from depthbench_nb.cli import main

    study = write_study(tmp_path / "twonode.yaml", "twonode", tiny_data, ["preln"], 10)
    (entry,) = expand_study(load_study(study))
    # the single-process reference: the same run in another runs folder, trained meanwhile
    reference = subprocess.Popen(
        DRIVER + ["sweep", "run", str(study), "--executor", "python", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, DEPTHBENCH_RUNS=str(tmp_path / "one")),
    )
    single = tmp_path / "one" / "twonode" / entry.run_id
    cmd = ["sweep", "run", str(study), "--launcher", "slurm", "--nodes", "2", "--slurm-gpus", "0"]
    assert main(cmd) == 2 and "1 node(s) can take a task" in capsys.readouterr().err  # this cluster has one node
    os.environ["SLURM_CONF"] = str(dead_conf)  # written as on a login node that cannot reach the controller
    try:
        assert main(cmd) == 0
    finally:
        os.environ["SLURM_CONF"] = str(cluster.conf)
    script = cluster.runs / "twonode" / ".sweep" / "slurm_twonode.sh"
    text = script.read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n" in text and "--gres" not in text
    assert "--executor python --no-progress --nodes 2 --procs-per-node 1" in text
    shim = tmp_path / "bin" / "srun"
    shim.parent.mkdir()
    shim.write_text(SRUN_AS_NODES.replace("REAL_SRUN", shutil.which("srun")))
    shim.chmod(0o755)
    env = dict(os.environ, PATH=f"{shim.parent}{os.pathsep}{os.environ['PATH']}", DEPTHBENCH_MAIN_PORT=str(free_port()))
    # one node with two task slots stands in for two nodes (command-line options override the script's #SBATCH lines)
    # (and the time the partition allows: the unchecked script asks for the 24-hour default, over this partition's
    # limit)
    sub = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            "--cpus-per-task=1",
            "--mem=4G",
            "--time=30:00",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sub.returncode == 0, sub.stderr
    job = sub.stdout.strip().split(";")[0]
    folder = cluster.runs / "twonode" / entry.run_id

    def logs():
        return "\n".join(
            p.read_text()[-3000:]
            for p in sorted((cluster.runs / "twonode").rglob("*.log"))
            + sorted((cluster.runs / "twonode" / "logs").glob("*.out"))
        )

    try:
        wait_for(lambda: job_done(job), 300, "the two-node task to finish")
        assert reference.wait(timeout=600) == 0, reference.stderr.read()[-2000:]
    except AssertionError as e:
        raise AssertionError(f"{e}\n{logs()}") from None
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    assert read_result(single)["world_size"] == 1
    res = read_result(folder)
    log = (cluster.runs / "twonode" / ".sweep" / "logs" / f"{entry.run_id}.log").read_text()
    assert res is not None and res["status"] == "completed", log[-3000:]
    assert res["world_size"] == 2 and res["ranks_in_sync"] is True and res["provenance"]["slurm"]["nnodes"] == "2"
    host = subprocess.run(
        ["scontrol", "show", "hostnames", cluster.node["NodeName"]], capture_output=True, text=True
    ).stdout.split()[0]
    try:
        socket.getaddrinfo(host, None)
    except OSError:
        host = "127.0.0.1"  # a node name that does not resolve: the NodeAddr Slurm knows
    for rank in (0, 1):  # each node's launcher: machine rank from SLURM_NODEID, host from the list
        assert (
            f"node {rank}/2 " in log
            and f"--num_machines 2 --machine_rank {rank} --main_process_ip {host} "
            f"--main_process_port {env['DEPTHBENCH_MAIN_PORT']}"
            in log
        )
    one, two = read_metrics(single), read_metrics(folder)
    assert [r["step"] for r in two] == list(range(10))
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]), (a["step"], a["loss"], b["loss"])
    want = read_result(single)["final_val_loss"]
    assert abs(res["final_val_loss"] - want) <= 1e-5 * want


# ------------------------------------------------------------------------------------------------ 7: data preparation
def test_data_prepare_as_a_job_array(cluster, tiny_data, tmp_path):
    """A four-file parquet source prepared with `data prepare --launcher slurm --submit`: a two-task array (one CPU,
    one worker each) tokenizes the source shards, the packing job after it writes the manifest; the folder holds the
    streams of a local one-worker preparation, checksum for checksum. Submitting again queues nothing."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from depthbench_nb.data import TokenData, _kjv_chapters, prepare

    chapters = list(_kjv_chapters())[:400]
    for i in range(4):  # four files: four source shards
        part = chapters[i * 100 : (i + 1) * 100]
        (tmp_path / "src").mkdir(exist_ok=True)
        pq.write_table(
            pa.table(dict(text=part, id=[f"{i}-{j}" for j in range(len(part))])), tmp_path / "src" / f"{i:03d}.parquet"
        )
    out, tokenizer = tmp_path / "data", str(tiny_data / "tokenizer.json")
    args = ["data", "prepare", "--source", tmp_path / "src", "--tokenizer", tokenizer, "--out", out]
    res = cli(*args, "--launcher", "slurm", "--submit", "--tasks", "2", "--slurm-cpus", "1", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    sub = json.loads(res.stdout)
    job, final = sub["job_id"], sub["final_job_id"]
    assert sub["submitted"] and (sub["tasks"], sub["source_shards"], sub["done"]) == (2, 4, 0)
    array = Path(sub["script"]).read_text()
    assert (
        "#SBATCH --array=0-1" in array
        and "--cpus-per-task=1" in array
        and "--gres" not in array
        and "--no-pack" in array
    )
    assert f"#SBATCH --dependency=afterany:{job}" in Path(sub["final_script"]).read_text()
    wait_for(lambda: job_done(job) and job_done(final), 600, "the array and the packing job to finish", every=1.0)
    states = {r[0]: r[3] for r in squeue() if r[1] in (job, final)}
    assert set(states.values()) == {"COMPLETED"}, states

    td = TokenData(out, verify=True)  # complete, every checksum checked
    done_by = {json.loads(p.read_text())["slurm"] for p in (out / "shards").glob("*/shard.json")}
    assert (
        done_by <= {f"{job}_0", f"{job}_1"} and len(list((out / "shards").glob("*/shard.json"))) == 4
    )  # the array did them
    pack_log = (out / "slurm" / f"slurm-{final}-pack.out").read_text()
    assert "kept 4 of 4 source shards already tokenized" in pack_log, pack_log[-2000:]
    local = prepare(
        DataConfig(source=str(tmp_path / "src"), tokenizer=tokenizer, path=str(tmp_path / "local")), progress=False
    )
    want = json.loads((local / "manifest.json").read_text())
    assert td.manifest["splits"] == want["splits"] and td.manifest["source_shards"] == want["source_shards"]

    again = cli(*args, "--launcher", "slurm", "--submit", "--slurm-cpus", "1")
    assert again.returncode == 0 and "nothing to submit" in again.stdout and "prepared already" in again.stdout


# ------------------------------------------------------------------------------------------------ without a cluster
def test_script_without_a_reachable_cluster(tiny_data, tmp_path, runs_dir, monkeypatch, capsys):
    """No Slurm reachable (a laptop, a login node with the controller down): the script is written with unchecked
    defaults."""
    bash = shutil.which("bash")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no Slurm programs
    monkeypatch.delenv("SLURM_CONF", raising=False)
    study = write_study(tmp_path / "s.yaml", "slurmy", tiny_data, ["preln", "hc"], 2)
    spec = load_study(study)
    from depthbench_nb.slurm import SlurmRequest

    out = _write_slurm_script(
        spec,
        study_ref=str(study),
        request=SlurmRequest(gpus=2, time="02:00:00", partition="gpu", parallel=2, extra=("--mail-type=END",)),
    )
    text = Path(out["script"]).read_text()
    assert out["to_submit"] == 2 and not out["submitted"] and os.access(out["script"], os.X_OK)
    assert any("not checked against the cluster" in n for n in out["notes"])
    for line in (
        "--array=0-1%2",
        "--gres=gpu:2",
        "--cpus-per-task=8",
        "--time=02:00:00",
        "--partition=gpu",
        "--mail-type=END",
    ):
        assert f"#SBATCH {line}\n" in text, line
    assert "--mem" not in text  # the cluster's default memory
    assert (
        f"#SBATCH --output={runs_dir}/slurmy/logs/slurm-%A_%a.out" in text and (runs_dir / "slurmy" / "logs").is_dir()
    )
    assert text.strip().splitlines()[-1].startswith("exec ")  # the driver is the batch shell (B:USR1)
    cli_path = text.strip().splitlines()[-1].split()[1]
    assert Path(cli_path).is_absolute() and os.access(cli_path, os.X_OK)  # the task finds this environment's CLI
    assert (
        f'sweep run {study} --run-id "$RUN_ID" --executor papermill --no-progress --nodes 1 --procs-per-node 2' in text
    )
    ids = [e.run_id for e in expand_study(spec)]
    assert "RUN_IDS=(" + " ".join(ids) + ")" in text and f"export DEPTHBENCH_RUNS={runs_dir}\n" in text
    assert subprocess.run([bash, "-n", out["script"]]).returncode == 0
    with pytest.raises(ConfigError, match="needs Slurm's sbatch"):
        _write_slurm_script(spec, submit=True, study_ref=str(study), request=SlurmRequest(gpus=0))
    from depthbench_nb.cli import main

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert main(["sweep", "run", str(study), "--nodes", "2", "--run-id", ids[0]]) == 2  # many nodes need an allocation
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(expand_study(spec)[0].run.to_dict()))
    for k in ("SLURM_NNODES", "SLURM_NODEID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(k, raising=False)
    assert main(["slurm", "node-launch", "--run-config", str(cfg)]) == 2  # a launcher outside a job step
    assert (
        "runs inside a Slurm job step (srun); missing SLURM_NNODES, SLURM_NODEID, SLURM_JOB_ID"
        in capsys.readouterr().err
    )


# ------------------------------------------------------------------------ 7: the time-limit warning and requeue
PAUSE_HOOK = r"""
import os
if os.environ.get('DEPTHBENCH_TEST_PAUSE'):
    import time
    from pathlib import Path
    import depthbench_nb.runs as _R
    _mark, _pause = Path(os.environ['DEPTHBENCH_TEST_MARK']), int(os.environ['DEPTHBENCH_TEST_PAUSE'])
    _append = _R.MetricsLog.append
    def _paused_append(self, row):
        _append(self, row)
        if row.get('step') == _pause and not (_mark / 'paused').exists():
            (_mark / 'paused').write_text(str(os.getpid())); time.sleep(4)
    _R.MetricsLog.append = _paused_append
"""


def test_a_task_warned_before_its_time_limit_checkpoints_requeues_and_completes(
    cluster, tiny_data, tmp_path, monkeypatch, capsys
):
    """The array script asks Slurm for SIGUSR1 before the time limit (--signal=B:USR1@300) and allows requeueing; that
    signal, sent to the task's batch shell mid-run (`scancel --signal=USR1 --batch`, as Slurm does), reaches the
    driver (exec'd as the shell), which passes it on: the run checkpoints at that step (the run's own cadence would
    checkpoint only at its end), the driver records it and requeues the task (scontrol requeue). Slurm starts the task
    again; it resumes there and completes with every step once and the metrics of an uninterrupted run."""
    from depthbench_nb.cli import main

    steps = 24
    study = write_study(tmp_path / "requeue.yaml", "requeue", tiny_data, ["preln"], steps)
    (entry,) = expand_study(load_study(study))
    folder = cluster.runs / "requeue" / entry.run_id
    ref_env = dict(os.environ, DEPTHBENCH_RUNS=str(tmp_path / "reference"))
    reference = subprocess.Popen(
        DRIVER + ["sweep", "run", str(study), "--executor", "python", "--json"],
        env=ref_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    hook, mark = tmp_path / "hook", tmp_path / "mark"
    hook.mkdir()
    mark.mkdir()
    (hook / "sitecustomize.py").write_text(PAUSE_HOOK)
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join([str(hook)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
    )
    monkeypatch.setenv("DEPTHBENCH_TEST_PAUSE", "6")
    monkeypatch.setenv("DEPTHBENCH_TEST_MARK", str(mark))
    try:
        assert (
            main(
                [
                    "sweep",
                    "run",
                    str(study),
                    "--launcher",
                    "slurm",
                    "--submit",
                    "--slurm-gpus",
                    "0",
                    "--executor",
                    "python",
                    "--json",
                ]
            )
            == 0
        )  # sbatch exports this environment to the task
        out = json.loads(capsys.readouterr().out)
        job = out["job_id"]
        script = Path(out["script"]).read_text()
        assert "#SBATCH --signal=B:USR1@300\n#SBATCH --requeue\n" in script and " --requeue\n" in script
        wait_for(lambda: (mark / "paused").exists(), 300, "the task to reach step 6")
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True, timeout=60)  # Slurm's warning
        slurm_log = cluster.runs / "requeue" / "logs" / f"slurm-{job}_0.out"
        wait_for(lambda: (read_result(folder) or {}).get("status") == "completed", 600, "the requeued task to complete")
        wait_for(lambda: job_done(job), 120, "the task to leave the queue")
        assert reference.wait(timeout=600) == 0, reference.stderr.read()[-2000:]
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.wait()
    log = (cluster.runs / "requeue" / ".sweep" / "logs" / f"{entry.run_id}.log").read_text()
    assert "interrupted by SIGUSR1 at step 7 of 24: checkpoint step_00000007 written" in log, log[-3000:]
    assert "resuming from checkpoint step 7" in log  # at the signal's step, not from 0
    task_log = slurm_log.read_text()
    assert f"job {job}" in task_log and "requeued" in task_log and "(restart 1)" in task_log, task_log[-3000:]
    result = read_result(folder)
    assert result["provenance"]["slurm"]["restart_count"] == "1" and result["steps"] == steps
    got = read_metrics(folder)
    want = read_metrics(tmp_path / "reference" / "requeue" / entry.run_id)
    assert [r["step"] for r in got] == list(range(steps))  # every step once
    for key in ("loss", "grad_norm", "lr", "tokens"):
        assert [r[key] for r in got] == [r[key] for r in want], key
    history = json.loads((cluster.runs / "requeue" / ".sweep" / "attempts" / f"{entry.run_id}.json").read_text())[
        "history"
    ]
    assert [h["status"] for h in history] == ["interrupted", "completed"]
