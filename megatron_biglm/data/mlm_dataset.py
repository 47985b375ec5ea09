"""MaskedLMDataset: fixed-length windows over a Megatron indexed corpus, masked by the objective.

Built on megatron-core's GPTDataset for everything but the sample itself: the document index,
sample index, shuffle index, on-disk index cache and blending (BlendedMegatronDatasetBuilder
and BlendedDataset) are megatron's. What changes:

* windows are exactly ``sequence_length`` tokens (``add_extra_token_to_sequence=False``): a
  masked LM predicts tokens in place, so there is no shifted next-token label;
* ``__getitem__`` applies :func:`megatron_biglm.objective.apply_objective` with a generator
  seeded by (random_seed, dataset identity, sample index), so a sample is a pure function of
  its index: workers, resumption and re-reads all see the same masking.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from megatron_biglm.common.mcore_internals import gpt_sample_tokens
from megatron_biglm.objective import ObjectiveConfig, apply_objective

from .token_ids import MegatronTokenIds, TokenIds


@dataclass
class MaskedLMDatasetConfig(GPTDatasetConfig):
    """GPTDatasetConfig plus the objective and token ids. Pass ``token_ids``, not ``tokenizer``.

    The GPT-specific switches are fixed: no extra token, no ltor attention mask, no position
    or attention resets, no EOD loss masking (EOS is simply never masked by the objective).
    """

    token_ids: TokenIds | None = None
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    eod_mask_loss: bool = False

    def __post_init__(self) -> None:
        if self.token_ids is None:
            raise ValueError("MaskedLMDatasetConfig needs token_ids (TokenIds.from_tokenizer(tokenizer))")
        if isinstance(self.objective, dict):
            self.objective = ObjectiveConfig.from_dict(self.objective)
        self.tokenizer = MegatronTokenIds(self.token_ids)
        self.add_extra_token_to_sequence = False
        self.create_attention_mask = False
        self.drop_last_partial_validation_sequence = True  # windows are always full
        super().__post_init__()


def corpus_fingerprint(indexed, path: str | None) -> dict:
    """A location-independent name of an indexed corpus: file name, documents, tokens."""
    lengths = np.asarray(indexed.sequence_lengths)
    return {"name": None if path is None else Path(path).name,
            "documents": int(lengths.size), "tokens": int(lengths.sum(dtype=np.int64))}


class MaskedLMDataset(GPTDataset):
    """A GPTDataset whose samples are objective-masked windows (see module docstring).

    A sample: ``tokens`` (input ids with masks applied) int64 [s], ``labels`` int64 [s]
    (−100 where not masked), ``loss_mask`` float32 [s], ``split`` int (attention split;
    0 = full attention); :func:`collate_masked_lm` makes it an int64 [b] tensor.
    """

    config: MaskedLMDatasetConfig

    def __init__(self, indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config):
        super().__init__(indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config)
        self._bitgen = np.random.PCG64(np.random.SeedSequence([config.random_seed, self.masking_stream_key()]))
        self._base_state = self._bitgen.state
        self._generator = np.random.Generator(self._bitgen)

    def masking_stream_key(self) -> int:
        """A 32-bit key naming this dataset's masking stream: distinct per (corpus, split), so
        sample i of two corpora or two splits never shares draws.

        It is megatron's identity of the dataset with two changes. The corpus is named by what
        it holds, not where it lies: the file name, the document count and the token count
        replace megatron's absolute ``dataset_path``, so the same files copied or mounted
        elsewhere (another job's scratch, a test's temporary folder) are masked identically.
        And of the split matrix only this split's own bookends count: the builder drops
        unrequested splits from the matrix, and requesting validation samples must not change
        how training samples are masked.
        """
        identity = dict(self.unique_identifiers)
        identity["dataset_path"] = corpus_fingerprint(self.dataset, self.dataset_path)
        matrix = identity.pop("split_matrix", None)
        identity.pop("split", None)  # the split text; its effect on this split is the bookends
        identity["split_bookends"] = matrix[self.index_split.value] if matrix else None
        description = json.dumps(identity, default=lambda obj: obj.unique_identifiers)
        return int(hashlib.md5(description.encode()).hexdigest()[:8], 16)

    @staticmethod
    def _key_config_attributes() -> list[str]:
        return GPTDataset._key_config_attributes() + ["add_extra_token_to_sequence"]

    def window(self, idx: int) -> np.ndarray:
        """The raw token window of sample ``idx`` (megatron's sample+shuffle index lookup)."""
        return gpt_sample_tokens(self, idx)

    def sample_rng(self, idx: int) -> np.random.Generator:
        """The generator for sample ``idx``: the dataset's stream jumped ahead by idx·2^64 draws.

        Disjoint per sample (a sample draws far fewer than 2^64 numbers) and ~6x cheaper than
        seeding a fresh generator. The generator object is reused, so one dataset object must
        not be read from several threads at once (DataLoader worker processes are fine).
        """
        self._bitgen.state = self._base_state
        self._bitgen.advance(int(idx) << 64)
        return self._generator

    def __getitem__(self, idx: int | None) -> dict[str, torch.Tensor]:
        if idx is None:
            raise ValueError("MaskedLMDataset has no padding samples: index it with an int")
        ids = self.config.token_ids
        out = apply_objective(
            self.window(idx),
            self.config.objective,
            self.sample_rng(idx),
            mask_id=ids.mask_id,
            special_ids=ids.special_ids,
            vocab_size=ids.vocab_size,
        )
        return {
            "tokens": torch.from_numpy(out["input_ids"]),
            "labels": torch.from_numpy(out["labels"]),
            "loss_mask": torch.from_numpy(out["loss_mask"]),
            "split": out["split"],  # a plain int: torch.tensor() per sample costs more than the masking
        }
