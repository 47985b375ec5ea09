"""The training driver end to end on CPU (world size 1): learning on real text, exact
resume, graceful SIGTERM, NaN skipping, refusal of bad checkpoints and bad input."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from megatron_biglm.cli.train import train
from megatron_biglm.checkpoint.dirs import CheckpointError, complete_checkpoints, latest_checkpoint
from megatron_biglm.config import ConfigError
from megatron_biglm.training.metrics import read_metrics
from megatron_biglm.training.nonfinite import TooManyNonFinite
from train_fixtures import VOCAB, loss_and_grad_norm, poisoned_train, tiny_overrides, train_data  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tiny_run_learns_and_plots(train_data, tmp_path):
    run = tmp_path / "run"
    res = train(None, tiny_overrides(train_data, run, steps=60, **{
        "training.eval_interval": 30, "training.eval_iters": 8, "logging.log_interval": 10,
        "logging.tensorboard": True, "checkpoint.save_interval": 30}))
    assert res.iteration == 60 and res.stopped_by is None
    # validation on 8 batches (64 windows): step 0 -> 60 dropped 1.49-1.55 over seeds
    # (training.seed = data.seed) 1..5 and 1234; bar = 1/3 of the minimum
    assert res.last_val_loss < res.first_val_loss - 0.45, (res.first_val_loss, res.last_val_loss)
    recs = read_metrics(run / "metrics.jsonl")
    train_recs = [r for r in recs if r.get("kind", "train") == "train"]
    for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "tflops_per_device", "consumed_tokens"):
        assert key in train_recs[-1]
    assert [r["step"] for r in train_recs] == [10, 20, 30, 40, 50, 60]
    assert train_recs[-1]["consumed_tokens"] == 60 * 8 * 64
    assert [r["step"] for r in recs if r.get("kind") == "valid"] == [0, 30, 60]
    assert (run / "train_done.json").is_file() and (run / "config.yaml").is_file()
    assert list((run / "tensorboard").glob("events.*"))
    assert [p.name for p in complete_checkpoints(run / "checkpoints")] == ["iter_0000030", "iter_0000060"]
    # the saved config is the resolved one
    assert "seq_length: 64" in (run / "checkpoints" / "iter_0000060" / "config.yaml").read_text()
    png = tmp_path / "curves.png"
    proc = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.plot_curves", str(run), str(run),
                           "--labels", "a", "b", "--out", str(png)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import matplotlib.image as mpimg
    from curve_pixels import C1, line_pixels

    img = mpimg.imread(png)
    h, w = img.shape[:2]
    cols, rows = line_pixels(img, C1, (slice(0, h // 2), slice(0, w // 2)))  # run b, drawn last
    first, last = rows[cols <= np.percentile(cols, 5)].mean(), rows[cols >= np.percentile(cols, 95)].mean()
    assert last - first > 50  # the training loss fell, so its line ends lower in the image


@pytest.mark.slow
@pytest.mark.parametrize("distopt, dropout", [(False, 0.0), (True, 0.0), (True, 0.1)],
                         ids=["adam", "distributed_optimizer", "distributed_optimizer_dropout"])
def test_resume_is_exact(train_data, tmp_path, distopt, dropout):
    """With dropout the resumed run must also continue the saved RNG streams."""
    extra = {"optimizer.use_distributed_optimizer": distopt, "checkpoint.save_interval": 4,
             "model.hidden_dropout": dropout, "model.attention_dropout": dropout}
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(None, tiny_overrides(train_data, straight, steps=8, **extra))
    first = train(None, tiny_overrides(train_data, split, steps=8, **extra, **{"training.exit_after_steps": 4}))
    assert first.iteration == 4
    second = train(None, tiny_overrides(train_data, split, steps=8, **extra))
    assert second.resumed_from.endswith("iter_0000004") and second.iteration == 8
    a, b = loss_and_grad_norm(straight), loss_and_grad_norm(split)
    assert sorted(a) == sorted(b) == list(range(1, 9))
    assert a == b  # loss and grad norm at every step, bit for bit


def test_resume_refuses_other_model_and_truncated_checkpoint(train_data, tmp_path):
    run = tmp_path / "run"
    train(None, tiny_overrides(train_data, run, steps=6, **{"training.exit_after_steps": 2}))
    with pytest.raises(CheckpointError, match=r"model.hidden_size: checkpoint=64, this run=96"):
        train(None, tiny_overrides(train_data, run, steps=6, **{"model.hidden_size": 96}))
    ckpt = latest_checkpoint(run / "checkpoints")
    shard = sorted((ckpt / "dist").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"truncated: file dist/{shard.name} has 100 bytes"):
        train(None, tiny_overrides(train_data, run, steps=6))


@pytest.mark.slow
def test_nan_steps_are_skipped_then_too_many_stop(train_data, tmp_path):
    def transient(step, loss):
        return loss * math.nan if step in (3, 4) else loss
    res = poisoned_train(None, tiny_overrides(train_data, tmp_path / "a", steps=8), transient)
    assert res.skipped_nonfinite == 2 and math.isfinite(res.last_loss) and res.iteration == 8
    recs = {r["step"]: r for r in read_metrics(tmp_path / "a" / "metrics.jsonl")}
    assert recs[3]["loss"] == "nan" and recs[3]["skipped_nonfinite"] == 1 and recs[8]["skipped_nonfinite"] == 2

    def diverged(step, loss):
        return loss * math.inf if step >= 5 else loss
    run = tmp_path / "b"
    with pytest.raises(TooManyNonFinite, match="3 steps in a row"):
        poisoned_train(None, tiny_overrides(train_data, run, steps=12, **{
            "checkpoint.save_interval": 4, "training.max_nonfinite_in_a_row": 3}), diverged)
    assert latest_checkpoint(run / "checkpoints").name == "iter_0000004"


def test_bad_input_messages(train_data, tmp_path):
    run = tmp_path / "r"
    with pytest.raises(ConfigError, match=r"global_batch_size=10 is not divisible by .* 4 × 1 = 4"):
        train(None, tiny_overrides(train_data, run, **{"training.global_batch_size": 10}))
    with pytest.raises(ConfigError, match="no indexed dataset at"):
        train(None, tiny_overrides(train_data, run, **{"data.blend": "['/nonexistent/corpus']"}))
    with pytest.raises(ConfigError, match=f"tokenizer vocab {VOCAB} is larger than model.vocab_size=1024"):
        train(None, tiny_overrides(train_data, run, **{"model.vocab_size": 1024}))
    from megatron_biglm.data.tokenizer import train_bpe_tokenizer
    small = train_bpe_tokenizer([str(_text_file(tmp_path))], 300, tmp_path / "small_tok")
    with pytest.raises(ConfigError, match="holds token id .* preprocessed with a different tokenizer"):
        train(None, tiny_overrides(train_data, run, **{"data.tokenizer": str(small)}))


def _truncated_copy(data, tmp_path) -> tuple[str, int]:
    """A copy of the training data whose .bin is cut to half its size (a copy cut short, as an interrupted transfer leaves it)."""
    import shutil
    half = str(tmp_path / "half_text_document")
    for ext in (".bin", ".idx"):
        shutil.copy(data.prefix + ext, half + ext)
    full = Path(half + ".bin").stat().st_size
    with open(half + ".bin", "r+b") as fh:
        fh.truncate(full // 2)
    return half, full


def test_truncated_bin_is_refused_at_dataset_open(train_data, tmp_path):
    """megatron-core's reader would die mid-run with a bare offset error; the run refuses
    before building anything, naming the file, both sizes and the fix, with exit status 2."""
    from megatron_biglm.data.indexed_tools import CorruptDatasetError
    from megatron_biglm.data.pretrain_data import build_pretrain_datasets
    from megatron_biglm.data.token_ids import TokenIds
    from megatron_biglm.data.tokenizer import load_tokenizer

    half, full = _truncated_copy(train_data, tmp_path)
    expected = [f"{half}.bin: {full // 2:,} bytes", f"describes {full:,} bytes", "re-run python -m megatron_biglm.cli.preprocess"]
    run = tmp_path / "r"
    with pytest.raises(ConfigError) as error:
        train(None, tiny_overrides(train_data, run, **{"data.blend": f"['{half}']"}))
    assert all(part in str(error.value) for part in expected), str(error.value)
    assert not run.exists() or not any((run / "checkpoints").glob("iter_*"))
    # The data layer's own entry point refuses too (for callers that bypass train()).
    token_ids = TokenIds.from_tokenizer(load_tokenizer(train_data.tokenizer))
    with pytest.raises(CorruptDatasetError, match="truncated .bin"):
        build_pretrain_datasets({"blend": [train_data.prefix], "valid_blend": [half], "seq_length": 64},
                                token_ids=token_ids, train_samples=8, valid_samples=8)
    proc = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.train", "--config",
                           str(REPO / "examples" / "configs" / "tiny_cpu.yaml"),
                           *tiny_overrides(train_data, tmp_path / "cli", **{"data.blend": f"['{half}']"})],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert all(part in proc.stderr for part in expected) and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def _text_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("To be, or not to be, that is the question.\n\n" * 50)
    return path


def test_cli_invalid_key_fails_fast(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.train", "--config",
                           str(REPO / "examples" / "configs" / "tiny_cpu.yaml"), "optimizer.lrr=1"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert "unknown config key 'optimizer.lrr' (did you mean 'lr'?)" in proc.stderr


@pytest.mark.slow
def test_sigterm_saves_and_resumes(train_data, tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "megatron_biglm.cli.train", "--config", str(REPO / "examples" / "configs" / "tiny_cpu.yaml"),
           *tiny_overrides(train_data, run, steps=100000, **{"schedule.warmup_steps": 2})]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    assert "received SIGTERM" in out
    ckpt = latest_checkpoint(run / "checkpoints")  # verified complete
    state = json.loads((ckpt / "train_state.json").read_text())
    last_logged = max(loss_and_grad_norm(run))
    assert state["iteration"] == last_logged >= 3 and ckpt.name == f"iter_{last_logged:07d}"
    assert not (run / "train_done.json").exists()
    res = train(None, tiny_overrides(train_data, run, steps=100000, **{"schedule.warmup_steps": 2,
                                                                          "training.exit_after_steps": 2}))
    assert res.resumed_from == str(ckpt) and res.iteration == last_logged + 2
