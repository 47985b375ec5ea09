"""Hugging Face side of BiGLM: weight mapping, native EuroBERT config, split mask, weight files.

Route: BiGLM is exactly transformers' `EuroBertForMaskedLM` (transformers >= 5.3), so exported
directories load with `AutoModelForMaskedLM.from_pretrained(dir)` and need no remote code.
BiGLM's prefix/suffix split is a 4D additive attention mask (`split_attention_mask`).
"""
from .hf_config import (
    MIN_TRANSFORMERS,
    ImportedArchitecture,
    UnsupportedArchitecture,
    architecture_from_hf_config,
    eurobert_config,
    hf_config_from_biglm,
    shape_from_biglm_config,
)
from .hf_files import CheckpointFileError, HFWeights, save_safetensors_stream
from megatron_biglm.model.shape import BiGLMShape
from .split_attention import forward_with_split, split_attention_mask
from .tp_shards import merge_tp_shards, split_for_tp, tp_partition_dim
from .weight_mapping import (
    ConversionReport,
    WeightMappingError,
    hf_tensor_shapes,
    hf_to_megatron,
    megatron_tensor_shapes,
    megatron_to_hf,
)

__all__ = [
    "BiGLMShape", "ConversionReport", "WeightMappingError", "megatron_to_hf", "hf_to_megatron",
    "hf_tensor_shapes", "megatron_tensor_shapes", "split_for_tp", "merge_tp_shards",
    "tp_partition_dim", "eurobert_config", "hf_config_from_biglm", "shape_from_biglm_config", "architecture_from_hf_config", "ImportedArchitecture",
    "UnsupportedArchitecture", "MIN_TRANSFORMERS", "split_attention_mask", "forward_with_split",
    "save_safetensors_stream", "HFWeights", "CheckpointFileError",
]
