"""Which kernels a run uses, and the versions it runs on: the report a training run prints at
start, and the refusal of a config that names a kernel that is not installed.

Why a report: the attention backend `auto` resolves differently per machine (flash with
flash-attn on CUDA, torch's varlen attention on CUDA, flex on CUDA, else sdpa), and megatron-core picks its Adam from
Transformer Engine, then Apex, then torch. A slow or odd run is first explained by what was
actually in use, so the first lines of a run's log say it. Why refuse early: a config that
asks for `flash` on a machine without flash-attn would otherwise fail when the first layer
is built; here it fails before any data is read, with the package to install.
"""
from __future__ import annotations

import importlib.util
import platform
from dataclasses import dataclass, field
from importlib import metadata

import torch

from megatron_biglm.common.config_fields import ConfigError

from .attention_params import FLASH_DTYPES, flash_attn_available, resolve_backend, resolve_compile

#: Optional accelerated packages: (import name, distribution names to read a version from).
OPTIONAL_PACKAGES = {
    "flash-attn": ("flash_attn", ("flash-attn", "flash_attn")),
    "transformer-engine": ("transformer_engine", ("transformer-engine", "transformer_engine")),
    "apex": ("apex", ("apex",)),
}
#: What a config naming a kernel needs installed, and how to install it.
INSTALL_HINTS = {
    "flash": "pip install flash-attn --no-build-isolation (or the 'gpu' extra: pip install -e '.[gpu]')",
}
VERSIONED = ("torch", "megatron-core", "transformers")


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def installed_packages() -> dict[str, str | None]:
    """Optional kernel packages -> installed version ("installed" when it has no metadata),
    or None when the package cannot be imported here."""
    found = {}
    for label, (module, distributions) in OPTIONAL_PACKAGES.items():
        if importlib.util.find_spec(module) is None:
            found[label] = None
        else:
            found[label] = _version(*distributions) or "installed"
    return found


def megatron_adam() -> str:
    """The Adam class megatron-core's optimizer uses here (TE's or Apex's fused one, else torch's)."""
    from megatron.core import optimizer

    adam = optimizer.Adam
    return f"{adam.__module__}.{adam.__qualname__}"


@dataclass(frozen=True)
class KernelReport:
    configured: str                     # model.attention_backend as written
    resolved: str                       # what attention runs: sdpa, flex, flash, local, sdpa_split or varlen
    attention: str                      # the resolved kernel, in words
    adam: str                           # megatron-core's Adam class
    device: str
    layers: str = "local"               # the layers' modules: local or transformer_engine
    packages: dict = field(default_factory=dict)  # optional kernel package -> version or None
    versions: dict = field(default_factory=dict)  # python, torch, megatron-core, transformers

    def lines(self) -> list[str]:
        packages = ", ".join(f"{k} {v}" if v else f"{k} not installed" for k, v in self.packages.items())
        versions = ", ".join(f"{k} {v or 'not installed'}" for k, v in self.versions.items())
        return [f"kernels: attention {self.resolved} (model.attention_backend={self.configured}): {self.attention}",
                f"kernels: layers {self.layers}; optimizer {self.adam}; device {self.device}",
                f"kernels: packages: {packages}",
                f"versions: {versions}"]

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _attention_words(resolved: str, dtype: torch.dtype, compiled: bool) -> str:
    if resolved == "flash":
        return f"flash-attn varlen ({dtype})"
    if resolved == "flex":
        return "FlexAttention, " + ("compiled (torch.compile)" if compiled else "eager (not compiled)")
    if resolved == "local":
        return "megatron's unfused DotProductAttention"
    if resolved == "sdpa_split":
        return "torch scaled_dot_product_attention, two mask-free calls per group of equal splits"
    if resolved == "varlen":
        return f"torch varlen attention (torch.nn.attention.varlen), one call over prefix/suffix segments ({dtype})"
    return "torch scaled_dot_product_attention with a dense mask"


def check_kernel(attention_backend: str, dtype: torch.dtype, attention_dropout: float = 0.0) -> str:
    """The resolved attention backend, or ConfigError saying what to pip install (or change)."""
    if attention_backend == "flash" and not flash_attn_available():
        where = "" if torch.cuda.is_available() else " and a CUDA device (this machine has none)"
        raise ConfigError(f"model.attention_backend=flash needs the flash-attn package{where}: "
                          f"{INSTALL_HINTS['flash']}; or set model.attention_backend to auto, flex or sdpa")
    if attention_backend == "flash" and dtype not in FLASH_DTYPES:
        raise ConfigError(f"model.attention_backend=flash computes in fp16/bf16 only, the run is {dtype}; set "
                          f"training.precision=bf16, or model.attention_backend to auto, flex or sdpa")
    try:
        return resolve_backend(attention_backend, dtype, attention_dropout)
    except (ValueError, ImportError) as exc:
        raise ConfigError(str(exc)) from None


def kernel_report(attention_backend: str, dtype: torch.dtype, attention_dropout: float = 0.0,
                  attention_compile: "bool | str" = "auto", transformer_impl: str = "auto") -> KernelReport:
    """What this process will run with; ConfigError (check_kernel) when a named kernel is missing.
    ``attention_compile`` is the model's setting (`auto` compiles flex on CUDA only);
    ``transformer_impl`` the layers' modules (`layer_spec.resolve_transformer_impl`)."""
    from .layer_spec import resolve_transformer_impl

    resolved = check_kernel(attention_backend, dtype, attention_dropout)
    try:
        layers = resolve_transformer_impl(transformer_impl)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    cuda = torch.cuda.is_available()
    device = f"cuda ({torch.cuda.get_device_name()})" if cuda else "cpu"
    compiled = resolve_compile(attention_compile, "cuda" if cuda else "cpu")
    # torch's own version string names its build (+cpu, +cu130), which package metadata drops
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                **{name: _version(name) for name in VERSIONED if name != "torch"}}
    return KernelReport(configured=attention_backend, resolved=resolved, attention=_attention_words(resolved, dtype, compiled),
                        adam=megatron_adam(), device=device, layers=layers, packages=installed_packages(),
                        versions=versions)


__all__ = ["INSTALL_HINTS", "KernelReport", "check_kernel", "installed_packages", "kernel_report"]
