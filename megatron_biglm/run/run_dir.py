"""What a run directory holds, and what `finetune.overwrite: true` may delete.

A run lists what it writes in its run_dir in `run_manifest.json` (written when the run
claims the folder): its checkpoint folder, metrics, results, logs, its config and its claim.
`overwrite` deletes those entries only. Anything else in the folder, the user's data or
notes, or a nested run of any kind (a fine-tune's record, a checkpoint folder), refuses the
overwrite, naming each. A folder claimed before runs kept a manifest is read as holding the
entries every run writes.

A run whose inputs (`finetune.data` files, `init_from`) lie inside its run_dir is refused before
any of them is read: its outputs and its inputs would share one folder, and a rerun with
`overwrite` could not start over without deleting them.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from megatron_biglm.config import ConfigError
from megatron_biglm.data.readers import SkipReport, expand_inputs

#: the run_dir file that lists what the run wrote there
MANIFEST = "run_manifest.json"
#: the top-level entries every run writes in its run_dir
RUN_WRITES = ("finetune_run.json", MANIFEST, "run.lock", "config.yaml", "metrics.jsonl", "tensorboard", "wandb",
              "results.json", "results.json.tmp", "train_done.json", "checkpoints")


def run_entries(cfg) -> list[str]:
    """The top-level names this run writes in its run_dir (its checkpoint folder's, when inside)."""
    names = list(RUN_WRITES)
    run_dir, ckpt = Path(cfg.run_dir).resolve(), Path(cfg.checkpoint_dir).resolve()
    if run_dir in ckpt.parents:
        names.append(ckpt.relative_to(run_dir).parts[0])
    return sorted(set(names))


def write_manifest(run_dir, entries: list[str]) -> None:
    path = Path(run_dir) / MANIFEST
    path.write_text(json.dumps({"entries": sorted(entries)}, indent=1) + "\n")


def read_manifest(run_dir) -> list[str]:
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        return list(RUN_WRITES)
    try:
        return list(json.loads(path.read_text())["entries"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path} is not a run manifest (a JSON object with 'entries'); it is not deleted, nor "
                          "anything beside it: remove the run_dir by hand or give this run another") from None


def _nested_run(path: Path) -> str | None:
    """What kind of run `path` (a folder) holds, if any."""
    if (path / "finetune_run.json").is_file() or (path / "results.json").is_file():
        return "a fine-tune"
    if (path / MANIFEST).is_file() or (path / "latest").is_file() or any(path.glob("iter_*")) \
            or any(path.glob("*/latest")) or (path / "train_done.json").is_file():
        return "a run"
    return None


def foreign_entries(run_dir, entries: list[str]) -> list[str]:
    """What in `run_dir` its run did not write, each described (a nested run named as such)."""
    out = []
    for path in sorted(Path(run_dir).iterdir()):
        if path.name in entries:
            continue
        kind = _nested_run(path) if path.is_dir() else None
        out.append(f"{path.name}{'/' if path.is_dir() else ''}" + (f" ({kind} nested there)" if kind else ""))
    return out


def delete_run(run_dir) -> list[str]:
    """Delete what the run in `run_dir` wrote (its manifest's entries), after refusing when
    anything else is there; returns the names deleted."""
    run_dir = Path(run_dir)
    entries = read_manifest(run_dir)
    others = foreign_entries(run_dir, entries)
    if others:
        raise ConfigError(f"finetune.overwrite: run_dir {run_dir} holds what no run wrote there: {', '.join(others)}; "
                          "nothing was deleted. Move them out of the run_dir, or give this fine-tune its own run_dir")
    deleted = []
    for name in entries:
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            if name == "run.lock":
                continue  # this run holds it
            path.unlink()
        else:
            continue
        deleted.append(name)
    return deleted


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_inputs_outside(cfg) -> None:
    """Refuse a run_dir that is, or holds, one of the run's inputs, before any is read."""
    run_dir = Path(cfg.run_dir).expanduser().resolve()
    start = cfg.finetune.init_from
    if start and Path(start).expanduser().resolve() == run_dir:
        how = "finetune.overwrite: " if cfg.finetune.overwrite else ""
        raise ConfigError(f"{how}run_dir {cfg.run_dir} holds finetune.init_from={start}, the checkpoint this run "
                          f"starts from: run_dir and finetune.init_from are the same path ({run_dir}). A fine-tune "
                          "writes its own checkpoints apart from its start: give it another run_dir (overwrite "
                          "would not help)")
    if start and _inside(Path(start).expanduser().resolve(), run_dir):
        raise ConfigError(f"run_dir {cfg.run_dir} holds finetune.init_from={start}, the checkpoint this run starts "
                          "from; give this fine-tune a run_dir of its own, apart from its inputs")
    inside = []
    for split in sorted(cfg.finetune.data):
        spec = cfg.finetune.data[split]
        if spec is None:
            continue
        try:
            files = expand_inputs(spec, SkipReport())
        except (ValueError, OSError):
            continue  # the plan names what is wrong with the files
        inside += [f"finetune.data.{split}={f}" for f in files if _inside(Path(f).resolve(), run_dir)]
    if inside:
        raise ConfigError(f"run_dir {cfg.run_dir} holds this run's own input files ({', '.join(inside)}); a run "
                          "writes its outputs apart from its inputs: move the files out, or give this fine-tune "
                          "another run_dir")


__all__ = ["MANIFEST", "RUN_WRITES", "check_inputs_outside", "delete_run", "foreign_entries", "read_manifest",
           "run_entries", "write_manifest"]
