"""Where training numbers go: `{run_dir}/metrics.jsonl`, TensorBoard, W&B, and the console.

One JSON object per log interval (and per validation) is the durable record: plots,
tests and resumption all read it. TensorBoard is on by default when installed (off with a
note when not); W&B only when asked. The console shows a tqdm bar in an interactive
terminal and plain log lines under SLURM or when output is redirected, so batch logs stay
greppable. Only rank 0 writes.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

from tqdm.auto import tqdm


def interactive(mode: str = "auto") -> bool:
    if mode == "plain":
        return False
    if mode in ("tqdm", "rich"):
        return True
    under_slurm = "SLURM_JOB_ID" in os.environ and "SLURM_PTY_PORT" not in os.environ
    return sys.stdout.isatty() and not under_slurm


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep them visible as strings
    return value


class MetricsLogger:
    def __init__(self, run_dir, enabled: bool, total_steps: int, tensorboard: bool = True,
                 wandb: bool = False, wandb_project: str = "biglm", progress: str = "auto",
                 config: dict | None = None, start_step: int = 0):
        self.enabled = enabled
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        self._tb = self._wandb = self._bar = None
        self.notes: list[str] = []
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter  # lazy: optional (tensorboard, dev extra)
                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"))
            except ImportError:
                self.notes.append("tensorboard not installed: TensorBoard logging off "
                                  "(pip install tensorboard, or set logging.tensorboard=false)")
        if wandb:
            import wandb as _wandb  # lazy: optional (an explicit opt-in: fails loudly if missing)
            self._wandb = _wandb.init(project=wandb_project, dir=str(self.run_dir), config=config,
                                      resume="allow", name=self.run_dir.name)
        if interactive(progress):
            self._bar = tqdm(total=total_steps, initial=start_step, dynamic_ncols=True, desc="train")

    def log(self, record: dict) -> None:
        """Write one record (must hold `step`); echo it to the console."""
        if not self.enabled:
            return
        record = {k: _clean(v) for k, v in record.items()}
        record.setdefault("time", round(time.time(), 3))
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        step = record["step"]
        for key, value in record.items():
            if key in ("step", "time", "kind") or not isinstance(value, (int, float)):
                continue
            tag = f"{record.get('kind', 'train')}/{key}"
            if self._tb is not None:
                self._tb.add_scalar(tag, value, step)
        if self._wandb is not None:
            self._wandb.log({f"{record.get('kind', 'train')}/{k}": v for k, v in record.items()
                             if isinstance(v, (int, float))}, step=step)
        self._echo(record)

    def _echo(self, record: dict) -> None:
        fields = " | ".join(f"{k} {_fmt(v)}" for k, v in record.items() if k not in ("time", "kind"))
        if self._bar is not None:
            self._bar.n = record["step"]
            self._bar.set_postfix_str(fields, refresh=True)
        else:
            print(f"[{record.get('kind', 'train')}] {fields}", flush=True)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()
        if self._wandb is not None:
            self._wandb.finish()


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def read_metrics(path) -> list[dict]:
    """All records of a metrics.jsonl. A line that does not parse (the last line of a run
    killed mid-write) is skipped with a warning that counts them."""
    out, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    if bad:
        warnings.warn(f"{path}: skipped {bad} unparseable line(s)")
    return out
