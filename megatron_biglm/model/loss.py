"""The masked-LM loss: sparse prediction on the model side, reduction on the schedule side.

Sparse prediction (as in ModernBERT): only the rows of the hidden states at predicted
positions go through the vocabulary projection, so it costs ~beta*s rows instead of s. The
result is scattered back to a dense [b, s] per-token loss (0 off the mask): the same output
contract as megatron's GPTModel, so megatron's pipeline schedules and the usual
`loss_func(loss_mask, output_tensor)` work unchanged. Cross entropy is megatron-core's
vocab-parallel one, so under tensor parallelism logits are never gathered.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from megatron.core import tensor_parallel


def mask_padded_vocab(logits: torch.Tensor, vocab_size: Optional[int],
                      padded_vocab_size: Optional[int] = None) -> torch.Tensor:
    """Set the logits of megatron's padding rows (global ids >= `vocab_size`) to -inf.

    The embedding is padded up to a multiple of `make_vocab_size_divisible_by` (as Megatron
    does); those rows belong to no token, so they must take no probability mass in the loss,
    the metrics or the predictions. `logits` [..., vocab / tp] is this rank's vocabulary shard
    (ids `rank * shard` onwards), or all of it when its width is `padded_vocab_size`
    (gathered). `vocab_size=None` means no padding to mask.
    """
    shard = logits.shape[-1]
    if vocab_size is None or vocab_size >= (padded_vocab_size or 0) > 0:
        return logits
    start = 0
    if shard != padded_vocab_size and torch.distributed.is_available() and torch.distributed.is_initialized():
        from megatron.core import parallel_state
        if parallel_state.model_parallel_is_initialized():
            start = parallel_state.get_tensor_model_parallel_rank() * shard
    local_valid = vocab_size - start
    if local_valid >= shard:
        return logits
    return logits.masked_fill(
        torch.arange(shard, device=logits.device) >= max(local_valid, 0), float("-inf"))


def sparse_prediction_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor,
    output_layer: Callable,
    output_weight: Optional[torch.Tensor],
    vocab_size: Optional[int] = None,
) -> torch.Tensor:
    """Per-token cross entropy [b, s] (fp32), computed only where `loss_mask` is non-zero.

    hidden: [s, b, h] final-norm output (full sequence, i.e. already gathered under sequence
    parallelism); labels, loss_mask: [b, s]; output_layer: megatron ColumnParallelLinear
    (called with `weight` when embeddings are tied); vocab_size: the tokenizer's rows, the
    padding rows past it are masked out (`mask_padded_vocab`).
    """
    s, b, h = hidden.shape
    if labels.shape != (b, s) or loss_mask.shape != (b, s):
        raise ValueError(
            f"labels {tuple(labels.shape)} and loss_mask {tuple(loss_mask.shape)} must both be "
            f"[batch, seq] = {(b, s)}"
        )
    # Row r of hidden.reshape(s*b, h) is (position r // b, sample r % b): select in that order.
    rows = (loss_mask.transpose(0, 1).reshape(-1) != 0).nonzero(as_tuple=True)[0]
    picked = hidden.reshape(s * b, h).index_select(0, rows).unsqueeze(1)  # [n, 1, h]
    logits, _ = output_layer(picked, weight=output_weight)  # [n, 1, vocab / tp]
    logits = mask_padded_vocab(logits.float(), vocab_size)
    targets = labels.transpose(0, 1).reshape(-1).index_select(0, rows).unsqueeze(1)
    token_loss = tensor_parallel.vocab_parallel_cross_entropy(logits, targets)  # [n, 1]
    dense = token_loss.new_zeros(s * b).index_copy(0, rows, token_loss.view(-1))
    return dense.view(s, b).transpose(0, 1).contiguous()


def masked_lm_loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """The `loss_func` for megatron schedules: (loss sum, token count, {"lm loss": [sum, n]}).

    Returning the count lets the schedule average per token across micro-batches and ranks
    (`calculate_per_token_loss=True`) or per micro-batch (False, it divides by the count).
    `loss_mask` may hold weights; it multiplies the per-token losses.
    """
    mask = loss_mask.reshape(-1).float()
    loss_sum = (output_tensor.reshape(-1).float() * mask).sum()
    num_tokens = (mask != 0).sum().to(torch.int)
    report = torch.stack([loss_sum.detach(), num_tokens.float()])
    return loss_sum, num_tokens, {"lm loss": report}
