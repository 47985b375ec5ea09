"""The GPU table: memory, dense bf16 peak and interconnect bandwidth per kind.

Users add kinds (or correct one) with a YAML file of the same fields (`--gpu-table FILE`):
    my-gpu: {memory_gib: 48, bf16_tflops: 362, nvlink_gbps: 64, network_gbps: 25}
Bandwidths are per GPU, one direction, in GB/s: `nvlink_gbps` inside a node, `network_gbps`
between nodes (A100 HDR InfiniBand 200 Gb/s = 25 GB/s per GPU; H100/H200 NDR 400 Gb/s = 50).
`memory_gib` is what the CUDA driver reports (A100-40GB 40 GiB, H100 79.6 GiB, H200 140 GiB).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Optional

import yaml

from .errors import PlanError

GIB = 1024 ** 3


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gib: float
    bf16_tflops: float
    nvlink_gbps: float
    network_gbps: float

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)


_BUILTIN = {
    "a100-40gb": GPU("a100-40gb", 40.0, 312.0, 300.0, 25.0),
    "a100-80gb": GPU("a100-80gb", 80.0, 312.0, 300.0, 25.0),
    "h100-80gb": GPU("h100-80gb", 79.6, 989.0, 450.0, 50.0),
    "h200": GPU("h200", 140.0, 989.0, 450.0, 50.0),
}


def _cpu() -> GPU:
    """This machine's CPU as one 'device': its RAM, a nominal 1 TFLOP/s (give --mfu or
    --measured for times), gloo over shared memory/loopback."""
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        mem = 16.0
    return GPU("cpu", round(mem, 1), 1.0, 5.0, 1.0)


def load_gpu_table(path) -> dict[str, GPU]:
    """Extra kinds from a YAML file `{kind: {memory_gib, bf16_tflops, nvlink_gbps, network_gbps}}`."""
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    if not isinstance(doc, dict):
        raise PlanError(f"{path}: a GPU table is a mapping of kind -> fields")
    names = [f.name for f in fields(GPU) if f.name != "name"]
    out = {}
    for kind, spec in doc.items():
        if not isinstance(spec, dict) or sorted(spec) != sorted(names):
            raise PlanError(f"{path}: GPU kind {kind!r} needs exactly the fields {names}, got {spec!r}")
        try:
            out[str(kind).lower()] = GPU(str(kind).lower(), **{k: float(v) for k, v in spec.items()})
        except (TypeError, ValueError):
            raise PlanError(f"{path}: GPU kind {kind!r}: every field is a number, got {spec!r}") from None
    return out


def gpu_table(extra_path: Optional[str] = None) -> dict[str, GPU]:
    """The built-in kinds, `cpu`, and those of `extra_path` (which win on a name clash)."""
    table = dict(_BUILTIN)
    table["cpu"] = _cpu()
    if extra_path:
        table.update(load_gpu_table(extra_path))
    return table


def get_gpu(kind: str, extra_path: Optional[str] = None) -> GPU:
    table = gpu_table(extra_path)
    key = kind.lower()
    if key not in table:
        raise PlanError(f"--gpu {kind!r} is not a known GPU kind; choose one of {sorted(table)} "
                        "(or add it with --gpu-table FILE.yaml)")
    return table[key]
