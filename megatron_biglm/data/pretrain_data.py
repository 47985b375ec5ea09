"""Build the pretraining datasets from the run's data config, and the resumable loader.

The training loop's whole interface::

    ds = build_pretrain_datasets(cfg.data, token_ids=TokenIds.from_tokenizer(tok),
                                 objective=cfg.objective, train_samples=steps * gbs,
                                 valid_samples=..., anneal_start_sample=anneal_step * gbs)
    loader = make_loader(ds.train, consumed_samples, micro_batch_size, dp_rank, dp_size)

``ds.train`` is indexed by the global sample index (a :class:`PhasedDataset` when an anneal
blend is set), so (seed, consumed_samples) fully determines what a resumed run sees.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

from megatron_biglm.objective import ObjectiveConfig

from .blend import SPLIT_NAMES, check_splits_nonempty, parse_blend
from .collate import collate_masked_lm
from .indexed_tools import check_dataset
from .mlm_dataset import MaskedLMDataset, MaskedLMDatasetConfig
from .sampler import ResumableSampler
from .token_ids import TokenIds

logger = logging.getLogger(__name__)


@dataclass
class PretrainDatasets:
    """Each dataset may hold more samples than requested (megatron rounds up to whole epochs);
    iterate ``train`` for ``train_samples`` (make_loader's ``total_samples``)."""

    train: torch.utils.data.Dataset
    valid: torch.utils.data.Dataset | None
    test: torch.utils.data.Dataset | None
    train_samples: int
    anneal_start_sample: int | None = None


def _get(data: Any, name: str, default=None):
    """Read a field from the run's DataConfig dataclass or a plain dict."""
    if isinstance(data, Mapping):
        return data.get(name, default)
    return getattr(data, name, default)


def _require_process_group(cache_dir):
    if cache_dir and not torch.distributed.is_initialized():
        raise RuntimeError(
            "building cached/blended datasets needs torch.distributed initialized (megatron-core "
            "synchronizes ranks while writing the index cache); for one process use "
            "megatron_biglm.common.process_groups.single_process_group()"
        )


def _build_split_datasets(blend, split, sizes, *, seq_length, seed, cache_dir, token_ids, objective,
                          is_built_on_rank, what, blend_per_split=None):
    """One BlendedMegatronDatasetBuilder run; splits with no requested samples are not built."""
    config = MaskedLMDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        path_to_cache=cache_dir,
        token_ids=token_ids,
        objective=objective,
    )
    if config.split_matrix is not None:
        for i, size in enumerate(sizes):
            if not size:
                config.split_matrix[i] = None  # bookends of the other splits are unchanged
            elif config.split_matrix[i] is None:
                raise ValueError(
                    f"{what}: {size} {SPLIT_NAMES[i]} samples requested but split {split!r} gives "
                    f"{SPLIT_NAMES[i]} weight 0; request 0 samples or give it a share"
                )
        check_splits_nonempty(blend[0], config.split_matrix, split)
    else:
        for i, per_split in enumerate(blend_per_split):
            if per_split is None and sizes[i]:
                raise ValueError(f"{what}: {sizes[i]} {SPLIT_NAMES[i]} samples requested but no blend for it")
            if not sizes[i]:
                config.blend_per_split[i] = None
            elif per_split is not None:
                check_splits_nonempty(per_split[0], [(0.0, 1.0)], f"{SPLIT_NAMES[i]} blend")
    # Sizes stay ints (0, not None): megatron asserts weights are None wherever a size is None.
    builder = BlendedMegatronDatasetBuilder(MaskedLMDataset, list(sizes), is_built_on_rank, config)
    return builder.build()


def _check_corpora(token_ids: TokenIds, *blends) -> None:
    """Every corpus of every blend passes `check_dataset` (header, version, .idx against .bin,
    ids against the tokenizer) before megatron-core opens it: its reader trusts the files, and
    a truncated .bin fails deep inside it with a bare offset error. Raises CorruptDatasetError."""
    for blend in blends:
        for prefix in (blend[0] if blend else []):
            check_dataset(prefix, vocab_size=token_ids.vocab_size)


def build_pretrain_datasets(
    data: Any,
    *,
    token_ids: TokenIds,
    objective: ObjectiveConfig | Mapping | None = None,
    train_samples: int,
    valid_samples: int = 0,
    test_samples: int = 0,
    anneal_start_sample: int | None = None,
    is_built_on_rank: Callable[[], bool] = lambda: True,
) -> PretrainDatasets:
    """Train/valid/test masked-LM datasets from ``data`` (the run's DataConfig or a dict).

    Reads ``blend``, ``split``, ``seq_length``, ``seed``, ``cache_dir``, optional
    ``valid_blend`` (validation from separate corpora; train then uses all of ``blend``) and
    ``anneal_blend`` (with ``anneal_start_sample``: samples from that global index on come from
    it; its corpora are split like ``blend`` so held-out documents stay held out).
    Every corpus is checked first (``indexed_tools.check_dataset``): a truncated, foreign or
    mismatched dataset raises ``CorruptDatasetError`` naming the file and the fix.
    """
    if not isinstance(objective, ObjectiveConfig):
        objective = ObjectiveConfig.from_dict(objective or {})
    seq_length, seed = int(_get(data, "seq_length", 2048)), int(_get(data, "seed", 1234))
    split, cache_dir = _get(data, "split", "98,2,0"), _get(data, "cache_dir")
    _require_process_group(cache_dir)
    common = dict(seq_length=seq_length, seed=seed, cache_dir=cache_dir, token_ids=token_ids,
                  objective=objective, is_built_on_rank=is_built_on_rank)
    if train_samples < 1:
        raise ValueError(f"train_samples={train_samples} must be >= 1")
    anneal_blend = _get(data, "anneal_blend")
    if anneal_blend and anneal_start_sample is None:
        raise ValueError("data.anneal_blend is set but no anneal_start_sample (anneal_start_step × global batch)")
    if anneal_start_sample is not None and not 0 <= anneal_start_sample <= train_samples:
        raise ValueError(f"anneal_start_sample={anneal_start_sample} outside [0, train_samples={train_samples}]")
    main_train = anneal_start_sample if anneal_blend else train_samples

    blend = parse_blend(_get(data, "blend"), "data.blend")
    valid_blend = _get(data, "valid_blend")
    _check_corpora(token_ids, blend, valid_blend and parse_blend(valid_blend, "data.valid_blend"),
                   anneal_blend and parse_blend(anneal_blend, "data.anneal_blend"))
    if valid_blend:
        per_split = [blend, parse_blend(valid_blend, "data.valid_blend"), None]
        if test_samples:
            raise ValueError("with data.valid_blend there is no test split; request test_samples=0")
        train, valid, test = _build_split_datasets(
            None, None, [main_train, valid_samples, 0], blend_per_split=per_split, what="data.blend", **common)
    else:
        train, valid, test = _build_split_datasets(
            blend, split, [main_train, valid_samples, test_samples], what="data.blend", **common)

    if anneal_blend:
        anneal = parse_blend(anneal_blend, "data.anneal_blend")
        anneal_samples = train_samples - anneal_start_sample
        anneal_train = _build_split_datasets(
            anneal, split, [anneal_samples, 0, 0], what="data.anneal_blend", **common)[0] if anneal_samples else []
        if not main_train:
            train = []
        train = PhasedDataset(train, anneal_train, anneal_start_sample)
        logger.info("anneal blend from global sample %d (%d main + %d anneal samples)",
                    anneal_start_sample, main_train, anneal_samples)
    return PretrainDatasets(train, valid, test, train_samples, anneal_start_sample if anneal_blend else None)


def make_loader(dataset, consumed_samples: int, micro_batch_size: int, data_parallel_rank: int = 0,
                data_parallel_size: int = 1, num_workers: int = 0, total_samples: int | None = None,
                collate_fn=collate_masked_lm):
    """A DataLoader over ``dataset`` resuming at ``consumed_samples`` (global, all DP ranks).

    ``total_samples`` (default ``len(dataset)``) ends the iteration; pass
    ``PretrainDatasets.train_samples`` for training. ``collate_fn``: a training recipe's own.

    The loader has its own generator: a DataLoader draws a base seed for its workers each
    time it is iterated, from the global torch generator unless given one, which would shift
    the training RNG streams (dropout) whenever a loader is opened (at resume, for each
    validation). Samples are pure functions of their index, so that seed changes nothing else.
    """
    sampler = ResumableSampler(len(dataset) if total_samples is None else total_samples, consumed_samples,
                               micro_batch_size, data_parallel_rank, data_parallel_size)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, num_workers=num_workers, collate_fn=collate_fn,
        persistent_workers=num_workers > 0, generator=torch.Generator().manual_seed(0),
    )


# PhasedDataset: the main blend, then the annealing blend from a given global sample on.
# 
# The WSD decay phase trains on a different blend (paper §3.3). Expressing the switch as a
# pure function of the *global sample index* (``switch_sample = anneal_start_step × global
# batch size``) keeps it exactly resumable: a run resumed at consumed samples k sees the same
# samples, on either side of the switch, as an uninterrupted run.
class PhasedDataset(torch.utils.data.Dataset):
    """Index i < switch_sample → ``main[i]``; i ≥ switch_sample → ``anneal[i − switch_sample]``.

    Each sample gains ``phase`` (0 main, 1 anneal) so logs can show which blend is in use.
    """

    def __init__(self, main, anneal, switch_sample: int):
        if switch_sample < 0:
            raise ValueError(f"switch_sample={switch_sample} must be >= 0")
        if switch_sample > len(main):
            raise ValueError(
                f"the main blend has {len(main)} samples but the switch is at sample {switch_sample}; "
                "build it with at least anneal_start_step × global_batch_size samples"
            )
        self.main, self.anneal, self.switch_sample = main, anneal, int(switch_sample)

    def __len__(self) -> int:
        return self.switch_sample + len(self.anneal)

    def phase_of(self, idx: int) -> int:
        return int(idx >= self.switch_sample)

    def __getitem__(self, idx: int) -> dict:
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} outside [0, {len(self)})")
        if idx < self.switch_sample:
            sample = self.main[idx]
        else:
            sample = self.anneal[idx - self.switch_sample]
        return {**sample, "phase": self.phase_of(idx)}
