"""Every example run config loads, names a real preset, and encodes the paper's setting."""
from __future__ import annotations

from pathlib import Path

import pytest

from megatron_biglm.config import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
ALL = sorted(p for p in CONFIGS.rglob("*.yaml") if "presets" not in p.parts)


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data")
    monkeypatch.setenv("BIGLM_TOKENIZER", "/tok")


@pytest.mark.parametrize("path", ALL, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_example_config_loads_and_model_resolves(path):
    from megatron_biglm.model.presets import load_preset
    cfg = load_config(path)
    # paper_base.yaml holds the shared settings of the four final runs, which add the preset:
    # it must fit each of them
    presets = ["136m", "360m", "1p3b", "3p5b"] if path.name == "paper_base.yaml" else [cfg.model["preset"]]
    overrides = {k: v for k, v in cfg.model.items() if k != "preset"}
    for preset in presets:
        model = load_preset(preset, overrides)
        assert cfg.data.seq_length <= model.seq_length


def test_final_presets_follow_table7():
    for size in ("136m", "360m", "1p3b", "3p5b"):
        cfg = load_config(CONFIGS / f"biglm_{size}.yaml")
        assert (cfg.schedule.style, cfg.schedule.train_steps, cfg.schedule.wsd_decay_steps) == ("wsd", 300000, 60000)
        assert cfg.anneal_start_step == 240000  # 20 % annealing
        assert (cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.optimizer.clip_grad) == (6e-4, 6e-5, 1.0)
        assert (cfg.training.global_batch_size, cfg.data.seq_length) == (1024, 2048)
        assert len(cfg.data.blend) == 2  # mixed data


def test_ablations_differ_from_base_only_where_the_paper_says():
    base = load_config(CONFIGS / "table1_biglm.yaml").to_dict()
    for path in (CONFIGS / "table8").glob("*.yaml"):
        cfg = load_config(path).to_dict()
        changed = {k for k in base if base[k] != cfg[k]}
        assert changed == {"run_dir", "objective"}, path
    raw = load_config(CONFIGS / "table2" / "rawdata_annealing_pp.yaml")
    assert raw.anneal_start_step == 40000 and raw.schedule.style == "wsd"
    assert load_config(CONFIGS / "table2" / "syndata_annealing.yaml").data.anneal_blend == [
        "/data/cosmopedia_v2_text_document"]
    assert load_config(CONFIGS / "table1_mlm.yaml").objective["variant"] == "mlm"


@pytest.mark.parametrize("path", [p for p in ALL if p.parent.name in ("finetune", "instruct")],
                         ids=lambda p: str(p.relative_to(CONFIGS)))
def test_a_fine_tune_config_sets_no_tokenizer_of_its_own(path, monkeypatch):
    """Unset, `data.tokenizer` is `finetune.init_from`'s own (run/plan.py `from_start`); a
    default path would be another tokenizer whenever the start point is not that run."""
    monkeypatch.delenv("BIGLM_TOKENIZER")
    assert not load_config(path).data.tokenizer
