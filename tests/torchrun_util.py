"""Run a function on N CPU processes under torchrun (gloo) and collect each rank's result.

Why: TP/PP/DP equivalence tests need real multi-process megatron runs, isolated from the
pytest process (global patches, process groups). Usage from a test:

    from torchrun_util import run_function
    res = run_function("tests/test_x.py:worker", nproc=2, kwargs={"tp": 2}, timeout=120)
    res.check()                      # raises with the captured output if any rank failed
    res.results[0]                   # what worker() returned on rank 0 (JSON round-trip)

The worker is `def worker(**kwargs) -> JSON-serializable`. Before calling it this runner
initializes a gloo process group (unless init_gloo=False), and destroys it afterwards. It
does not apply `patches.apply_cpu()`: workers call it themselves, so a test can run with a
shim left out. Each rank's return value is written to a JSON file and read back here.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from megatron_biglm.common.process_groups import free_port  # noqa: F401  (tests import it from here too)

REPO_ROOT = Path(__file__).resolve().parents[1]
_RESULT_DIR_ENV = "TORCHRUN_UTIL_RESULT_DIR"


class TorchrunFailed(AssertionError):
    """A torchrun job exited non-zero, timed out, or a rank wrote no result."""


@dataclass
class TorchrunResult:
    returncode: int
    output: str  # stdout and stderr of torchrun and all ranks, interleaved
    timed_out: bool
    results: Dict[int, Any] = field(default_factory=dict)  # rank -> worker's return value
    nproc: int = 0

    def check(self) -> "TorchrunResult":
        """Raise TorchrunFailed (with the output tail) unless every rank succeeded."""
        missing = [r for r in range(self.nproc) if r not in self.results]
        if self.timed_out or self.returncode != 0 or missing:
            why = "timed out" if self.timed_out else f"exit code {self.returncode}"
            raise TorchrunFailed(
                f"torchrun {why}; ranks without a result: {missing}\n"
                f"--- output (last 6000 chars) ---\n{self.output[-6000:]}"
            )
        return self


def run_function(
    target: str,
    nproc: int,
    kwargs: Optional[dict] = None,
    timeout: float = 180.0,
    init_gloo: bool = True,
    env: Optional[Dict[str, str]] = None,
    result_dir: Optional[Path] = None,
) -> TorchrunResult:
    """Run `target` ("path/to/file.py:func" or "package.module:func") on `nproc` ranks.

    Paths are relative to the repo root. The job is killed (whole process group) after
    `timeout` seconds. Returns a TorchrunResult; call `.check()` to require success.
    """
    if ":" not in target:
        raise ValueError(f"target must be 'file.py:function' or 'module:function', got {target!r}")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="torchrun_util_") as tmp:
        out_dir = Path(result_dir) if result_dir is not None else Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-m", "torch.distributed.run",
            "--nnodes", "1", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
            str(Path(__file__).resolve()),
            "--target", target, "--kwargs", json.dumps(kwargs or {}),
        ]
        if not init_gloo:
            cmd.append("--no-init")
        run_env = _worker_env(out_dir, env)
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=run_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(proc.pid)
            output, _ = proc.communicate()
        results = {}
        for rank in range(nproc):
            path = out_dir / f"rank{rank}.json"
            if path.exists():
                results[rank] = json.loads(path.read_text())
        return TorchrunResult(proc.returncode, output, timed_out, results, nproc)


def _kill_tree(pid: int) -> None:
    """SIGKILL torchrun and every rank it started, by pid.

    The ranks run in their own sessions (torch elastic starts them so), so killing
    torchrun's process group would orphan them holding our stdout pipe; collect the
    descendants while the tree is intact, then kill each."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for process in tree:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=30)


def _worker_env(out_dir: Path, extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    env[_RESULT_DIR_ENV] = str(out_dir)
    env["OMP_NUM_THREADS"] = env.get("TORCHRUN_UTIL_THREADS", "1")  # 2 cores, many ranks
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), str(REPO_ROOT / "tests")] + env.get("PYTHONPATH", "").split(os.pathsep)
    ).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def _load_target(target: str):
    module_ref, func_name = target.rsplit(":", 1)
    if module_ref.endswith(".py"):
        import importlib.util

        path = (REPO_ROOT / module_ref).resolve()
        spec = importlib.util.spec_from_file_location(f"_torchrun_target_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    else:
        import importlib

        module = importlib.import_module(module_ref)
    return getattr(module, func_name)


def _worker_main(argv: Sequence[str]) -> int:
    """Entry point inside each torchrun rank."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--no-init", action="store_true")
    args = parser.parse_args(argv)

    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if not args.no_init:
        dist.init_process_group("gloo")
    try:
        result = _load_target(args.target)(**json.loads(args.kwargs))
        out = Path(os.environ[_RESULT_DIR_ENV]) / f"rank{rank}.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result))
        tmp.replace(out)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
