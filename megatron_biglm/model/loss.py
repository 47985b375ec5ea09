"""The masked-LM loss: sparse prediction on the model side, reduction on the schedule side.

Sparse prediction (as in ModernBERT): only the rows of the hidden states at predicted
positions go through the vocabulary projection, so it costs ~beta*s rows instead of s. The
result is scattered back to a dense [b, s] per-token loss (0 off the mask): the same output
contract as megatron's GPTModel, so megatron's pipeline schedules and the usual
`loss_func(loss_mask, output_tensor)` work unchanged. Cross entropy is megatron-core's
vocab-parallel one, so under tensor parallelism logits are never gathered.

Fused over the predicted rows (one tensor-parallel rank holding the whole vocabulary, the
usual single-GPU and data-parallel case): `fused_linear_cross_entropy` projects and scores the
predicted rows a chunk at a time, keeping only each row's log-sum-exp, and its backward
recomputes each chunk's logits. The `[n, vocab]` logits, their fp32 copy and the softmax are
never held at once (for 16 x 2048 tokens at 15 % and a 50k vocabulary: ~1 GB each in fp32);
the price is one more `[n, h] x [h, vocab]` product in the backward.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from megatron.core import parallel_state, tensor_parallel

from megatron_biglm.model.config import FUSED_LOSS_CHUNK


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
        if parallel_state.model_parallel_is_initialized():
            start = parallel_state.get_tensor_model_parallel_rank() * shard
    local_valid = vocab_size - start
    if local_valid >= shard:
        return logits
    return logits.masked_fill(
        torch.arange(shard, device=logits.device) >= max(local_valid, 0), float("-inf"))


def predicted_rows(loss_mask: torch.Tensor) -> torch.Tensor:
    """The rows of `hidden.reshape(s * b, h)` that `loss_mask` [b, s] predicts (int64, ascending).

    Row r of the `[s, b, h]` hidden states is (position r // b, sample r % b). Call it on the
    loader's host mask and move the result: computed from a device mask it is a `nonzero`,
    which makes the host wait for the device.
    """
    return (loss_mask.transpose(0, 1).reshape(-1) != 0).nonzero(as_tuple=True)[0]


def sparse_prediction_loss(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    loss_mask: torch.Tensor,
    output_layer: Callable,
    output_weight: Optional[torch.Tensor],
    vocab_size: Optional[int] = None,
    rows: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Per-token cross entropy [b, s] (fp32), computed only where `loss_mask` is non-zero.

    hidden: [s, b, h] final-norm output (full sequence, i.e. already gathered under sequence
    parallelism); labels, loss_mask: [b, s]; output_layer: megatron ColumnParallelLinear
    (called with `weight` when embeddings are tied); vocab_size: the tokenizer's rows, the
    padding rows past it are masked out (`mask_padded_vocab`); rows: `predicted_rows` of the
    mask, computed on the host (None: computed here from `loss_mask`, a device sync on GPU).
    """
    s, b, h = hidden.shape
    if labels.shape != (b, s) or loss_mask.shape != (b, s):
        raise ValueError(
            f"labels {tuple(labels.shape)} and loss_mask {tuple(loss_mask.shape)} must both be "
            f"[batch, seq] = {(b, s)}"
        )
    rows = predicted_rows(loss_mask) if rows is None else rows.to(hidden.device, non_blocking=True)
    picked = hidden.reshape(s * b, h).index_select(0, rows)  # [n, h]
    targets = labels.transpose(0, 1).reshape(-1).index_select(0, rows)
    weight = output_weight if output_weight is not None else output_layer.weight
    if _fusable(output_layer, weight):
        token_loss = fused_linear_cross_entropy(picked, weight, targets, vocab_size)
    else:
        logits, _ = output_layer(picked.unsqueeze(1), weight=output_weight)  # [n, 1, vocab / tp]
        logits = mask_padded_vocab(logits.float(), vocab_size)
        token_loss = tensor_parallel.vocab_parallel_cross_entropy(logits, targets.unsqueeze(1))  # [n, 1]
    dense = token_loss.new_zeros(s * b).index_copy(0, rows, token_loss.view(-1))
    return dense.view(s, b).transpose(0, 1).contiguous()


def _fusable(output_layer, weight: torch.Tensor) -> bool:
    """The fused loss computes `x @ weight.T` itself: only when that is all the output layer
    does (no bias, the whole vocabulary on this rank, no sequence-parallel gather)."""
    tp = (parallel_state.get_tensor_model_parallel_world_size()
          if parallel_state.model_parallel_is_initialized() else 1)
    return (tp == 1 and getattr(output_layer, "bias", None) is None
            and not getattr(output_layer, "sequence_parallel", False) and weight.dim() == 2)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               vocab_size: Optional[int] = None, chunk: int = FUSED_LOSS_CHUNK) -> torch.Tensor:
    """Per-row cross entropy `[n]` (fp32) of `hidden [n, h] @ weight[vocab, h].T` against
    `targets [n]`, the rows at or past `vocab_size` (megatron's vocabulary padding) taking no
    mass; the logits are computed `chunk` rows at a time and never kept (see the module)."""
    return _FusedLinearCrossEntropy.apply(hidden, weight, targets, vocab_size, chunk)


class _FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_size, chunk):
        lse = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        loss = torch.empty_like(lse)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = _chunk_logits(hidden[rows], weight, vocab_size)
            lse[rows] = torch.logsumexp(logits, dim=-1)
            loss[rows] = lse[rows] - logits.gather(-1, targets[rows, None])[:, 0]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.vocab_size, ctx.chunk = vocab_size, chunk
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        hidden, weight, targets, lse = ctx.saved_tensors
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            # d loss / d logits = softmax - one_hot(target), per row times the incoming gradient
            grad = torch.exp(_chunk_logits(hidden[rows], weight, ctx.vocab_size) - lse[rows, None])
            grad[torch.arange(grad.shape[0], device=grad.device), targets[rows]] -= 1.0
            grad = (grad * grad_loss[rows, None].float()).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad @ weight
            if grad_weight is not None:
                grad_weight += (grad.t() @ hidden[rows]).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, vocab_size: Optional[int]) -> torch.Tensor:
    """fp32 logits `[rows, vocab]` of one chunk, the padding rows at -inf."""
    logits = (hidden @ weight.t()).float()
    return mask_padded_vocab(logits, vocab_size, weight.shape[0])


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
