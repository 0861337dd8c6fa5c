"""What the Slurm tests (tests/test_slurm.py) cost, measured so that a busy shared machine does not distort it.

Wall time on a machine where other work runs says little; CPU time does not depend on the load. Each test runs in its
own pytest process under a child subreaper (prctl PR_SET_CHILD_SUBREAPER): the Slurm daemons' job processes
(slurmstepd and everything an array task starts) are orphans re-parented to this script, reaped by it, and counted.
A baseline measured in the same run gives the ratio: the local papermill sweep test of tests/test_sweep.py (two tiny
runs through the same driver, no Slurm).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_slurm_tests.py

Every test is sequential work (one process at a time, but for the reference runs and the two simulated nodes), so on
an idle machine its wall time is close to its CPU time; the sum over 2 pytest workers is about half the total.
"""

import ctypes
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = {
    "study as a job array (1, 2, 4)": "tests/test_slurm.py::test_three_run_study_as_a_job_array",
    "scancel and resume (3)": "tests/test_slurm.py::test_cancelled_task_resumes_from_its_checkpoint",
    "two nodes (6)": "tests/test_slurm.py::test_two_node_run_matches_one_process",
    "requests, bad input, no cluster (5)": 'tests/test_slurm.py -k "sinfo or controller or reachable"',
}
BASELINE = (
    "baseline: local papermill sweep, 2 runs",
    "tests/test_sweep.py::test_papermill_executor_and_looped_fit_table",
)


def measured(target: str) -> tuple[float, float, int]:
    "(wall s, CPU s of the pytest process and every descendant, exit code)."
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    p = subprocess.Popen(
        f"{sys.executable} -m pytest -q -p no:cacheprovider {target}",
        shell=True,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rc = p.wait()
    while True:  # orphans of the Slurm daemons come back to us: reap them all
        try:
            os.wait()
        except ChildProcessError:
            break
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return time.time() - t0, cpu, rc


def main() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        print("prctl(PR_SET_CHILD_SUBREAPER) failed: CPU of the daemons' orphans would be lost", file=sys.stderr)
        return 1
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    name, target = BASELINE
    base_wall, base_cpu, rc = measured(target)
    print(f"{name:42s} wall {base_wall:6.1f} s  cpu {base_cpu:6.1f} s  rc {rc}")
    total = 0.0
    for name, target in TESTS.items():
        wall, cpu, rc = measured(target)
        total += cpu
        print(f"{name:42s} wall {wall:6.1f} s  cpu {cpu:6.1f} s  rc {rc}  cpu / baseline {cpu / base_cpu:4.2f}")
    print(
        f"{'all Slurm tests':42s} cpu {total:6.1f} s = {total / base_cpu:.2f} x the baseline; on 2 idle cores about "
        f"{total / 2:.0f} s of wall (each pytest process above also pays its start-up and data preparation once)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
