"""The training loop with compiled layers (`model.compile_layers=true`, inductor on CPU)
compiles each layer once, as one graph, and never again: 20 steps of the real objective, whose
splits differ at every step, make no compile after the first step and no graph break."""
from __future__ import annotations

import math

import pytest

from compile_watch import fresh_dynamo, CountsPerStep, describe
from train_fixtures import tiny_overrides, train_data, train_records  # noqa: F401 (fixture)


@pytest.mark.slow
def test_compiled_training_does_not_recompile(train_data, tmp_path, fresh_dynamo):  # noqa: F811
    from megatron_biglm.cli.train import train
    from megatron_biglm.common.compile_counts import compile_counts

    counts = CountsPerStep()
    start = compile_counts()
    over = tiny_overrides(train_data, tmp_path / "run", steps=20, **{"model.compile_layers": "true",
                                                                   "logging.log_interval": 5})
    result = train(None, over, callbacks=[counts])
    assert result.iteration == 20
    warm = counts.after[1].since(start)
    assert warm.compiles >= 1 and warm.breaks == 0, describe(warm)
    after = counts.after[20].since(counts.after[1])
    assert after.compiles == 0 and after.recompiles == 0 and after.breaks == 0, describe(after)
    assert all(math.isfinite(r["loss"]) for r in train_records(tmp_path / "run").values())
