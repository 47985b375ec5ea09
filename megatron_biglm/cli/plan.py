"""`biglm-plan --config RUN.yaml [key=value ...] --nodes N --gpus-per-node G --gpu KIND`: does
the run config's layout fit the GPU's memory, and what does the run cost?

Prints, for the first and the last pipeline stage's most loaded rank, memory by part (weights,
fp32 main weights, the padded gradient buffer, optimizer states, activations per micro-batch x
those in flight under 1F1B, communication buffers, a reserve), whether it fits, and the step
time, tokens/s, bubble, un-overlapped DP communication, days and GPU-hours to `--tokens` (default:
the config's train_steps x global batch x sequence). The MFU is `--measured RUN.json` (a device
run's) or `--mfu` (assumed; 0.40 unless given). `--search` ranks the layouts that fit; `--json`
prints the same numbers as JSON. Exit 0: fits; 1: does not fit (with the nearest layout that
fits); 2: bad input. `--gpu cpu` plans for this machine's CPU kernels."""
from __future__ import annotations

import argparse
import json
import sys

from megatron_biglm.cli import refuse


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="biglm-plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="run config YAML (a preset run or any training config)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides (parallelism.*, training.*, ...)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--gpu", default="a100-80gb", help="GPU kind: a100-40gb, a100-80gb, h100-80gb, h200, cpu, "
                                                      "or one of --gpu-table")
    p.add_argument("--gpu-table", help="YAML of more GPU kinds (see megatron_biglm/planner/gpus.py)")
    p.add_argument("--tokens", type=float, help="token budget (default: the config's steps x batch x sequence)")
    p.add_argument("--mfu", type=float, help="assumed model FLOPs utilisation, 0-1")
    p.add_argument("--measured", help="JSON of a device run: its MFU is used")
    p.add_argument("--search", action="store_true", help="rank the layouts that fit this GPU count")
    p.add_argument("--top", type=int, default=10, help="layouts --search lists")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--print-layout", action="store_true",
                   help="print the config's 'TP PP MBS GBS' (overrides applied) and exit (launch/common.sh)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from megatron_biglm.config import ConfigError, load_config

    try:
        from megatron_biglm.planner.errors import PlanError
        from megatron_biglm.planner.gpus import get_gpu
        from megatron_biglm.planner.layout import Layout
        from megatron_biglm.planner.plan import plan_layout
        from megatron_biglm.planner.report import as_json, as_text, search_text
        from megatron_biglm.planner.search import nearest_fit, search_layouts
        from megatron_biglm.planner.time_model import DEFAULT_MFU, MFU, read_measured
        from megatron_biglm.planner.workload import workload_from_config

        if args.nodes < 1 or args.gpus_per_node < 1:
            raise PlanError(f"--nodes {args.nodes} and --gpus-per-node {args.gpus_per_node} must be >= 1")
        if args.mfu is not None and args.measured:
            raise PlanError("give --mfu or --measured, not both")
        if args.mfu is not None and not 0 < args.mfu <= 1:
            raise PlanError(f"--mfu {args.mfu} must lie in (0, 1]")
        gpu = get_gpu(args.gpu, args.gpu_table)
        cfg = load_config(args.config, args.overrides)
        if args.print_layout:
            par, t = cfg.parallelism, cfg.training
            print(par.tensor_model_parallel_size, par.pipeline_model_parallel_size, t.micro_batch_size,
                  t.global_batch_size)
            return 0
        w = workload_from_config(cfg, on_gpu=gpu.name != "cpu")
        mfu = read_measured(args.measured) if args.measured else MFU(args.mfu or DEFAULT_MFU, "assumed")
        world = args.nodes * args.gpus_per_node
        par, t = cfg.parallelism, cfg.training
        tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
        if tp < 1 or pp < 1 or world % (tp * pp):
            raise PlanError(f"TP*PP = {tp}*{pp} does not divide the {world} GPUs "
                            f"({args.nodes} nodes x {args.gpus_per_node})")
        layout = Layout(tp, pp, world // (tp * pp), t.micro_batch_size, t.global_batch_size, t.recompute,
                        cfg.optimizer.use_distributed_optimizer)
        tokens = args.tokens or float(cfg.schedule.train_steps * t.global_batch_size * cfg.data.seq_length)
        plan = plan_layout(w, layout, gpu, args.gpus_per_node, mfu, tokens)
        if plan.fits:  # a layout whose memory fits must also have whole micro-batches
            from megatron_biglm.planner.layout import check_layout
            mc = w.model
            check_layout(layout, num_layers=mc.num_layers, num_heads=mc.num_attention_heads,
                         num_groups=mc.query_groups, gpus_per_node=args.gpus_per_node, world=world)
        fits = misses = None
        if args.search or not plan.fits:
            fits, misses = search_layouts(w, world, args.gpus_per_node, t.global_batch_size, gpu, mfu, tokens)
    except ConfigError as exc:
        return refuse(exc, 2)
    nearest = nearest_fit(plan, fits) if not plan.fits else None
    if args.json:
        doc = as_json(plan, nearest)
        if args.search:
            doc["search"] = dict(fits=[as_json(p) for p in fits[:args.top]],
                                 near_misses=[dict(layout=as_json(p)["layout"], reason=p.reason())
                                              for p in misses[:args.top]])
        print(json.dumps(doc, indent=1))
    else:
        print(as_text(plan))
        if not plan.fits:
            print(f"does not fit: {plan.reason()}")
            print("nearest layout that fits: " + (nearest.layout.describe() if nearest else
                                                   "none for this GPU count"))
        if args.search:
            print(search_text(fits, misses, args.top))
    if not plan.fits:
        print(f"biglm-plan: does not fit: {plan.reason()}"
              + (f"; nearest that fits: {nearest.layout.describe()}" if nearest else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
