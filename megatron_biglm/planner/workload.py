"""What a run computes, from its run config: the model shape, sequence, precision, attention
kernel, the share of rows that reach the head, and megatron DDP's settings on the target."""
from __future__ import annotations

from dataclasses import dataclass

from megatron_biglm.model.config import FUSED_LOSS_CHUNK, BiGLMModelConfig
from megatron_biglm.training.flops import expected_pair_fraction

#: attention backends that keep no s×s mask or score matrix (they save the log-sum-exp)
SPLIT_KERNELS = ("flash", "varlen", "flex", "sdpa_split")
#: the default megatron DDP bucket when gradient reduction overlaps the backward pass
DEFAULT_BUCKET = 40_000_000


@dataclass(frozen=True)
class Workload:
    model: BiGLMModelConfig
    seq_length: int
    precision: str              # bf16 | fp32 (the weights' and activations' dtype)
    attention_backend: str      # the concrete kernel (auto resolved for the target)
    predicted_fraction: float   # mean share of tokens that reach the output layer
    predicted_fraction_peak: float  # the largest share one sample can have (memory peak)
    pair_fraction: float        # mean share of the L² (query, key) pairs attention scores
    overlap_grad_reduce: bool
    train_steps: int
    loss_chunk: int

    @property
    def dtype_bytes(self) -> int:
        return 2 if self.precision == "bf16" else 4


def _objective_fractions(obj) -> tuple[float, float, float]:
    """(mean predicted share, peak predicted share, mean attended-pair share) of an objective."""
    if obj.variant == "mlm":
        return obj.mlm_ratio, obj.mlm_ratio, 1.0
    lo, hi = obj.beta_y_range
    beta_y = (lo + hi) / 2
    if obj.prefix_mode == "adaptive":
        beta_x, beta_x_at = obj.lambda1 - obj.lambda2 * beta_y, obj.lambda1 - obj.lambda2 * hi
    else:
        beta_x, beta_x_at = sum(obj.beta_x_range) / 2, max(obj.beta_x_range)
    mean = 0.5 * beta_x + 0.5 * beta_y  # the split is symmetric about L/2
    a = obj.alpha
    peak = max(a * beta_x_at + (1 - a) * hi, (1 - a) * beta_x_at + a * hi)
    pairs = expected_pair_fraction(a) if obj.variant == "biglm" else 1.0
    return mean, min(1.0, peak), pairs


def resolve_backend_for(name: str, precision: str, gpu: bool, dropout: float) -> str:
    """The kernel `auto` gets on the target: on a GPU in bf16 the split kernels (flash or
    torch's varlen; flex without them), sdpa with attention dropout or on the CPU."""
    if name != "auto":
        return name
    if not gpu:
        return "sdpa"
    if dropout:
        return "sdpa"
    return "varlen" if precision == "bf16" else "flex"


def workload_from_config(cfg, *, on_gpu: bool) -> Workload:
    """The workload of a loaded `RunConfig`, on a GPU target or on the CPU."""
    mc = cfg.model.resolved
    t = cfg.training
    precision = t.precision if t.precision != "auto" else ("bf16" if on_gpu else "fp32")
    mean, peak, pairs = _objective_fractions(cfg.objective.resolved)
    overlap = on_gpu if t.overlap_grad_reduce == "auto" else bool(t.overlap_grad_reduce)
    return Workload(model=mc, seq_length=cfg.data.seq_length, precision=precision,
                    attention_backend=resolve_backend_for(mc.attention_backend, precision, on_gpu,
                                                          float(mc.attention_dropout)),
                    predicted_fraction=mean, predicted_fraction_peak=peak, pair_fraction=pairs,
                    overlap_grad_reduce=overlap, train_steps=cfg.schedule.train_steps,
                    loss_chunk=FUSED_LOSS_CHUNK)
