"""A real one-node Slurm on this machine, for the cluster tests (tests/test_slurm.py) and for trying the Slurm
route by hand.

Built from Debian's packages (`slurmctld`, `slurmd`, `slurm-client`, `munge`; `.ci/run` installs them when they
are missing). Everything lives in one folder: a `slurm.conf` for this host (all its CPUs and memory as `slurmd -C`
reports them, one partition, `SlurmUser=root`, free ports for slurmctld and slurmd), the controller's state,
slurmd's spool, the logs, and a private munge daemon with its own key (created when missing) and socket. Nothing
under /etc is read or written: clients find the cluster through `SLURM_CONF` (see `env`).

    with SlurmCluster(tmp_folder) as cluster:      # munged, slurmctld, slurmd; returns once `sinfo` says idle
        subprocess.run(['sbatch', 'job.sh'], env=cluster.env)
    # on exit: every job is cancelled, then exactly the three daemons it started are stopped, by their pids

By hand: `python tests/slurm_cluster.py [FOLDER]` starts one and prints the `export SLURM_CONF=...` line; Ctrl-C
stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "sinfo", "squeue", "scontrol", "scancel", "srun")


def missing_tools() -> list[str]:
    "The Slurm and munge programs this harness needs that are not installed (daemons live in /usr/sbin)."
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [t for t in DAEMONS + CLIENTS if shutil.which(t, path=path) is None]


def why_not_available() -> str | None:
    "None when a cluster can be started here, else the reason (for a skip, or a failure in CI)."
    missing = missing_tools()
    if missing:
        return (
            f"Slurm is not installed (missing: {', '.join(missing)}); install it with "
            "`apt-get install -y slurmctld slurmd slurm-client munge` (.ci/run does)"
        )
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root (SlurmUser=root, SlurmdUser=root); run the tests as root"
    return None


def free_port() -> int:
    "A TCP port nobody listens on now (bind port 0 and ask the kernel)."
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def node_line() -> dict:
    "This host as slurmd sees it (`slurmd -C`): NodeName, CPUs, sockets, cores, threads, RealMemory."
    out = subprocess.run([_sbin("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    first = next(line for line in out.splitlines() if line.startswith("NodeName="))
    return dict(item.split("=", 1) for item in first.split())


class SlurmCluster:
    "A one-node Slurm in `root` (a folder it owns); `start()` / `stop()` or use it as a context manager."

    def __init__(
        self,
        root,
        partition: str = "debug",
        max_time: str = "INFINITE",
        features: tuple = (),
        start_timeout: float = 60.0,
    ):
        self.root = Path(root).resolve()
        self.partition, self.max_time, self.features = partition, max_time, tuple(features)
        self.start_timeout = start_timeout
        self.procs: dict[str, subprocess.Popen] = {}
        self.node: dict = {}
        self.ctld_port = self.slurmd_port = None

    # -------------------------------------------------------------------------------- configuration
    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict:
        "The environment of a client of this cluster (sbatch, sinfo, ... find it through SLURM_CONF)."
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def write_conf(self) -> Path:
        node = self.node = node_line()
        for d in ("state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        host = node["NodeName"]
        shape = " ".join(
            f"{k}={node[k]}"
            for k in ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
            if k in node
        )
        feature = f" Features={','.join(self.features)}" if self.features else ""
        r = self.root
        self.conf.write_text(
            "\n".join(
                [
                    "# written by tests/slurm_cluster.py: a one-node test cluster, everything under this folder",
                    "ClusterName=depthbench-test",
                    f"SlurmctldHost={host}(127.0.0.1)",
                    f"SlurmctldPort={self.ctld_port}",
                    f"SlurmdPort={self.slurmd_port}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    # no cgroups in a container or on CI: track processes by parentage, bind nothing
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "JobAcctGatherType=jobacct_gather/none",
                    # no slurmdbd: sacct has no data on this cluster (squeue and the run records are read instead)
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    # CPUs and memory are consumable, as on most real clusters: a task gets what it asks for
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU_Memory",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=5",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SlurmctldTimeout=30",
                    "SlurmdTimeout=30",
                    "InactiveLimit=0",
                    "KillWait=5",
                    "MinJobAge=600",
                    "Waittime=0",
                    f"NodeName={host} NodeAddr=127.0.0.1 {shape}{feature} State=UNKNOWN",
                    f"PartitionName={self.partition} Nodes={host} Default=YES MaxTime={self.max_time} State=UP",
                    "",
                ]
            )
        )
        return self.conf

    def _munge_key(self) -> Path:
        "The private munge key; created (1 KiB of random bytes, mode 0400) when missing."
        d = self.root / "munge"
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o711)  # munged checks: no group/other write; clients need to reach the socket
        key = d / "munge.key"
        if not key.exists():
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
            try:
                os.write(fd, os.urandom(1024))
            finally:
                os.close(fd)
        return key

    # -------------------------------------------------------------------------------- life cycle
    def start(self) -> "SlurmCluster":
        why = why_not_available()
        if why:
            raise RuntimeError(why)
        self.root.mkdir(parents=True, exist_ok=True)
        key = self._munge_key()
        self.write_conf()

        def log(name):
            return open(self.root / "log" / f"{name}.stdout", "ab")

        m = self.root / "munge"
        try:
            # all three in the foreground (-F / -D), so the pids are ours: stop() signals exactly these
            self._spawn(
                "munged",
                [
                    _sbin("munged"),
                    "-F",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={self.munge_socket}",
                    f"--pid-file={m / 'munged.pid'}",
                    f"--log-file={m / 'munged.log'}",
                    f"--seed-file={m / 'munged.seed'}",
                ],
                log("munged"),
            )
            self._wait(lambda: self.munge_socket.exists(), "munged to create its socket", "munge/munged.log")
            self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-f", str(self.conf)], log("slurmctld"))
            self._wait(self._controller_up, "slurmctld to answer `scontrol ping`", "log/slurmctld.log")
            self._spawn("slurmd", [_sbin("slurmd"), "-D", "-f", str(self.conf)], log("slurmd"))
            self._wait(
                lambda: self.node_state() == "idle",
                f"`sinfo` to show node {self.node['NodeName']} idle",
                "log/slurmd.log",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, cmd: list[str], out) -> None:
        env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.procs[name] = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )  # not in the test's process group
        out.close()

    def _wait(self, ready, what: str, logfile: str) -> None:
        deadline = time.time() + self.start_timeout
        while time.time() < deadline:
            if ready():
                return
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                break
            time.sleep(0.1)
        tail = ""
        p = self.root / logfile
        if p.exists():
            tail = "\n".join(p.read_text(errors="replace").splitlines()[-15:])
        dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        raise RuntimeError(
            f"test Slurm: timed out waiting for {what}"
            + (f" (exited: {dead})" if dead else "")
            + f"; last lines of {p}:\n{tail}"
        )

    def _controller_up(self) -> bool:
        r = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, env=self.env, timeout=30)
        return " is UP" in r.stdout

    def node_state(self) -> str:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, env=self.env, timeout=30)
        return r.stdout.strip()

    def jobs(self) -> list[str]:
        "Ids of the jobs the controller knows that are not finished."
        r = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=self.env, timeout=30)
        return r.stdout.split()

    def stop(self, timeout: float = 30.0) -> None:
        "Cancel every job (so no job process outlives the cluster), then stop the daemons this object started."
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            try:
                subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=30)
                deadline = time.time() + timeout
                while self.jobs() and time.time() < deadline:
                    time.sleep(0.2)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):  # the reverse of the start order
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    import tempfile

    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="slurm-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops the cluster too (the with block exits)
    t0 = time.time()
    with SlurmCluster(folder) as c:
        print(
            f"one-node Slurm up in {time.time() - t0:.1f} s (node {c.node['NodeName']}, {c.node.get('CPUs')} CPUs, "
            f"{c.node.get('RealMemory')} MB, partition {c.partition})\n  export SLURM_CONF={c.conf}\nCtrl-C stops it."
        )
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
        print("stopping")
