"""The loss-curve PNG (training/curves.py) draws the logged numbers: the pixels of each run's
line, read back from the image, follow its losses (a falling run falls, a rising one rises,
each straight where its losses are linear) and a reference line is flat at its value."""
from __future__ import annotations

import json

import numpy as np
import pytest

from curve_pixels import C0, C1, line_pixels
from megatron_biglm.training.curves import plot_runs


def write_run(folder, losses, seq=64, batch=8):
    folder.mkdir(parents=True)
    with open(folder / "metrics.jsonl", "w") as f:
        for step, loss in enumerate(losses, start=1):
            f.write(json.dumps({"kind": "train", "step": step, "loss": loss,
                                "consumed_tokens": step * seq * batch}) + "\n")
        f.write(json.dumps({"kind": "valid", "step": len(losses), "loss": losses[-1]}) + "\n")
    return folder


def curve_of(img, rgb, panel) -> tuple[np.ndarray, np.ndarray]:
    """Median row of the colour per column: the drawn curve, top = 0. The legend's short
    sample of the same colour is left out: columns whose row is more than 4 px off a
    straight-line fit of the rest (at most a fifth of them)."""
    cols, rows = line_pixels(img, rgb, panel)
    assert cols.size > 100, f"no line of colour {rgb} in the panel"
    xs = np.unique(cols)
    ys = np.array([np.median(rows[cols == x]) for x in xs])
    keep = np.ones(len(xs), bool)
    for _ in range(3):
        fit = np.polyfit(xs[keep], ys[keep], 1)
        keep = np.abs(np.polyval(fit, xs) - ys) <= 4
    assert keep.mean() > 0.8, f"{(~keep).sum()} of {len(xs)} columns off the line"
    return xs[keep], ys[keep]


def test_each_runs_pixels_follow_its_losses(tmp_path):
    import matplotlib.image as mpimg

    steps = 50
    falling = write_run(tmp_path / "falling", [8.0 - 6.0 * i / (steps - 1) for i in range(steps)])
    rising = write_run(tmp_path / "rising", [3.0 + 2.0 * i / (steps - 1) for i in range(steps)])
    png = plot_runs({"falling": falling, "rising": rising}, tmp_path / "curves.png",
                    reference_lines={"entropy": 4.0})
    img = mpimg.imread(png)
    h, w = img.shape[:2]
    train_vs_step = (slice(0, h // 2), slice(0, w // 2))       # the top-left panel
    xs, fall = curve_of(img, C0, train_vs_step)
    xr, rise = curve_of(img, C1, train_vs_step)
    # screen rows grow downwards: a falling loss moves down the image, a rising one up
    assert fall[-1] - fall[0] > 100 and rise[0] - rise[-1] > 20
    # linear losses draw straight lines; the slopes' ratio is the losses' (-6 per run vs +2)
    for x, y in ((xs, fall), (xr, rise)):
        assert abs(np.corrcoef(x, y)[0, 1]) > 0.99
    slope_f, slope_r = np.polyfit(xs, fall, 1)[0], np.polyfit(xr, rise, 1)[0]
    assert slope_f / slope_r == pytest.approx(-3.0, rel=0.1)
    # both share the axis: they cross on screen where their losses are equal, 8 - 6t = 3 + 2t
    # at t = 5/8 of the run
    fit_f, fit_r = np.polyfit(xs, fall, 1), np.polyfit(xr, rise, 1)
    cross = (fit_r[1] - fit_f[1]) / (fit_f[0] - fit_r[0])
    assert (cross - xs[0]) / (xs[-1] - xs[0]) == pytest.approx(5 / 8, abs=0.03)
    # the reference line: flat, between the two runs' first points, at loss 4.0 on the same scale
    crop = img[train_vs_step][..., :3] * 255.0  # C7 grey, drawn 1 px wide: antialiased lighter
    grey = (np.ptp(crop, axis=-1) < 6) & (crop[..., 0] > 60) & (crop[..., 0] < 200)
    counts = np.bincount(np.nonzero(grey)[0])
    ref_row = counts.argmax()  # grey text is scattered; the dashed line is one long row
    assert counts[ref_row] > 0.4 * (xs[-1] - xs[0])
    loss_per_row = -6.0 / (fall[-1] - fall[0])
    assert 8.0 + (ref_row - fall[0]) * loss_per_row == pytest.approx(4.0, abs=0.25)


def test_no_loss_records_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text(json.dumps({"kind": "zero_shot", "step": 1}) + "\n")
    with pytest.raises(ValueError, match="no loss records"):
        plot_runs({"a": tmp_path / "empty"}, tmp_path / "x.png")
