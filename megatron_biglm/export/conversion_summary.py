"""What a conversion did, proven by re-reading what it wrote.

Why re-read instead of trusting the writer: the point of the converter is that the files on
disk are the model. So both directions finish by reading the written files back, tensor by
tensor, and comparing them with a fresh conversion of the source; the summary reports the
parameter counts on both sides and the largest absolute difference found (0 unless a dtype
cast was asked for).
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Mapping, Tuple

import torch
from tqdm.auto import tqdm


class VerificationError(RuntimeError):
    """The files written do not reproduce the source; the output must not be used."""


@dataclass
class TensorComparison:
    tensors: int = 0
    numel: int = 0
    max_abs_diff: float = 0.0
    worst: str | None = None


def max_abs_difference(a: torch.Tensor, b: torch.Tensor, chunk_elements: int = 1 << 22) -> float:
    """max |a - b| in float64, row block by row block: a whole-tensor float64 difference of a
    large embedding would itself cost several copies of the model's biggest tensor."""
    if (a.dtype == b.dtype and torch.equal(a, b)) or a.numel() == 0:
        return 0.0
    if a.dim() == 0:
        a, b = a.reshape(1), b.reshape(1)
    rows = max(1, chunk_elements // max(1, a[0].numel()))
    worst = 0.0
    for start in range(0, a.shape[0], rows):
        x, y = a[start:start + rows].double(), b[start:start + rows].double()
        nan_mismatch = not torch.equal(x.isnan(), y.isnan())
        diff = (x - y).abs().nan_to_num(nan=0.0)  # NaN at the same places counts as equal
        worst = max(worst, float("inf") if nan_mismatch else float(diff.max()))
    return worst


def compare_written(written: Mapping[str, torch.Tensor],
                    expected: Iterable[Tuple[str, torch.Tensor]]) -> TensorComparison:
    """Compare each expected ``(name, tensor)`` with `written[name]` (shapes must agree)."""
    result = TensorComparison()
    seen = set()
    for name, reference in expected:
        if name not in written:
            raise VerificationError(f"{name} was not written")
        got = written[name]
        if tuple(got.shape) != tuple(reference.shape):
            raise VerificationError(f"{name} was written with shape {tuple(got.shape)}, "
                                    f"expected {tuple(reference.shape)}")
        diff = max_abs_difference(got, reference)
        if result.worst is None or diff > result.max_abs_diff:
            result.max_abs_diff, result.worst = diff, name
        result.tensors += 1
        result.numel += got.numel()
        seen.add(name)
    extra = sorted(set(written) - seen)
    if extra:
        raise VerificationError(f"{len(extra)} tensors were written that the source does not have "
                                f"(first: {extra[:4]})")
    return result


def with_progress(stream: Iterable, total: int, description: str, enabled: bool = True) -> Iterator:
    """`stream` with a tqdm bar on stderr (one step per tensor)."""
    if not enabled:
        yield from stream
        return

    with tqdm(total=total, desc=description, unit="tensor", file=sys.stderr, dynamic_ncols=True) as bar:
        for item in stream:
            bar.set_postfix_str(item[0][-48:], refresh=False)
            yield item
            bar.update(1)


@dataclass
class ConversionSummary:
    """Printed at the end of a conversion; also returned by `to_hf` / `from_hf`."""

    direction: str
    source: str
    output: str
    tensors: int
    source_parameters: int
    output_parameters: int
    max_abs_diff: float | None
    worst_tensor: str | None
    dtype: str
    files: List[str] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)

    def format(self) -> str:
        lines = [f"{self.direction}: {self.source} -> {self.output}",
                 f"  tensors written: {self.tensors} ({self.dtype}) in {len(self.files)} file(s)",
                 f"  parameters: source {self.source_parameters:,}, output {self.output_parameters:,}"]
        if self.max_abs_diff is None:
            lines.append("  verification: not run")
        else:
            lines.append(f"  verified by re-reading the output: max |diff| = {self.max_abs_diff:.3g}"
                         + (f" (at {self.worst_tensor})" if self.max_abs_diff else ""))
        if self.skipped:
            reasons = Counter(self.skipped.values())
            lines.append(f"  skipped {len(self.skipped)} source entries: "
                         + ", ".join(f"{n} {why}" for why, n in sorted(reasons.items())))
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
