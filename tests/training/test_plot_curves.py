"""Curves from metrics.jsonl: resumed runs keep the last record of a step; PNG is written."""
from __future__ import annotations

from megatron_biglm.training.curves import load_run, plot_runs
from megatron_biglm.training.metrics import MetricsLogger


def _run(path, records):
    m = MetricsLogger(path, enabled=True, total_steps=10, tensorboard=False, progress="plain")
    for r in records:
        m.log(r)
    m.close()
    return path


def test_load_run_dedupes_resumed_steps_and_skips_nan(tmp_path):
    run = _run(tmp_path / "a", [
        {"step": 1, "loss": 5.0, "consumed_tokens": 100}, {"step": 2, "loss": 4.0, "consumed_tokens": 200},
        {"step": 2, "loss": 3.5, "consumed_tokens": 200},  # re-trained after a resume
        {"step": 3, "loss": float("nan"), "consumed_tokens": 300},
        {"kind": "valid", "step": 2, "loss": 4.2, "consumed_tokens": 200}])
    series = load_run(run)
    assert series["train"] == [(1, 100, 5.0), (2, 200, 3.5)]
    assert series["valid"] == [(2, 200, 4.2)]


def test_plot_runs_writes_png(tmp_path):
    a = _run(tmp_path / "a", [{"step": s, "loss": 5.0 / s, "consumed_tokens": 64 * s} for s in range(1, 6)])
    b = _run(tmp_path / "b", [{"step": s, "loss": 6.0 / s, "consumed_tokens": 64 * s} for s in range(1, 6)])
    out = plot_runs({"raw": a, "mixed": b}, tmp_path / "c.png", title="t")
    import matplotlib.image as mpimg
    img = mpimg.imread(out)
    assert img.shape[0] > 400 and img[..., :3].std() > 0.05


def test_the_command_takes_output_as_the_same_flag_as_out(tmp_path):
    """`--out` and `--output` name one flag: each writes the PNG it names."""
    from megatron_biglm.cli.plot_curves import main

    run = _run(tmp_path / "a", [{"step": s, "loss": 5.0 / s, "consumed_tokens": 64 * s} for s in range(1, 6)])
    for flag in ("--out", "--output"):
        png = tmp_path / f"{flag.strip('-')}.png"
        assert main([str(run), flag, str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
