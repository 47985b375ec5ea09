"""Scoring with compiled layers compiles once: a batch of fresh context and continuation
lengths, scored with prefix reuse (the growing prefix cache's per-layer ports), makes no compile
after a warm-up batch, and no graph break."""
from __future__ import annotations

import pytest
import torch
from compile_watch import fresh_dynamo, compiled_megatron_adapter, describe
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.common.compile_counts import compile_counts
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule


def _requests(adapter, seed: int, n: int, same_length: bool = False):
    g = torch.Generator().manual_seed(seed)
    bos, vocab = adapter.special.bos_id, 100
    out = []
    for _ in range(n):
        width, length = (6, 2) if same_length else (int(torch.randint(2, 12, (1,), generator=g)),
                                                    int(torch.randint(1, 4, (1,), generator=g)))
        ctx = torch.randint(5, vocab, (width,), generator=g).tolist()
        cont = torch.randint(5, vocab, (length,), generator=g).tolist()
        out.append(ScoreRequest((bos, *ctx), tuple(cont)))
    return out


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="one recompile can remain after warm-up (whether it does depends on what the process compiled before): sizes of 1 (a one-row batch, a "
                   "one-key cache) are specialised by dynamo, and a combination the warm-up did not meet "
                   "(with or without a mask, fresh or cached) compiles a graph of its own")
def test_compiled_eval_batch_does_not_recompile(gen_checkpoint, fresh_dynamo):  # noqa: F811
    adapter, _ = compiled_megatron_adapter(gen_checkpoint)
    rule = make_rule("pll", adapter.special.mask_id)
    start = compile_counts()
    # warm-up: each kind of forward once (padded rows and unpadded ones, a fresh prefix and a
    # cached one): each is a graph of its own, never a new one for new sizes
    for seed, n, same in ((0, 4, False), (1, 1, False), (2, 3, True)):
        score_requests(adapter, _requests(adapter, seed, n, same), rule, batch_size=4, prefix_reuse=True)
    warm = compile_counts()
    assert warm.since(start).breaks == 0, describe(warm.since(start))
    results = score_requests(adapter, _requests(adapter, 7, 6), rule, batch_size=3, prefix_reuse=True)
    after = compile_counts().since(warm)
    assert len(results) == 6 and all(torch.isfinite(torch.tensor(r.logprob)) for r in results)
    assert after.compiles == 0 and after.recompiles == 0 and after.breaks == 0, describe(after)
