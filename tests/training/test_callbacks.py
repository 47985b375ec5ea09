"""The loop's callback events (training/callbacks.py): log and save events carry what the run
wrote, a callback ends the run cleanly (early stopping) and the same command resumes it, and
an object that implements no event is refused before anything is built."""
from __future__ import annotations

import pytest

from megatron_biglm.checkpoint.dirs import latest_checkpoint
from megatron_biglm.cli.train import train
from megatron_biglm.training.callbacks import Callbacks, EvaluateCallback, LogCallback, SaveCallback, StepCallback
from train_fixtures import tiny_overrides, train_data, train_records  # noqa: F401 (fixture)


class Recorder:
    """Log, save and step events, and a stop request at `stop_at`."""

    def __init__(self, stop_at: int):
        self.logged, self.saved, self.stepped, self.stop_at = [], [], [], stop_at

    def on_log(self, record):
        self.logged.append(dict(record))

    def on_save(self, loop_state, path):
        self.saved.append((loop_state.iteration, path.name))

    def on_step(self, step, loop_state, ctx):
        self.stepped.append((step, ctx.config.schedule.train_steps))
        if step == self.stop_at:
            loop_state.stop_requested = f"early stopping at {step}"


def test_events_early_stop_and_resume(train_data, tmp_path):
    run = tmp_path / "run"
    recorder = Recorder(stop_at=5)
    assert isinstance(recorder, (StepCallback, SaveCallback, LogCallback))
    assert not isinstance(recorder, EvaluateCallback)
    result = train(None, tiny_overrides(train_data, run, steps=12, **{
        "training.eval_interval": 4, "training.eval_iters": 1}), callbacks=[recorder])
    assert result.stopped_by == "early stopping at 5" and result.iteration == 5
    assert recorder.stepped == [(s, 12) for s in range(1, 6)]
    assert recorder.saved == [(5, "iter_0000005")] and latest_checkpoint(run / "checkpoints").name == "iter_0000005"
    logged_train = {r["step"]: r for r in recorder.logged if r["kind"] == "train"}
    written = train_records(run)
    assert sorted(logged_train) == sorted(written) == [1, 2, 3, 4, 5]
    for step, record in written.items():  # the event carries what metrics.jsonl holds
        assert logged_train[step]["loss"] == pytest.approx(record["loss"], rel=1e-6)
    assert [r["step"] for r in recorder.logged if r["kind"] == "valid"] == [0, 4]
    resumed = train(None, tiny_overrides(train_data, run, steps=12, **{
        "training.eval_interval": 4, "training.eval_iters": 1}), callbacks=[lambda step, state: None])
    assert resumed.stopped_by is None and resumed.iteration == 12 and resumed.resumed_from is not None


def test_a_callback_without_events_is_refused_before_the_run_starts(train_data, tmp_path):
    class Typo:
        def on_stpe(self, step, loop_state, ctx):  # misspelt: implements nothing
            pass

    with pytest.raises(TypeError, match=r"implements none of the loop's events.*StepCallback \(on_step\)"):
        train(None, tiny_overrides(train_data, tmp_path / "run", steps=4), callbacks=[Typo()])
    assert not (tmp_path / "run").exists()
    assert len(list(Callbacks([print, Recorder(0)]))) == 2  # a function is a step callback


@pytest.mark.slow
def test_a_driver_script_without_a_main_guard_saves_checkpoints(train_data, tmp_path):
    """A plain script calling train() at top level (no `if __name__ == "__main__":`) runs to
    the end and saves: the checkpoint is written in-process, so no spawned helper re-runs the
    script (common/mcore_internals.in_process_save_strategy)."""
    import subprocess
    import sys

    script = tmp_path / "driver.py"
    script.write_text("from megatron_biglm.cli.train import train\n"
                      f"result = train(None, {tiny_overrides(train_data, tmp_path / 'run', steps=4)!r})\n"
                      "print('ITERATION', result.iteration)\n")
    import os
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": repo, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("ITERATION 4") == 1  # the script ran once, not again in a helper
    assert latest_checkpoint(tmp_path / "run" / "checkpoints").name == "iter_0000004"
