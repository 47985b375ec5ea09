"""Values a config refuses at load: a non-finite number (`optimizer.lr=inf` trained on NaN
losses; `nan` passes every bound check) names its key."""
from __future__ import annotations

import pytest

from megatron_biglm.config import ConfigError, load_config


@pytest.mark.parametrize("override", ["optimizer.lr=inf", "optimizer.lr=nan", "optimizer.min_lr=-inf",
                                      "optimizer.clip_grad=.inf", "training.global_batch_size=inf"])
def test_a_non_finite_number_is_refused_naming_the_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"config key '{key}'.*(not a finite number|whole number)"):
        load_config(None, [override])


def test_a_non_finite_number_in_a_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: .nan\n")
    with pytest.raises(ConfigError, match="config key 'optimizer.lr': nan is not a finite number"):
        load_config(str(path))
