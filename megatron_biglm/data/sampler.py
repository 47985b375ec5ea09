"""ResumableSampler: micro-batches of global sample indices, starting at consumed_samples.

Megatron-LM's pretraining sampler lives in ``megatron.training`` (absent from megatron-core
0.16). Sample order is fixed by the datasets' seeded indices, so resuming is only a matter of
starting at the right global index: rank r of d takes ``[start + r·mb, start + (r+1)·mb)`` of
every ``mb·d`` block.
"""
from __future__ import annotations

import torch


class ResumableSampler(torch.utils.data.Sampler):
    """Yields lists of ``micro_batch_size`` indices for one data-parallel rank.

    ``consumed_samples`` counts samples of all ranks (what the checkpoint stores); it must be
    a multiple of ``micro_batch_size × data_parallel_size``. A final incomplete block is dropped
    and its size reported by :attr:`dropped_tail`.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int = 0, data_parallel_size: int = 1):
        if micro_batch_size < 1 or data_parallel_size < 1:
            raise ValueError("micro_batch_size and data_parallel_size must be >= 1")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank={data_parallel_rank} not in [0, {data_parallel_size})")
        block = micro_batch_size * data_parallel_size
        if consumed_samples % block:
            raise ValueError(
                f"consumed_samples={consumed_samples} is not a multiple of micro_batch_size × "
                f"data_parallel_size = {block}; resume with the batch layout it was saved with"
            )
        if not 0 <= consumed_samples <= total_samples:
            raise ValueError(f"consumed_samples={consumed_samples} outside [0, total_samples={total_samples}]")
        self.total_samples, self.consumed_samples = total_samples, consumed_samples
        self.micro_batch_size, self.rank, self.block = micro_batch_size, data_parallel_rank, block
        self.dropped_tail = (total_samples - consumed_samples) % block

    def __len__(self) -> int:
        return (self.total_samples - self.consumed_samples) // self.block

    def __iter__(self):
        first = self.consumed_samples + self.rank * self.micro_batch_size
        for start in range(first, first + len(self) * self.block, self.block):
            yield list(range(start, start + self.micro_batch_size))
