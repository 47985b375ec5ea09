"""One verifier on every load path: a checkpoint with 64 zeroed bytes inside
one stored item (a model weight, or an optimizer-state tensor) is refused by resume, evaluation,
export and the weights-only start, naming the file, the item and the previous checkpoint;
with the opt-out (`checkpoint.verify=false`, `verify=false`, `--no-verify`) the load proceeds."""
from __future__ import annotations

import importlib.util

import pytest

from checkpoint_damage import ITEMS, damaged_copy, own_process_group, saved_run, train_data  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("own_process_group")
from megatron_biglm.checkpoint.verify import CorruptCheckpointError, verify_checkpoint
from train_fixtures import tiny_overrides


def _resume(saved_run, root, tmp_path, *extra):
    from megatron_biglm.cli.train import train

    return train(None, tiny_overrides(saved_run[1], tmp_path / "run", steps=6,
                                      **{"checkpoint.dir": str(root), "checkpoint.load": "auto",
                                         "checkpoint.save_interval": 2}) + list(extra))


def _weights_only_load(iter_dir, verify=True):
    from convert_fixtures import build_megatron_model
    from megatron_biglm.checkpoint.weights_only import load_model_weights
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(tp=1, pp=1)
    model = build_megatron_model(open_checkpoint(iter_dir).model_config)
    return load_model_weights(iter_dir, model, verify=verify)


def _eval_model(iter_dir, **kw):
    from megatron_biglm.evaluation.models import BiGLMEvalLM

    return BiGLMEvalLM(path=str(iter_dir), device="cpu", progress=False, **kw)


@pytest.mark.parametrize("kind", sorted(ITEMS))
def test_a_corrupt_item_is_refused_on_every_load_path(kind, saved_run, tmp_path, capsys):
    from megatron_biglm.cli.convert import main as convert_main

    root, file, item = damaged_copy(saved_run, tmp_path, ITEMS[kind])
    latest = root / "iter_0000004"
    advice = f"resume from the previous checkpoint: `checkpoint.load={root / 'iter_0000002'}`"

    def refused(exc):
        text = str(exc)
        assert item in text and file in text and advice in text, text

    # resume with load=auto: the corrupt latest is refused, the older one named, nothing written
    with pytest.raises(CorruptCheckpointError) as exc:
        _resume(saved_run, root, tmp_path)
    refused(exc.value)
    assert (root / "latest").read_text().strip() == "iter_0000004"
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000002", "iter_0000004", "latest"]
    # evaluation (the `biglm` lm-eval model that python -m megatron_biglm.cli.eval_zero_shot runs)
    with pytest.raises(CorruptCheckpointError) as exc:
        _eval_model(latest)
    refused(exc.value)
    # export
    code = convert_main(["to-hf", "--checkpoint", str(latest), "--output", str(tmp_path / "hf"), "--quiet"])
    refused(capsys.readouterr().err)
    assert code == 1 and not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.partial-*"))
    # the weights-only start (fine-tuning, an HF import)
    with pytest.raises(CorruptCheckpointError) as exc:
        _weights_only_load(latest)
    refused(exc.value)


def test_the_opt_out_loads_a_corrupt_checkpoint(saved_run, tmp_path, capsys):
    from megatron_biglm.cli.convert import main as convert_main

    root, _, item = damaged_copy(saved_run, tmp_path)
    latest = root / "iter_0000004"
    result = _resume(saved_run, root, tmp_path, "checkpoint.verify=false")
    assert result.resumed_from == str(latest) and result.iteration == 6
    assert "without its CRC-32 check" in _eval_model(latest, verify="false").load_notes[0]
    assert convert_main(["to-hf", "--checkpoint", str(latest), "--output", str(tmp_path / "hf"),
                         "--quiet", "--no-verify"]) == 0, capsys.readouterr().err
    _weights_only_load(latest, verify=False)


def test_an_intact_checkpoint_passes_with_every_item_counted(saved_run):
    report = verify_checkpoint(saved_run[0] / "iter_0000004")
    # 2 layers: model + exp_avg + exp_avg_sq items (split over files), common.pt and the RNG file
    assert report.items > 40 and report.unchecked == 0


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_deepspeed_resume_refuses_a_corrupt_zero_shard(train_data, tmp_path):  # noqa: F811
    """DeepSpeed's own files (module states, ZeRO optimizer shards) are torch.save archives:
    their entries' CRC-32s are checked like the DCP items."""
    from checkpoint_damage import zero_bytes_in_archive
    from megatron_biglm.cli.train import train

    ds = {"training.backend": "deepspeed", "training.deepspeed.zero_stage": 2, "checkpoint.save_interval": 1,
          "schedule.warmup_steps": 0, "schedule.style": "constant"}
    train(None, tiny_overrides(train_data, tmp_path / "run", steps=2, **ds))
    root = tmp_path / "run" / "checkpoints"
    shard = next((root / "iter_0000002" / "deepspeed" / "state").glob("*optim_states.pt"))
    entry = zero_bytes_in_archive(shard)
    with pytest.raises(CorruptCheckpointError) as exc:
        train(None, tiny_overrides(train_data, tmp_path / "run", steps=3, **ds))
    assert shard.name in str(exc.value) and entry in str(exc.value)
    assert f"`checkpoint.load={root / 'iter_0000001'}`" in str(exc.value)
    assert (root / "latest").read_text().strip() == "iter_0000002"
