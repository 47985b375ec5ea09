"""The training loop reads the device on the host only at logging steps.

On a GPU every host read of a device tensor (`.item()`, `float(t)`, `bool(t)`, `.tolist()`,
`nonzero`, a boolean-mask index) stalls the launch queue until the device catches up. CPU
tensors cannot show a stall, so these tests count the reads themselves with
`host_reads.HostReads` (a torch function mode that sees every op made on the loop's thread),
and the real `train()` runs under it.

What would live on the device is told apart by provenance, as a GPU run would place it: the
loader's batches are made on the read-ahead thread, which the mode does not see, and stay on
the host (the split is checked there, and the loss's predicted rows are taken from the host
mask, on purpose); whatever is computed from them alone stays on the host too. Parameters,
what is moved to the device and what is computed from those count as device tensors, and
reading one counts. A non-logging step makes none: not the loss, not the gradient norm
(clipped or not), not the guard's decision, not megatron's per-token gradient scaling (its
`if num_tokens > 0` would count one here).
"""
from __future__ import annotations

import math

import pytest
import torch

from host_reads import HostReads
from train_fixtures import poisoned_train, tiny_overrides, train_data, train_records  # noqa: F401 (fixture)

class StepReads:
    """A step callback noting how many host reads `reads` had recorded when each step ended."""

    def __init__(self, reads: HostReads):
        self.reads = reads
        self.at_step: dict[int, int] = {}

    def on_step(self, step, loop_state, ctx=None):  # noqa: ARG002 - the step callback's signature
        self.at_step[step] = len(self.reads.reads)

    def per_step(self) -> dict[int, int]:
        steps = sorted(self.at_step)
        return {s: self.at_step[s] - self.at_step[p] for p, s in zip(steps, steps[1:])}

    def between(self, first: int, last: int) -> list:
        """The reads recorded after step `first` ended, up to the end of step `last`."""
        return self.reads.reads[self.at_step[first]:self.at_step[last]]


class Weights:
    """A step callback keeping a copy of the model's parameters after each step."""

    def __init__(self):
        self.after: dict[int, list] = {}

    def on_step(self, step, loop_state, ctx):  # noqa: ARG002 - the step callback's signature
        self.after[step] = [p.detach().clone() for p in ctx.model_chunks[0].parameters()]


def _counted_run(train_data, run_dir, poison=None, callbacks=(), **extra):  # noqa: F811
    over = tiny_overrides(train_data, run_dir, steps=12, **{"logging.log_interval": 4, **extra})
    from megatron_biglm import patches

    patches.apply_cpu()  # the shims' own function mode goes below the counter on the mode stack
    reads = HostReads()
    steps = StepReads(reads)
    with reads:
        if poison is None:
            from megatron_biglm.cli.train import train
            result = train(None, over, callbacks=[steps, *callbacks])
        else:
            result = poisoned_train(None, over, poison, callbacks=[steps, *callbacks])
    return result, steps


@pytest.mark.parametrize("clip", [1.0, 0.0], ids=["clipped", "unclipped"])
def test_non_logging_steps_make_no_host_read(train_data, tmp_path, clip):  # noqa: F811
    result, steps = _counted_run(train_data, tmp_path / "run", **{"optimizer.clip_grad": clip})
    assert result.iteration == 12
    per_step = steps.per_step()
    quiet = {s: n for s, n in per_step.items() if s % 4 != 0}
    logging = {s: n for s, n in per_step.items() if s % 4 == 0}
    assert quiet and max(quiet.values()) == 0, (per_step, steps.between(4, 7))
    assert min(logging.values()) > 0, per_step  # the counter does see the logging steps' reads
    assert all(math.isfinite(r["loss"]) for r in train_records(tmp_path / "run").values())


#: every backend whose training step runs on CPU (flex: torch has no FlexAttention backward on
#: CPU; flash and varlen need CUDA), with a biglm split, and with padding rows beside it
CPU_BACKENDS = ["sdpa", "local", "sdpa_split"]


@pytest.mark.slow  # about 15 s each: two 8-step trainings' worth per backend
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_host_read_free_steps_for_every_cpu_backend(train_data, tmp_path, backend):  # noqa: F811
    """Two micro-batches a step (micro 4, global 8): no step between logging steps reads the
    device, neither the loss's predicted rows, nor the split check, nor the mask."""
    result, steps = _counted_run(train_data, tmp_path / "run", **{"model.attention_backend": backend,
                                                                  "schedule.train_steps": 8})
    assert result.iteration == 8
    per_step = steps.per_step()
    quiet = {s: n for s, n in per_step.items() if s % 4 != 0}
    assert quiet and max(quiet.values()) == 0, (per_step, steps.between(4, 7))


def test_guard_skips_on_the_device_between_logs(train_data, tmp_path):  # noqa: F811
    """NaN steps between logging steps are skipped without a host read (no weight moves),
    and counted."""
    def poison(step, loss):
        return loss * math.nan if step in (5, 6) else loss
    weights = Weights()
    result, steps = _counted_run(train_data, tmp_path / "run", poison=poison, callbacks=[weights])
    per_step = steps.per_step()
    for before, after in zip(weights.after[4], weights.after[6]):
        assert torch.equal(before, after)
    assert not all(torch.equal(a, b) for a, b in zip(weights.after[6], weights.after[7]))
    assert result.skipped_nonfinite == 2 and math.isfinite(result.last_loss)
    assert max(n for s, n in per_step.items() if s % 4 != 0) == 0, per_step
    recs = train_records(tmp_path / "run")
    assert recs[8]["skipped_nonfinite"] == 2 and math.isfinite(recs[8]["loss"])


class SyncCounter:
    """A step callback counting CUDA's own reports of synchronizing calls (sync debug mode
    'warn', recorded into `caught`) up to each step."""

    def __init__(self, caught: list):
        self.caught = caught
        self.at_step: dict[int, int] = {}

    def on_step(self, step, loop_state, ctx=None):  # noqa: ARG002 - the step callback's signature
        self.at_step[step] = sum("synchroniz" in str(w.message) for w in self.caught)

    def per_step(self) -> dict[int, int]:
        steps = sorted(self.at_step)
        return {s: self.at_step[s] - self.at_step[p] for p, s in zip(steps, steps[1:])}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_non_logging_steps_host_read_free(train_data, tmp_path):  # noqa: F811
    """On the device itself: CUDA's sync debug mode reports every synchronizing call; a
    non-logging step (gradients clipped, two micro-batches) makes none."""
    import warnings

    from megatron_biglm.cli.train import train

    over = tiny_overrides(train_data, tmp_path / "run", steps=12, **{
        "logging.log_interval": 4, "optimizer.clip_grad": 1.0, "training.precision": "bf16"})
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counter = SyncCounter(caught)
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = train(None, over, callbacks=[counter])
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    assert result.iteration == 12
    per_step = counter.per_step()
    assert max(n for s, n in per_step.items() if s % 4 != 0) == 0, per_step
    assert max(per_step.values()) > 0, per_step  # the logging steps' reads are seen
