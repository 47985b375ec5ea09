"""ResumableSampler, PhasedDataset and collate_masked_lm on their own (no megatron build)."""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.data.collate import collate_masked_lm
from megatron_biglm.data.pretrain_data import PhasedDataset
from megatron_biglm.data.sampler import ResumableSampler


@pytest.mark.parametrize("mb,dp,total", [(4, 1, 37), (2, 3, 50), (1, 4, 16)])
def test_sampler_ranks_partition_the_global_order(mb, dp, total):
    per_rank = [list(ResumableSampler(total, 0, mb, r, dp)) for r in range(dp)]
    block = mb * dp
    steps = total // block
    assert all(len(b) == steps for b in per_rank)
    for step in range(steps):
        together = [i for r in range(dp) for i in per_rank[r][step]]
        assert together == list(range(step * block, (step + 1) * block))
    assert ResumableSampler(total, 0, mb, 0, dp).dropped_tail == total % block


def test_sampler_resume_is_the_tail_of_the_full_run():
    full = list(ResumableSampler(64, 0, 4, 1, 2))
    for consumed in (0, 8, 24, 64):
        assert list(ResumableSampler(64, consumed, 4, 1, 2)) == full[consumed // 8:]


@pytest.mark.parametrize("kwargs,match", [
    (dict(total_samples=10, consumed_samples=3, micro_batch_size=2), "multiple"),
    (dict(total_samples=10, consumed_samples=12, micro_batch_size=2), "outside"),
    (dict(total_samples=10, consumed_samples=0, micro_batch_size=2, data_parallel_rank=2, data_parallel_size=2), "rank"),
])
def test_sampler_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ResumableSampler(**kwargs)


def fake(n, tag):
    return [{"tokens": torch.full((4,), tag * 100 + i), "labels": torch.full((4,), -100),
             "loss_mask": torch.zeros(4), "split": i % 4} for i in range(n)]


def test_phased_dataset_switches_at_the_sample():
    ds = PhasedDataset(fake(10, 1), fake(5, 2), switch_sample=7)
    assert len(ds) == 12
    assert [int(ds[i]["tokens"][0]) for i in (0, 6, 7, 11)] == [100, 106, 200, 204]
    assert [ds[i]["phase"] for i in (6, 7)] == [0, 1]
    with pytest.raises(IndexError):
        ds[12]
    with pytest.raises(ValueError, match="main blend has 10 samples"):
        PhasedDataset(fake(10, 1), fake(5, 2), switch_sample=11)


def test_collate_stacks_and_adds_positions():
    samples = [{**s, "dataset_id": 1, "phase": 0} for s in fake(3, 1)]
    batch = collate_masked_lm(samples)
    assert batch["tokens"].shape == (3, 4) and batch["tokens"].dtype == torch.int64
    assert batch["split"].tolist() == [0, 1, 2] and batch["loss_mask"].dtype == torch.float32
    assert torch.equal(batch["position_ids"], torch.arange(4).expand(3, 4))
    assert batch["dataset_id"].tolist() == [1, 1, 1] and batch["phase"].tolist() == [0, 0, 0]
    assert "position_ids" not in collate_masked_lm(samples, with_position_ids=False)


def test_collate_errors_are_clear():
    with pytest.raises(ValueError, match="empty"):
        collate_masked_lm([])
    with pytest.raises(KeyError, match="split"):
        collate_masked_lm([{"tokens": torch.zeros(2), "labels": torch.zeros(2), "loss_mask": torch.zeros(2)}])
    uneven = fake(2, 1)
    uneven[1] = {**uneven[1], "tokens": torch.zeros(5, dtype=torch.long)}
    with pytest.raises(ValueError, match="different lengths"):
        collate_masked_lm(uneven)
