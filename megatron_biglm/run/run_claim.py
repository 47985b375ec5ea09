"""Which fine-tune a run directory holds: its record (`finetune_run.json`), the check that a
run_dir holds no other run, and what `finetune.overwrite: true` may delete.

A run's identity is its task, its settings (every one that shapes the trajectory:
`config/resume_settings.py`; `finetune.resume_changes` names those a resume changes on purpose) and its data: the data by path and by content (each
local file's size and SHA-256), so a training file edited between an interrupted run and its
rerun is another run, not a resume under a new plan. The check runs before anything is built;
the record is written only once every check of the start has passed (`RunClaim.on_start`, the
loop's start event), so a start that fails leaves no claim and the corrected rerun is not
refused as "another run".

`overwrite` deletes only what a fine-tune wrote (its run_dir's manifest, `run_dir.py`), only
where a fine-tune's own record is, never anything else there, and never what this run reads: a run_dir that is, or holds, `finetune.init_from`, or that holds a pretraining
checkpoint (an `iter_N` folder whose saved config has no `finetune.task`), is refused.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch.distributed as dist
import yaml

from megatron_biglm.common.file_content import file_content
from megatron_biglm.config import ConfigError
from megatron_biglm.config.finetune_section import migrate_moved_keys
from megatron_biglm.config.resume_settings import allowed_changes, trajectory
from megatron_biglm.data.readers import SkipReport, expand_inputs
from megatron_biglm.finetune.data_files import DATA_FORMATS

from .run_dir import RUN_WRITES, delete_run, run_entries, write_manifest
from .run_lock import LOCK_FILE

#: the run_dir file that says which fine-tune the folder holds
RUN_FILE = "finetune_run.json"


def data_content(data: dict) -> dict:
    """{split: {file: size and digest}} of every local file the run's `finetune.data` names
    (a path, directory, glob or list; hub splits have no local file)."""
    out = {}
    for split in sorted(data):
        if data[split] is None:
            continue
        files = expand_inputs(data[split], SkipReport(), DATA_FORMATS)
        out[split] = {str(Path(f).resolve()): file_content(f) for f in sorted(files) if Path(f).is_file()}
    return out


def run_identity(cfg) -> dict:
    """What makes two fine-tunes the same run (a resume) rather than two runs: the task, its
    data (paths and content), the start point and the settings that shape the schedule and
    the optimizer."""
    f = cfg.finetune
    return {"task": f.task, "data": {k: f.data[k] for k in sorted(f.data)}, "init_from": f.init_from,
            "max_length": f.max_length, "epochs": f.epochs, "train_examples": f.train_examples,
            "min_steps": f.min_steps, "options": f.options, "seed": cfg.data.seed,
            "trajectory": trajectory(cfg), "data_content": data_content(f.data)}


class RunClaim:
    """This fine-tune's record, written into run_dir by the loop's start event (every rank
    calls it; rank 0 writes)."""

    def __init__(self, run_dir, identity: dict, entries: list[str] = RUN_WRITES):
        self.run_dir, self.identity, self.entries = Path(run_dir), identity, list(entries)

    def on_start(self) -> None:
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_manifest(self.run_dir, self.entries)
        (self.run_dir / RUN_FILE).write_text(json.dumps(self.identity, indent=1) + "\n")


def check_run_dir(cfg) -> tuple[RunClaim, str | None]:
    """Refuse a run_dir that holds another fine-tune (another task, data or settings): resuming
    it would mix two runs' checkpoints and results. With `finetune.overwrite: true` a folder
    holding another fine-tune's record is deleted (the note says so) unless this run reads from
    it. Returns the claim to write once the start has passed its checks, and the note."""
    run_dir = Path(cfg.run_dir)
    mine = json.loads(json.dumps(run_identity(cfg), default=str))
    claim = RunClaim(run_dir, mine, run_entries(cfg))
    if not (run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir())):
        return claim, None
    marker = run_dir / RUN_FILE
    theirs = json.loads(marker.read_text()) if marker.is_file() else None
    if theirs is not None and "data_content" not in theirs:  # a record from before content was recorded
        theirs["data_content"] = mine["data_content"]
    if theirs is not None:  # a kind's settings recorded where they were before: the config's one migration
        theirs = migrate_moved_keys(theirs, str(marker))
        theirs = _with_trajectory(theirs, mine)
    changed = _allowed_changes(cfg, theirs, mine)
    if theirs == mine:
        return claim, (f"finetune.resume_changes: resuming with {'; '.join(changed)}" if changed else None)
    if not cfg.finetune.overwrite:
        changed = [k for k in (theirs or {}).get("trajectory", {}) if theirs["trajectory"][k] != mine["trajectory"].get(k)]
        hatch = (f", or, to resume it with the change, finetune.resume_changes=[{','.join(changed)}]"
                 if changed and theirs == {**mine, "trajectory": theirs["trajectory"]} else "")
        raise ConfigError(f"run_dir {run_dir} holds another run ({_differences(theirs, mine)}). Give this "
                          "fine-tune its own run_dir, or set finetune.overwrite=true to delete that run and "
                          f"start over{hatch}")
    _check_deletable(cfg, run_dir, theirs)
    deleted = delete_run(run_dir)
    return claim, f"finetune.overwrite: deleted the other run in {run_dir} (what it wrote: {', '.join(deleted)})"


def _with_trajectory(theirs: dict, mine: dict) -> dict:
    """A record from before every trajectory setting was recorded held only the learning rate
    and the batch: the rest are taken as this run's."""
    if "trajectory" in theirs:
        return theirs
    theirs = dict(theirs)
    recorded = {"optimizer.lr": theirs.pop("lr", None), "training.global_batch_size": theirs.pop("global_batch_size", None)}
    theirs["trajectory"] = {**mine["trajectory"], **{k: v for k, v in recorded.items() if v is not None}}
    return theirs


def _allowed_changes(cfg, theirs: dict | None, mine: dict) -> list[str]:
    """The trajectory settings `finetune.resume_changes` names that differ from the record:
    taken as the record's for the comparison, each described for the note."""
    allowed = allowed_changes(cfg)
    if theirs is None or not allowed:
        return []
    before, now = theirs.get("trajectory", {}), mine["trajectory"]
    changed = [f"{k}={now[k]!r} (was {before[k]!r})" for k in allowed if k in before and before[k] != now[k]]
    theirs["trajectory"] = {**before, **{k: now[k] for k in allowed if k in before}}
    return changed


def _differences(theirs: dict | None, mine: dict) -> str:
    if theirs is None:
        return "it holds no fine-tune record"
    out = []
    for key in mine:
        if theirs.get(key) == mine[key]:
            continue
        if key == "data_content":
            out += _changed_files(theirs[key], mine[key])
        elif key == "trajectory":
            before = theirs.get(key) or {}
            out += [f"{k}: {before.get(k)!r} there, {v!r} here" for k, v in mine[key].items() if before.get(k) != v]
        else:
            out.append(f"{key}: {theirs.get(key)!r} there, {mine[key]!r} here")
    return "; ".join(out)


def _changed_files(theirs: dict, mine: dict) -> list[str]:
    out = []
    for split in sorted(set(theirs) | set(mine)):
        before, now = theirs.get(split, {}), mine.get(split, {})
        for name in sorted(set(before) | set(now)):
            if name not in now:
                out.append(f"finetune.data.{split}: {name} was read there, not here")
            elif name not in before:
                out.append(f"finetune.data.{split}: {name} is new here")
            elif before[name] != now[name]:
                out.append(f"finetune.data.{split}: {name} changed since that run started "
                           f"({before[name]['bytes']} bytes there, {now[name]['bytes']} here; its SHA-256 differs)")
    return out


def _check_deletable(cfg, run_dir: Path, theirs: dict | None) -> None:
    """`overwrite` deletes a fine-tune's own folder only, never what this run reads."""
    keep = "; give this fine-tune its own run_dir"
    start = cfg.finetune.init_from
    if start and _inside(Path(start).expanduser().resolve(), run_dir.resolve()):
        raise ConfigError(f"finetune.overwrite: run_dir {run_dir} holds finetune.init_from={start}, the checkpoint "
                          f"this run starts from; deleting it would lose the start point{keep}")
    if theirs is None:
        raise ConfigError(f"finetune.overwrite: run_dir {run_dir} holds no fine-tune record ({RUN_FILE}), so it "
                          f"is not deleted: overwrite deletes only a fine-tune's own run_dir{keep}")
    for config in sorted(run_dir.rglob("iter_*/config.yaml")):
        saved = yaml.safe_load(config.read_text()) or {}
        if not (saved.get("finetune") or {}).get("task"):
            raise ConfigError(f"finetune.overwrite: run_dir {run_dir} holds a pretraining checkpoint "
                              f"({config.parent}); it is not deleted{keep}")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents
