"""Cost of the CPU shims' TorchFunctionMode on a megatron-core forward+backward.

`patches.apply_cpu()` enters one TorchFunctionMode (patches/_function_mode.py) that sees
every torch op of the thread, to rewrite CUDA placements. This measures what that Python hop
costs: the same GPTModel step with the mode active vs the mode popped for the step (every
other shim stays applied; a forward+backward needs none of the mode's rewrites). Steps
alternate between the two (the machine is shared); medians.

    python -m benchmarks cpu_shims [--batch 8] [--seq 256] [--hidden 256] [--layers 4]
                                   [--steps 8] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def _build(args):
    import torch
    import torch.nn.functional as F
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from megatron_biglm.common import process_groups

    process_groups.init_default_group("gloo")  # the shims put the model on the CPU
    process_groups.init_model_parallel(1, 1)
    torch.manual_seed(0)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=4,
        num_query_groups=2, ffn_hidden_size=args.hidden * 8 // 3, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, normalization="RMSNorm",
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
    )
    model = GPTModel(
        config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=args.vocab,
        max_sequence_length=args.seq, position_embedding_type="rope",
    )
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq))
    positions = torch.arange(args.seq).expand(args.batch, args.seq)
    mask = torch.ones(args.seq, args.seq, dtype=torch.bool).triu(1)[None, None]
    return model, (tokens, positions, mask)


def _step(model, data) -> float:
    tokens, positions, mask = data
    start = time.perf_counter()
    loss = model(tokens, positions, mask, labels=tokens).float().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def _ops_per_step(model, data) -> int:
    """Torch-function calls the mode sees in one step (counted by a pass-through mode)."""
    from torch.overrides import TorchFunctionMode, _pop_mode_temporarily

    class Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    with _pop_mode_temporarily(), Count():
        _step(model, data)
    return Count.calls


def _per_op_overhead_us(repeats: int = 20000) -> float:
    """Extra microseconds per op that the mode adds, on a 1-element add (op cost ~0)."""
    import torch
    from torch.overrides import _pop_mode_temporarily

    a, b = torch.ones(1), torch.ones(1)

    def loop():
        start = time.perf_counter()
        for _ in range(repeats):
            torch.add(a, b)
        return (time.perf_counter() - start) / repeats

    on = min(loop() for _ in range(3))
    with _pop_mode_temporarily():
        off = min(loop() for _ in range(3))
    return (on - off) * 1e6


def main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cpu_shims")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch
    from torch.overrides import _pop_mode_temporarily
    from megatron_biglm import patches

    torch.set_num_threads(args.threads)
    applied = patches.apply_cpu(force=True)
    model, data = _build(args)
    params = sum(p.numel() for p in model.parameters())
    _step(model, data)  # warm-up, both ways
    with _pop_mode_temporarily():
        _step(model, data)
    with_mode, without_mode = [], []
    for i in range(args.steps):  # alternate which goes first: cancels order effects
        if i % 2:
            with_mode.append(_step(model, data))
        with _pop_mode_temporarily():
            without_mode.append(_step(model, data))
        if not i % 2:
            with_mode.append(_step(model, data))
    on, off = statistics.median(with_mode), statistics.median(without_mode)
    ops, per_op = _ops_per_step(model, data), _per_op_overhead_us()
    print(f"shims applied: {', '.join(applied)}")
    print(f"GPTModel {params / 1e6:.1f}M params, batch {args.batch} x seq {args.seq}, "
          f"{args.threads} threads, {args.steps} interleaved steps")
    print(f"fwd+bwd with CpuShimMode   : {on * 1e3:8.1f} ms (median)")
    print(f"fwd+bwd mode popped (base) : {off * 1e3:8.1f} ms (median)")
    print(f"ratio with/without         : {on / off:.3f}")
    print(f"ops seen per step {ops}, mode overhead {per_op:.2f} us/op -> estimated "
          f"{ops * per_op / 1e3:.1f} ms/step = {ops * per_op / 1e3 / (off * 1e3):.2%} of the step")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
