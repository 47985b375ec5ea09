"""Scoring with compiled layers compiles once: a batch of fresh context and continuation
lengths, scored with prefix reuse (the growing prefix cache's per-layer ports), makes no compile
after a warm-up batch, and no graph break."""
from __future__ import annotations

import pytest
import torch
from compile_watch import compiled_megatron_adapter, describe
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.common.compile_counts import compile_counts
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule


def _requests(adapter, seed: int, n: int):
    g = torch.Generator().manual_seed(seed)
    bos, vocab = adapter.special.bos_id, 100
    out = []
    for _ in range(n):
        ctx = torch.randint(5, vocab, (int(torch.randint(2, 12, (1,), generator=g)),), generator=g).tolist()
        cont = torch.randint(5, vocab, (int(torch.randint(1, 4, (1,), generator=g)),), generator=g).tolist()
        out.append(ScoreRequest((bos, *ctx), tuple(cont)))
    return out


@pytest.mark.slow
def test_compiled_eval_batch_does_not_recompile(gen_checkpoint):  # noqa: F811
    adapter, _ = compiled_megatron_adapter(gen_checkpoint)
    rule = make_rule("pll", adapter.special.mask_id)
    start = compile_counts()
    for seed, n in ((0, 4), (1, 1)):  # warm-up: a batch of several rows, and one of a single row
        score_requests(adapter, _requests(adapter, seed, n), rule, batch_size=4, prefix_reuse=True)
    warm = compile_counts()
    assert warm.since(start).breaks == 0, describe(warm.since(start))
    results = score_requests(adapter, _requests(adapter, 7, 6), rule, batch_size=3, prefix_reuse=True)
    after = compile_counts().since(warm)
    assert len(results) == 6 and all(torch.isfinite(torch.tensor(r.logprob)) for r in results)
    assert after.compiles == 0 and after.recompiles == 0 and after.breaks == 0, describe(after)
