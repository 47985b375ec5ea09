"""Single-process megatron-core scenarios for the CPU-shim tests, run as a subprocess:

    python tests/patches_cpu_scenarios.py SCENARIO [SCENARIO ...] [--skip SHIM ...]

Prints one JSON line {"applied": [...], SCENARIO: result, ...}; a result holds the
scenario's measurements, or {"error_type", "error", "raised_in"} (the deepest megatron-core
frame) when it failed. Several scenarios share one process to pay megatron's import once.
Why a subprocess: the shims patch torch globally and must not leak into the pytest process.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

import torch  # noqa: E402


def scenario_train_step(distopt: bool) -> dict:
    """One megatron step (DDP + get_megatron_optimizer + get_forward_backward_func) against
    plain PyTorch (autograd, clip_grad_norm_, torch AdamW) on a copy of the same model."""
    import patches_fixtures as fx
    from megatron.core.distributed import finalize_model_grads

    fx.init_single_process()
    fx.init_parallel(1, 1)
    config = fx.tiny_config()
    model = fx.build_gpt(config)
    reference = fx.build_gpt(config)  # same seed: same weights (modules hold process groups)
    ddp_model = fx.wrap_ddp(config, model, distopt)
    config.finalize_model_grads_func = finalize_model_grads
    optimizer = fx.make_optimizer(ddp_model, distopt, lr=1e-2, clip_grad=0.5)  # clips: norm ~0.72
    result = fx.train_steps(ddp_model, optimizer, [0])

    ref_loss, ref_norm = _plain_torch_step(reference, fx, lr=1e-2, clip=0.5)
    ref_params = dict(reference.named_parameters())
    diffs = [
        (param.detach() - ref_params[name].detach()).abs().max().item()
        for name, param in ddp_model.module.named_parameters()
    ]
    moved = [
        (param.detach() - ref_params[name].detach()).abs().max().item()
        for name, param in fx.build_gpt(config).named_parameters()
    ]
    grad_devices = sorted({b.grad_data.device.type for b in ddp_model.buffers})
    return {
        "loss": result["losses"][0], "ref_loss": ref_loss,
        "grad_norm": result["grad_norms"][0], "ref_grad_norm": ref_norm,
        "max_param_diff": max(diffs), "min_update_size": min(moved),
        "grad_buffer_devices": grad_devices,
    }


def _plain_torch_step(model, fx, lr: float, clip: float):
    """Megatron's step, written with torch only: mean loss over microbatches, global-norm
    clip, AdamW. Every parameter decays: megatron's no-decay groups (wd_mult=0) only take
    effect through OptimizerParamScheduler, which this step does not use."""
    model.zero_grad()
    losses = []
    positions = torch.arange(fx.SEQ).expand(fx.MICRO_BATCH, fx.SEQ)
    for batch in fx.fixed_microbatches(0):
        loss = model(batch["tokens"], positions, fx.causal_mask(), labels=batch["labels"])
        loss = loss.float().mean()
        (loss / fx.NUM_MICROBATCHES).backward()
        losses.append(loss.item())
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    torch.optim.AdamW(
        model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01
    ).step()
    return sum(losses) / len(losses), norm


def scenario_rng() -> dict:
    """megatron's tracker after model_parallel_cuda_manual_seed, and recompute through it."""
    from megatron.core import tensor_parallel

    seed = 1234
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed, tp_rank=0, ep_rank=0, etp_rank=0)
    tracker = tensor_parallel.get_cuda_rng_tracker()

    expected_tp = torch.rand(5, generator=torch.Generator().manual_seed(seed + 2718)).tolist()
    default_expected = torch.rand(3, generator=torch.Generator().manual_seed(seed)).tolist()
    with tracker.fork():  # "model-parallel-rng"
        drawn_tp = torch.rand(5).tolist()
    default_after_fork = torch.rand(3).tolist()
    with tracker.fork():  # continues its own stream, not restarted
        drawn_tp_next = torch.rand(2).tolist()
    expected_tp_next = torch.rand(7, generator=torch.Generator().manual_seed(seed + 2718))[5:]

    # Activation recompute restores the forked state: dropout masks must match.
    x = torch.ones(64, 16, requires_grad=True)

    def dropped(inp):
        with tracker.fork():
            return torch.nn.functional.dropout(inp, p=0.5, training=True)

    out = tensor_parallel.checkpoint(dropped, False, x)
    out.sum().backward()
    kept_in_forward = out.detach() != 0
    kept_in_recompute = x.grad != 0
    return {
        "tracker_class": type(tracker).__name__,
        "tp_draw_matches_seed_plus_2718": drawn_tp == expected_tp,
        "tp_stream_continues": drawn_tp_next == expected_tp_next.tolist(),
        "default_stream_untouched_by_fork": default_after_fork == default_expected,
        "recompute_mask_matches": bool(torch.equal(kept_in_forward, kept_in_recompute)),
        "dropout_fraction": 1 - kept_in_forward.float().mean().item(),
    }


def scenario_streams() -> dict:
    """megatron.core.pipeline_parallel.utils.set_streams, used by the overlapped 1F1B."""
    from megatron.core.pipeline_parallel import utils as pp_utils

    pp_utils.set_streams()
    comp, comm = pp_utils.get_comp_stream(), pp_utils.get_comm_stream()
    comm.wait_stream(comp)
    a, b = torch.arange(6.0), torch.full((6,), 2.0)
    with torch.cuda.stream(comm):
        c = a * b
    comp.wait_stream(comm)
    return {"product": c.tolist(), "stream_type": type(comm).__name__}


SCENARIOS = {
    "train_step": lambda: scenario_train_step(distopt=False),
    "train_step_distopt": lambda: scenario_train_step(distopt=True),
    "rng": scenario_rng,
    "streams": scenario_streams,
}


def _raised_in(exc: BaseException) -> str:
    """The deepest traceback frame inside megatron-core, as "megatron/...py:function"."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if "/megatron/" in frame.filename:
            where = "megatron/" + frame.filename.split("/megatron/", 1)[1] + ":" + frame.name
    return where


def main(argv) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--skip", nargs="*", default=[])
    args = parser.parse_args(argv)

    from megatron_biglm import patches

    report = {"applied": patches.apply_cpu(force=True, skip=args.skip)}
    for name in args.scenarios:
        try:
            report[name] = SCENARIOS[name]()
        except Exception as exc:  # reported, not swallowed: the test asserts on it
            report[name] = {
                "error_type": type(exc).__name__, "error": str(exc), "raised_in": _raised_in(exc)
            }
    print("SCENARIO_RESULT " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
