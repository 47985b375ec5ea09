"""A tiny megatron-core GPT training setup, shared by the patches tests' subprocess workers.

Why its own module: the tests must never apply the CPU shims in the pytest process (they
patch torch globally), so every megatron run happens in a subprocess or torchrun rank that
imports this module. Built only from megatron-core primitives: GPTModel (local spec),
megatron DDP, get_megatron_optimizer, get_forward_backward_func.
"""
from __future__ import annotations

from typing import Iterable, List

import torch

VOCAB = 64
SEQ = 32
MICRO_BATCH = 2
NUM_MICROBATCHES = 2


def init_single_process() -> None:
    """gloo world of one, for tests that need no torchrun (the package's one group setup)."""
    from megatron_biglm.common.process_groups import init_default_group

    init_default_group("gloo")


def init_parallel(tp: int = 1, pp: int = 1, seed: int = 1234) -> None:
    """Megatron parallel groups plus the RNG seeding megatron expects (CPU: see cpu_rng_tracker)."""
    from megatron.core import tensor_parallel

    from megatron_biglm.common.process_groups import init_model_parallel

    init_model_parallel(tp, pp)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def tiny_config(tp: int = 1, pp: int = 1, **overrides):
    """Rope + GQA + SwiGLU + RMSNorm, no bias, fp32: the BiGLM block shape, tiny."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    fields = dict(
        num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
        ffn_hidden_size=64, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, normalization="RMSNorm", hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, params_dtype=torch.float32,
        pipeline_dtype=torch.float32, tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def build_gpt(config, seed: int = 1234):
    """This rank's pipeline stage of a tiny GPTModel, initialized identically in every layout.

    Weights come from the CPU RNG (use_cpu_initialization): each TP rank draws the full
    master weight and keeps its slice. For PP, the ranks first build (and drop) the earlier
    stages so that this stage's draws land where they would in the unsplit model.
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    torch.manual_seed(seed)
    model = None
    for stage in range(pp_rank + 1):
        model = GPTModel(
            config, spec, vocab_size=VOCAB, max_sequence_length=SEQ,
            pre_process=stage == 0, post_process=stage == pp_size - 1,
            position_embedding_type="rope", share_embeddings_and_output_weights=False,
        )
    return model


def fixed_microbatches(step: int, seed: int = 99) -> List[dict]:
    """Deterministic token microbatches for a step (same on every rank)."""
    gen = torch.Generator().manual_seed(seed + step)
    batches = []
    for _ in range(NUM_MICROBATCHES):
        tokens = torch.randint(0, VOCAB, (MICRO_BATCH, SEQ + 1), generator=gen)
        batches.append({"tokens": tokens[:, :-1], "labels": tokens[:, 1:]})
    return batches


def causal_mask() -> torch.Tensor:
    """bool [1,1,s,s], True = masked out (megatron's convention)."""
    return torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1)[None, None]


def _loss_func(output_tensor):
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach().clone()}  # the schedule divides loss in place


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    positions = torch.arange(SEQ).expand(MICRO_BATCH, SEQ)
    output = model(batch["tokens"], positions, causal_mask(), labels=batch["labels"])
    return output, _loss_func


def wrap_ddp(config, model, distributed_optimizer: bool):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=False, use_distributed_optimizer=distributed_optimizer
    )
    return DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)


def make_optimizer(ddp_model, distributed_optimizer: bool, lr: float = 1e-2, clip_grad=1.0):
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    opt_config = OptimizerConfig(
        optimizer="adam", lr=lr, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
        clip_grad=clip_grad, use_distributed_optimizer=distributed_optimizer,
        bf16=False, fp16=False, params_dtype=torch.float32,
    )
    return get_megatron_optimizer(opt_config, [ddp_model])


def build_training(config, distributed_optimizer: bool, seed: int = 1234, lr: float = 1e-2):
    """(ddp_model, optimizer) with the schedule's grad-finalize hook wired as megatron expects."""
    from megatron.core.distributed import finalize_model_grads

    model = build_gpt(config, seed)
    ddp_model = wrap_ddp(config, model, distributed_optimizer)
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = make_optimizer(ddp_model, distributed_optimizer, lr=lr)
    return ddp_model, optimizer


def train_steps(ddp_model, optimizer, steps: Iterable[int]) -> dict:
    """Run the given steps through get_forward_backward_func; per-step loss and grad norm.

    loss is None on ranks that are not the last pipeline stage."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    forward_backward = get_forward_backward_func()
    losses, grad_norms = [], []
    for step in steps:
        ddp_model.zero_grad_buffer()
        optimizer.zero_grad()
        reduced = forward_backward(
            forward_step_func=_forward_step,
            data_iterator=iter(fixed_microbatches(step)),
            model=[ddp_model], num_microbatches=NUM_MICROBATCHES, seq_length=SEQ,
            micro_batch_size=MICRO_BATCH, forward_only=False,
        )
        ok, grad_norm, _ = optimizer.step()
        assert ok, f"optimizer step {step} was skipped"
        losses.append(
            float(sum(r["lm loss"] for r in reduced) / len(reduced)) if reduced else None
        )
        grad_norms.append(float(grad_norm))
    return {"losses": losses, "grad_norms": grad_norms}


def full_state(ddp_model) -> dict:
    """This rank's parameters as name -> list (for exact comparisons)."""
    return {
        name: param.detach().reshape(-1).tolist()
        for name, param in ddp_model.module.named_parameters()
    }

