"""Saving that never lies (common/disk.py, checkpoint/space.py): a run_dir that is a file, on
a read-only filesystem or on a full disk stops with one line naming the path and the cause,
and results.json and `best` name only sealed checkpoints. The read-only and full disks are
real: small tmpfs mounts in a private mount namespace (`unshare -rm`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from finetune_entry_fixtures import finetune_overrides, write_task

REPO = Path(__file__).resolve().parents[2]


def test_a_run_dir_that_is_a_file_is_one_line(tmp_path, capsys):
    from megatron_biglm.cli.finetune import main

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    run_dir = tmp_path / "run"
    run_dir.write_text("not a folder")
    config = tmp_path / "ft.yaml"
    config.write_text("{}\n")
    assert main(["--config", str(config), *finetune_overrides(task, run_dir)]) == 2
    assert capsys.readouterr().err == (f"error: run_dir {run_dir}: {run_dir} is a file, not a folder; remove it or "
                                       f"choose another run_dir\n")
    assert run_dir.read_text() == "not a folder"


#: runs inside the namespace: the fine-tune into a read-only folder, then into a full one
SCRIPT = """
import contextlib, io, json, sys
from megatron_biglm.cli.finetune import main
config, readonly, full, overrides = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
out = {}
for name, run_dir in (("readonly", readonly), ("full", full)):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["--config", config, *overrides, f"run_dir={run_dir}"])
    out[name] = {"status": status, "err": [l for l in err.getvalue().splitlines() if not l.startswith((" ", "/"))]}
import pathlib
results = pathlib.Path(full, "results.json")
out["full"]["results"] = json.loads(results.read_text()) if results.is_file() else None
out["full"]["best"] = pathlib.Path(full, "checkpoints", "best").exists()
out["full"]["sealed"] = sorted(p.parent.name for p in pathlib.Path(full).rglob("COMPLETE.json"))
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a private mount namespace")
def test_a_read_only_and_a_full_disk_are_one_line_and_nothing_claims_an_unsealed_checkpoint(tmp_path):
    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    readonly, full = tmp_path / "ro", tmp_path / "full"
    readonly.mkdir(), full.mkdir()
    config = tmp_path / "ft.yaml"
    config.write_text("{}\n")
    overrides = [o for o in finetune_overrides(task, tmp_path / "unused", **{"finetune.epochs": 1})
                 if not o.startswith("run_dir=")]
    mounts = (f"mount -t tmpfs -o ro,size=64k tmpfs {readonly} && "
              f"mount -t tmpfs -o size=160k tmpfs {full} && ")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", mounts + "true"], capture_output=True, env=env)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", mounts + 'exec "$@"', "sh", sys.executable, "-c", SCRIPT,
                           str(config), str(readonly / "run"), str(full / "run"), json.dumps(overrides)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["readonly"]["status"] == 2
    assert out["readonly"]["err"] == [f"error: run_dir {readonly / 'run'}: {readonly / 'run'} is on a read-only "
                                      f"filesystem; point run_dir at a writable folder"], out["readonly"]["err"]
    assert out["full"]["status"] == 2
    assert len(out["full"]["err"]) == 1, out["full"]["err"]
    line = out["full"]["err"][0]
    assert line.startswith(f"error: checkpoint folder {full / 'run' / 'checkpoints'}: no "
                                                     "space left: "), line
    assert " needed, " in line and " free; " in line
    print(line)
    # the validation before the failed save is recorded, but names no checkpoint and no finished run
    assert out["full"]["sealed"] == [] and not out["full"]["best"]
    results = out["full"]["results"]
    assert results["validations"] and results["best_checkpoint"] is None and results["finished"] is False
