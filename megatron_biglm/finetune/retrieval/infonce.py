"""InfoNCE with in-batch negatives, optional hard negatives, and negatives from every DP rank.

Query i's positive is passage i; every other passage of the batch (other queries' positives
and everyone's hard negatives) is a negative. Under data parallelism the passage embeddings
of all DP ranks are gathered WITH gradients (`torch.distributed.nn.functional.all_gather`,
whose backward sums the gradients that reach each rank's slice), so each rank's queries are
scored against the global batch: the loss and the gradients are those of one process
holding the whole global micro-batch. Each rank returns the loss summed over ITS queries;
the loop divides by the global query count.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def gather_with_grad(x: torch.Tensor, group=None) -> tuple[torch.Tensor, int]:
    """(concatenation over the group's ranks, in rank order, of x [n, h]; this rank's offset).
    Every rank must hold the same n. Without a group of more than one rank: (x, 0)."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return x, 0
    from torch.distributed.nn.functional import all_gather

    parts = all_gather(x.contiguous(), group=group)
    return torch.cat(parts, dim=0), dist.get_rank(group) * x.shape[0]


def info_nce_sum(queries: torch.Tensor, passages: torch.Tensor, *, temperature: float,
                 group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss summed over this rank's queries, correct top-1 count).

    queries [b, h]; passages [b * (1 + k), h] laid out as b positives then b*k hard negatives
    (any order after the positives). With a DP group, the positives of all ranks come first
    in the gathered matrix, then all ranks' hard negatives, so query j of rank r has label
    r*b + j."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b = queries.shape[0]
    positives, negatives = passages[:b], passages[b:]
    all_pos, offset = gather_with_grad(positives, group)
    columns = all_pos
    if negatives.shape[0]:
        all_neg, _ = gather_with_grad(negatives, group)
        columns = torch.cat([all_pos, all_neg])
    logits = queries.float() @ columns.float().T / temperature
    labels = torch.arange(offset, offset + b, device=logits.device)
    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    correct = (logits.argmax(dim=1) == labels).sum()
    return loss, correct
