"""Shape bucketing of padded lengths, so that compiled kernels see few distinct shapes.

Why: `torch.compile(flex_attention, dynamic=False)` (and CUDA graphs) specialise on the
sequence length, so a batch padded to 37 tokens and the next one padded to 41 compile twice.
Rounding every padded width up to a bucket (a multiple of 64, or a power of two) bounds the
number of shapes. Padding is never attended to nor read (lengths and split say what is real),
so bucketing never changes an output; it only costs the padded compute.

An adapter carries its policy as `length_buckets` (None: pad to the longest row, the default
on CPU); `engine.pad` and generation's slot forward apply it, capped at the model's positions.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LengthBuckets:
    """`multiple`: round up to a multiple of it; `pow2`: round up to a power of two (at least
    `minimum`). Exactly one of the two."""

    multiple: int | None = None
    pow2: bool = False
    minimum: int = 16

    def __post_init__(self):
        if (self.multiple is None) == (not self.pow2):
            raise ValueError("give length buckets either multiple=N or pow2=True")
        if self.multiple is not None and (isinstance(self.multiple, bool) or int(self.multiple) < 1):
            raise ValueError(f"the bucket multiple must be a positive integer, got {self.multiple!r}")

    def __call__(self, width: int, cap: int | None = None) -> int:
        """The bucketed width for `width` real columns; never below `width`, never above
        `cap` (the model's positions) unless `width` itself is."""
        width = int(width)
        if self.pow2:
            out = max(self.minimum, 1 << max(0, width - 1).bit_length())
        else:
            out = -(-width // self.multiple) * self.multiple
        if cap is not None:
            out = min(out, max(int(cap), width))
        return max(out, width)


def parse_length_buckets(spec) -> LengthBuckets | None:
    """`None`, "off", "none", 0 -> no bucketing; "pow2" -> powers of two; N or "N" -> multiples
    of N; a `LengthBuckets` passes through."""
    if spec is None or isinstance(spec, LengthBuckets):
        return spec
    text = str(spec).strip().lower()
    if text in ("off", "none", "0", "false", ""):
        return None
    if text == "pow2":
        return LengthBuckets(pow2=True)
    try:
        return LengthBuckets(multiple=int(text))
    except ValueError:
        raise ValueError(f"length buckets must be off, pow2 or a positive integer (a multiple), "
                         f"got {spec!r}") from None


def resolve_length_buckets(spec, device) -> LengthBuckets | None:
    """`parse_length_buckets`, where "auto" (the default of loaders) means multiples of 64 on
    GPU, where kernels are compiled, and no bucketing on CPU."""
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        return LengthBuckets(multiple=64) if str(device).startswith("cuda") else None
    return parse_length_buckets(spec)


def bucket_width(adapter, width: int, room: int | None = None) -> int:
    """`width` bucketed by the adapter's `length_buckets`, capped at `room` (the positions
    left after a cached prefix) or else at its `max_length`."""
    if adapter.length_buckets is None:
        return int(width)
    return adapter.length_buckets(width, room if room is not None else adapter.max_length)
