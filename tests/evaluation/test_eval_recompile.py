"""Scoring with compiled layers compiles once per kind of forward, never per size: after a
warm-up that meets each kind, batches of fresh context and continuation lengths, scored with
prefix reuse (the growing prefix cache's per-layer ports), compile nothing and break no graph.

The kinds are what dynamo tells apart by more than a size: a prefix encoded (recording its
keys/values) or a suffix read against one, with a mask (rows of unequal lengths) or none, and
sizes of 1, which dynamo specialises (a one-row batch, a one-token suffix). They are bounded
(`model/layer_compile.py`); any size beyond them reuses a graph."""
from __future__ import annotations

import pytest
import torch
from compile_watch import fresh_dynamo, compiled_megatron_adapter, describe
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.common.compile_counts import compile_counts
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule

#: (context tokens, continuation tokens) of each warm-up call's requests, scored 4 rows a batch:
#: one request with a one-token continuation (a prefix of one row, a one-row one-token suffix);
#: one with five (a full batch, then a one-row remainder); two of equal lengths with two and with
#: one (no mask); two of unequal context lengths with one and with more (a mask)
WARM_UP = (((6, 1),), ((6, 5),), ((6, 2), (6, 2)), ((6, 1), (6, 1)), ((4, 1), (7, 1)), ((4, 3), (7, 2)))


def _requests(adapter, shapes, seed: int) -> list[ScoreRequest]:
    g = torch.Generator().manual_seed(seed)

    def tokens(n: int) -> list[int]:
        return torch.randint(5, 100, (n,), generator=g).tolist()

    return [ScoreRequest((adapter.special.bos_id, *tokens(width)), tuple(tokens(length))) for width, length in shapes]


def _fresh_shapes(seed: int, n: int) -> list[tuple[int, int]]:
    g = torch.Generator().manual_seed(seed)
    return [(int(torch.randint(2, 12, (1,), generator=g)), int(torch.randint(1, 4, (1,), generator=g)))
            for _ in range(n)]


@pytest.mark.slow
def test_compiled_eval_batch_does_not_recompile(gen_checkpoint, fresh_dynamo):  # noqa: F811
    adapter, _ = compiled_megatron_adapter(gen_checkpoint)
    rule = make_rule("pll", adapter.special.mask_id)
    start = compile_counts()
    for seed, shapes in enumerate(WARM_UP):
        score_requests(adapter, _requests(adapter, shapes, seed), rule, batch_size=4, prefix_reuse=True)
    warm = compile_counts()
    assert warm.since(start).breaks == 0, describe(warm.since(start))
    assert warm.since(start).compiles >= 4  # the kinds are graphs of their own: the warm-up met them
    for seed in range(4):
        for batch_size in (2, 3, 5):
            shapes = _fresh_shapes(100 + seed, 7)
            results = score_requests(adapter, _requests(adapter, shapes, seed), rule, batch_size=batch_size,
                                     prefix_reuse=True)
            assert len(results) == 7 and all(torch.isfinite(torch.tensor(r.logprob)) for r in results)
    after = compile_counts().since(warm)
    assert after.compiles == 0 and after.recompiles == 0 and after.breaks == 0, describe(after)
