"""Reading a loss-curve PNG back: the pixels of one line colour in one panel. Shared by the
curve-plot tests and the training end-to-end test."""
from __future__ import annotations

import numpy as np

C0, C1 = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # matplotlib's tab10


def line_pixels(img: np.ndarray, rgb, panel) -> tuple[np.ndarray, np.ndarray]:
    """(columns, rows) of the pixels within 12/255 of `rgb` inside `panel` (a slice pair)."""
    crop = img[panel][..., :3] * 255.0
    near = (np.abs(crop - np.array(rgb)) < 12).all(-1)
    rows, cols = np.nonzero(near)
    return cols, rows
