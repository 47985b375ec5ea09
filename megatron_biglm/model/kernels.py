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
from megatron.core import optimizer

from megatron_biglm.common.config_fields import ConfigError

from .attention_backends import DeriveOptions, get_backend, resolve_backend
from .attention_params import resolve_compile
from .layer_spec import resolve_transformer_impl

#: Optional accelerated packages: (import name, distribution names to read a version from).
OPTIONAL_PACKAGES = {
    "flash-attn": ("flash_attn", ("flash-attn", "flash_attn")),
    "transformer-engine": ("transformer_engine", ("transformer-engine", "transformer_engine")),
    "apex": ("apex", ("apex",)),
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
    adam = optimizer.Adam
    return f"{adam.__module__}.{adam.__qualname__}"


@dataclass(frozen=True)
class KernelReport:
    configured: str                     # model.attention_backend as written
    resolved: str                       # the registered backend attention runs (attention_backends)
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


def check_kernel(attention_backend: str, dtype: torch.dtype, attention_dropout: float = 0.0) -> str:
    """The resolved attention backend, or ConfigError saying what to pip install (or change)."""
    try:
        return resolve_backend(attention_backend, dtype, attention_dropout)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"model.attention_backend={attention_backend}: {exc}") from None


def kernel_report(attention_backend: str, dtype: torch.dtype, attention_dropout: float = 0.0,
                  attention_compile: "bool | str" = "auto", transformer_impl: str = "auto") -> KernelReport:
    """What this process will run with; ConfigError (check_kernel) when a named kernel is missing.
    ``attention_compile`` is the model's setting (`auto` compiles flex on CUDA only);
    ``transformer_impl`` the layers' modules (`layer_spec.resolve_transformer_impl`)."""
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
    words = get_backend(resolved).describe(dtype, DeriveOptions(compile_flex=compiled))
    return KernelReport(configured=attention_backend, resolved=resolved, attention=words,
                        adam=megatron_adam(), device=device, layers=layers, packages=installed_packages(),
                        versions=versions)


__all__ = ["KernelReport", "check_kernel", "installed_packages", "kernel_report"]
