"""A SLURM cluster on this host (tests/slurm/cluster.sh) and what the launch tests do with it:
submit a script of launch/ with sbatch as a user would, signal or cancel it with scancel, wait
for its end state, and read its log.

`slurm` starts the cluster unless one answers already, and stops it at the end of the session
only if it started it. Where SLURM cannot start (no root to install or run the daemons, no
apt-get, a daemon that fails) the tests skip with the script's reason; with
BIGLM_REQUIRE_SLURM=1 (CI, stack a) that is a failure instead. End states come from the
cluster's jobcomp log, which keeps every job's end after MinJobAge has dropped it from squeue.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
END_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
              "BOOT_FAIL", "DEADLINE"}
JOB_TIMEOUT_S = 600


def require_slurm() -> bool:
    return os.environ.get("BIGLM_REQUIRE_SLURM") == "1"


def _unavailable(reason: str):
    if require_slurm():
        pytest.fail(f"BIGLM_REQUIRE_SLURM=1 but the SLURM test cluster is unavailable: {reason}")
    pytest.skip(f"no SLURM test cluster: {reason}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JobEnd:
    """A job's records in the jobcomp log, oldest first (a requeued job has one per run)."""
    job_id: str
    records: list = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.records[-1]["JobState"]

    @property
    def states(self) -> list:
        return [r["JobState"] for r in self.records]


@dataclass
class Cluster:
    conf: Path
    folder: Path
    nodes: list

    def env(self, **extra) -> dict:
        """The environment a user submits from: this python and this checkout, no SLURM job of
        the caller's, no thread count of the caller's (the launch scripts set it)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "PYTEST_")) and k != "OMP_NUM_THREADS"}
        env.update(SLURM_CONF=str(self.conf), PYTHON=sys.executable, HF_HUB_OFFLINE="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def sbatch(self, script: str, options: list, env: dict, args: list = ()) -> str:
        """`sbatch OPTIONS launch/SCRIPT ARGS` from the repository root; the job id."""
        proc = subprocess.run(["sbatch", "--parsable", *options, f"launch/{script}", *args], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"sbatch launch/{script} failed: {proc.stderr}"
        return proc.stdout.strip().split(";")[0]

    def scancel(self, *args: str) -> None:
        proc = subprocess.run(["scancel", *args], env=self.env(), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"scancel {' '.join(args)}: {proc.stderr}"

    def queued(self, job_id: str) -> bool:
        proc = subprocess.run(["squeue", "-h", "-j", job_id], env=self.env(), capture_output=True, text=True,
                              timeout=60)
        return bool(proc.stdout.strip())

    def records(self, **match) -> list:
        """The jobcomp records whose fields have these values (JobId=..., or ArrayJobId=... and
        ArrayTaskId=...), oldest first."""
        path = self.folder / "jobcomp.log"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [dict(re.findall(r"(\w+)=(\S*)", line)) for line in lines]
        return [r for r in records if all(r.get(k) == str(v) for k, v in match.items())]

    def wait(self, job_id: str, log: Path | None = None, timeout: float = JOB_TIMEOUT_S) -> JobEnd:
        """Wait until the job has left the queue in an end state (a requeue is not one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = self.records(JobId=job_id)
            if records and records[-1].get("JobState") in END_STATES and not self.queued(job_id):
                return JobEnd(job_id, records)
            time.sleep(1)
        where = subprocess.run(["scontrol", "show", "job", job_id], env=self.env(), capture_output=True,
                               text=True, timeout=60).stdout
        self.scancel(job_id)
        tail = log.read_text()[-4000:] if log is not None and log.exists() else "(no log)"
        raise AssertionError(f"job {job_id} did not end within {timeout} s:\n{where}\nits log ends:\n{tail}")

    def job_processes(self, job_id: str, **env) -> list:
        """The pids on this host whose environment names this job (and the given variables)."""
        want = {f"SLURM_JOB_ID={job_id}".encode(), *(f"{k}={v}".encode() for k, v in env.items())}
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                variables = set((proc / "environ").read_bytes().split(b"\0"))
            except OSError:
                continue
            if want <= variables:
                pids.append(int(proc.name))
        return pids

    def array_task_end(self, array: str, task: int) -> str:
        """The end state of one task of a job array."""
        def ended():
            records = self.records(ArrayJobId=array, ArrayTaskId=task)
            return records[-1]["JobState"] if records and records[-1]["JobState"] in END_STATES else None

        return wait_for(ended, f"array task {array}_{task} to end")


def trainer_pid(cluster: Cluster, job_id: str, rank: int) -> int:
    """The pid of the job's training process of this global rank (not torchrun, not the step)."""
    for pid in cluster.job_processes(job_id, RANK=rank):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"megatron_biglm.cli.train" in argv and b"torch.distributed.run" not in argv:
            return pid
    raise AssertionError(f"job {job_id} has no training process of rank {rank}")


def signal_spec(script: str) -> tuple[str, bool]:
    """The signal a script's `#SBATCH --signal=[B:]SIG@TIME` line asks for, and whether SLURM
    sends it to the batch shell only (B:) rather than to the job steps."""
    text = (REPO / "launch" / script).read_text()
    match = re.search(r"^#SBATCH --signal=(B:)?(\w+)@\d+\s*$", text, re.M)
    assert match, f"launch/{script} has no #SBATCH --signal line"
    return match.group(2), bool(match.group(1))


def wait_for(predicate, what: str, timeout: float = JOB_TIMEOUT_S, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.fixture(scope="session")
def slurm():
    """The test cluster: started here (and stopped at the end) unless one answers already."""
    if sys.platform != "linux":
        _unavailable("SLURM runs on Linux only")
    folder = Path(os.environ.get("BIGLM_SLURM_DIR", "/tmp/biglm-slurm"))
    status = subprocess.run(["bash", str(CLUSTER_SH), "status"], capture_output=True, text=True)
    started = status.returncode != 0
    if started:
        try:
            up = subprocess.run(["bash", str(CLUSTER_SH), "up"], capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            _unavailable("tests/slurm/cluster.sh up took more than 900 s")
        if up.returncode != 0:
            _unavailable(up.stderr.strip().splitlines()[-1] if up.stderr.strip() else f"exit {up.returncode}")
    nodes = (folder / "nodes").read_text().split()
    yield Cluster(folder / "slurm.conf", folder, nodes)
    if started:
        subprocess.run(["bash", str(CLUSTER_SH), "down"], capture_output=True, text=True, timeout=300)
