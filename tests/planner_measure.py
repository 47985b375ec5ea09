"""Measure what the planner predicts, on the real megatron model on CPU: the bytes of weights,
main weights, gradient buffer and optimizer states of this rank after one optimizer step, and
the bytes one micro-batch's forward saves for backward. Used in-process and inside torchrun
workers (nothing here depends on pytest)."""
from __future__ import annotations

import torch

#: small shapes that are not presets: GQA (4 heads, 2 groups), 2 or 4 layers
SHAPE = dict(num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=160, vocab_size=300, seq_length=128, make_vocab_size_divisible_by=128)


def model_config(**over):
    from megatron_biglm.model.config import BiGLMModelConfig

    return BiGLMModelConfig.from_dict({**SHAPE, "attention_backend": "sdpa", "compile_layers": False,
                                       "transformer_impl": "local", **over})


def run_config(mc_over=None, **sections):
    """A RunConfig of the test shape (`sections`: dotted key=value overrides)."""
    from megatron_biglm.config import load_config

    model = {"preset": "tiny", **SHAPE, "attention_backend": "sdpa", "compile_layers": False,
             "transformer_impl": "local", **(mc_over or {})}
    overrides = [f"{k}={v}" for k, v in sections.items()]
    return load_config({"model": model, "data": {"seq_length": SHAPE["seq_length"]}}, overrides)


def _storages(tensors):
    out = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        out[s.data_ptr()] = s.nbytes()
    return out


def measure_static(tp: int, pp: int, distopt: bool, precision: str) -> dict:
    """This rank's static bytes by part, after building the model and optimizer as training
    does and taking one optimizer step (zero gradients)."""
    from megatron.core import parallel_state

    from megatron_biglm.common import process_groups
    from megatron_biglm.config import OptimizerConfig, TrainingConfig
    from megatron_biglm.training.build import build_model, build_optimizer
    from megatron_biglm.training.ddp_settings import ddp_config

    process_groups.init_model_parallel(tp, pp)
    torch.manual_seed(0)
    from megatron.core import tensor_parallel
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    mc = model_config()
    training = TrainingConfig(precision=precision, allow_cpu_bf16=True)
    chunks, _ = build_model(mc, precision, ddp_config(training, distopt), "none")
    optimizer = build_optimizer(OptimizerConfig(use_distributed_optimizer=distopt), chunks, precision)
    optimizer.zero_grad()
    optimizer.step()
    params = [p for c in chunks for p in c.parameters()]
    weights = _storages(params)
    grads = {k: v for k, v in _storages(getattr(p, "main_grad", None) for p in params).items() if k not in weights}
    inner = [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]
    main = {}
    states = {}
    for opt in inner:
        for group in opt.param_groups:
            for k, v in _storages(group["params"]).items():
                if k not in weights and k not in grads:
                    main[k] = v
        for st in opt.state.values():
            for k, v in _storages(t for t in st.values() if torch.is_tensor(t)).items():
                if k not in weights and k not in grads and k not in main:
                    states[k] = v
    return dict(stage=parallel_state.get_pipeline_model_parallel_rank(),
                dp=parallel_state.get_data_parallel_world_size(),
                dp_rank=parallel_state.get_data_parallel_rank(),
                weights=sum(weights.values()), main_weights=sum(main.values()),
                grads=sum(grads.values()), optimizer=sum(states.values()))


def static_grid_worker(cases) -> list:
    """Every (tp, pp, distopt, precision) case of `cases` on this rank."""
    from megatron_biglm import patches

    patches.apply_cpu()
    return [dict(case=list(c), **measure_static(*c)) for c in cases]


def measure_activations(seq: int, mbs: int, recompute: str, backend: str, precision: str,
                        predicted: int, seed: int = 0) -> int:
    """Bytes one micro-batch's forward (loss included) saves for backward on this rank: each
    storage counted once, parameters left out (torch.autograd.graph.saved_tensors_hooks).
    `predicted` rows per sample carry a label (the first ones of the suffix)."""
    from megatron.core import parallel_state, tensor_parallel

    from megatron_biglm.training.build import build_module

    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    mc = model_config(attention_backend=backend, seq_length=max(seq, SHAPE["seq_length"]))
    module, _ = build_module(mc, precision, recompute)
    module.train()
    split = torch.full((mbs,), seq // 2, dtype=torch.long)
    ids = torch.randint(0, mc.vocab_size, (mbs, seq))
    loss_mask = torch.zeros(mbs, seq, dtype=torch.long)
    loss_mask[:, seq // 2: seq // 2 + predicted] = 1
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params and s.data_ptr() != 0:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(ids, split=split, labels=ids, loss_mask=loss_mask)
    del out
    assert parallel_state.get_pipeline_model_parallel_world_size() == 1
    return sum(seen.values())


def activation_grid_worker(cells) -> list:
    from megatron_biglm import patches
    from megatron_biglm.common import process_groups

    patches.apply_cpu()
    out = []
    for cell in cells:
        seq, mbs, tp, recompute, backend, precision, predicted = cell
        process_groups.init_model_parallel(tp, 1)
        out.append(dict(cell=list(cell), bytes=measure_activations(seq, mbs, recompute, backend, precision,
                                                                   predicted)))
    return out
