"""TP=2 and PP=2 (torchrun, 2 CPU processes, gloo) match TP=1/PP=1 from the same weights.

One torchrun job runs every layout in turn (re-initialising megatron's groups), each through
megatron's real training path: the DDP wrapper, `get_forward_backward_func` (1F1B under PP,
two micro-batches) and `finalize_model_grads` (tied-embedding and sequence-parallel norm
gradient reductions). Weights come from one seeded full state dict, sharded per rank; the test
compares each rank's loss and gradients with the TP=1/PP=1 run's, sharded the same way.
"""
from __future__ import annotations

import functools

import pytest
import torch

from torchrun_util import run_function

LAYOUTS = [  # (tensor parallel, pipeline parallel, sequence parallel)
    (1, 1, False),
    (2, 1, False),
    (2, 1, True),
    (1, 2, False),
]
SHAPE = dict(num_layers=4, seq=48, micro_batch=2, micro_batches=2, weight_seed=3)


def _forward_step(data_iterator, model):
    from megatron_biglm.model.loss import masked_lm_loss_func

    batch = next(data_iterator)
    out = model(batch["input_ids"], split=batch["split"], labels=batch["labels"],
                loss_mask=batch["loss_mask"])
    return out, functools.partial(masked_lm_loss_func, batch["loss_mask"])


def run_layout(tp: int, pp: int, sp: bool) -> dict:
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from model_fixtures import build_model, init_megatron, load_weights, random_batch
    from model_fixtures import random_full_state_dict, shard_for_rank, tiny_config

    init_megatron(tp, pp)
    cfg = tiny_config(num_layers=SHAPE["num_layers"])
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    model = build_model(
        cfg, seed=0,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        sequence_parallel=sp,
    )
    full = random_full_state_dict(cfg, seed=SHAPE["weight_seed"])
    load_weights(model, shard_for_rank(full, cfg, tp_rank, tp, pp_rank, pp))
    ddp = DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True),
        module=model,
    )
    model.config.finalize_model_grads_func = finalize_model_grads
    model.config.no_sync_func = ddp.no_sync
    ddp.zero_grad_buffer()
    batches = [random_batch(cfg, SHAPE["micro_batch"], SHAPE["seq"], seed=100 + i)
               for i in range(SHAPE["micro_batches"])]
    losses = get_forward_backward_func()(
        forward_step_func=_forward_step,
        data_iterator=iter(batches),
        model=[ddp],
        num_microbatches=len(batches),
        seq_length=SHAPE["seq"],
        micro_batch_size=SHAPE["micro_batch"],
        forward_only=False,
    )
    loss = None
    if parallel_state.is_pipeline_last_stage():
        total = torch.stack([d["lm loss"] for d in losses]).sum(0)
        loss = (total[0] / total[1]).item()
    grads = {n: p.main_grad.float().tolist() for n, p in model.named_parameters()}
    return dict(loss=loss, grads=grads, tp_rank=tp_rank, pp_rank=pp_rank)


def worker(layouts) -> dict:
    return {f"{tp},{pp},{int(sp)}": run_layout(tp, pp, sp) for tp, pp, sp in layouts}


@pytest.mark.slow
def test_tp2_and_pp2_match_tp1_pp1():
    from model_fixtures import shard_for_rank, tiny_config

    res = run_function("tests/model/test_parallel_model.py:worker", nproc=2,
                       kwargs={"layouts": LAYOUTS}, timeout=400).check()
    cfg = tiny_config(num_layers=SHAPE["num_layers"])
    ref = res.results[0]["1,1,0"]
    assert ref == res.results[1]["1,1,0"]  # two data-parallel replicas of the reference
    ref_full = {n: torch.tensor(g) for n, g in ref["grads"].items()}
    for tp, pp, sp in LAYOUTS[1:]:
        for rank in (0, 1):
            got = res.results[rank][f"{tp},{pp},{int(sp)}"]
            where = f"tp={tp} pp={pp} sp={sp} rank={rank}"
            if got["loss"] is not None:
                assert abs(got["loss"] - ref["loss"]) <= 1e-6, where
            expected = shard_for_rank(ref_full, cfg, got["tp_rank"], tp, got["pp_rank"], pp)
            assert set(got["grads"]) == set(expected), where
            for name, grad in got["grads"].items():
                torch.testing.assert_close(
                    torch.tensor(grad), expected[name], atol=1e-6, rtol=1e-4,
                    msg=lambda m: f"{where} {name}: {m}")
        losses = [res.results[r][f"{tp},{pp},{int(sp)}"]["loss"] for r in (0, 1)]
        assert any(v is not None for v in losses)  # the last stage reported a loss

