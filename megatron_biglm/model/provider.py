"""`model_provider`: build this rank's BiGLM model chunk, megatron-style.

Megatron builds one chunk per pipeline stage (and per virtual stage) by calling a provider
with `pre_process`/`post_process`; this is that provider. Parallel sizes come from the
initialised `megatron.core.parallel_state` unless a ready `transformer_config` is passed (the
training loop does that to add recompute, fusions, and so on).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Union

from megatron.core import parallel_state

from .biglm_model import BiGLMModel
from .config import BiGLMModelConfig
from .presets import load_preset

ModelConfigLike = Union[BiGLMModelConfig, str, "os.PathLike", Mapping[str, Any]]


def as_model_config(config: ModelConfigLike) -> BiGLMModelConfig:
    """A config object from a config, a preset name/path, or a dict (optionally with `preset`)."""
    if isinstance(config, BiGLMModelConfig):
        return config
    if isinstance(config, (str, os.PathLike)):
        return load_preset(config)
    if isinstance(config, Mapping):
        values = dict(config)
        preset = values.pop("preset", None)
        return load_preset(preset, values) if preset is not None else BiGLMModelConfig.from_dict(values)
    raise TypeError(
        f"model config must be a BiGLMModelConfig, a preset name/path or a dict, got {type(config).__name__}"
    )


def model_provider(
    pre_process: bool = True,
    post_process: bool = True,
    config: Optional[ModelConfigLike] = None,
    *,
    vp_stage: Optional[int] = None,
    transformer_config=None,
    params_dtype: str = "fp32",
    **transformer_overrides: Any,
) -> BiGLMModel:
    """This rank's `BiGLMModel` chunk. Call after `parallel_state.initialize_model_parallel`.

    Use with megatron's schedules as `functools.partial(model_provider, config=cfg)`.
    `transformer_overrides` go to `BiGLMModelConfig.to_transformer_config`.
    """
    if config is None:
        raise ValueError("model_provider needs config= (a BiGLMModelConfig, preset name or dict)")
    model_config = as_model_config(config)
    if transformer_config is None:
        if not parallel_state.model_parallel_is_initialized():
            raise RuntimeError(
                "megatron parallel state is not initialised: call torch.distributed."
                "init_process_group and parallel_state.initialize_model_parallel(tp, pp) first"
            )
        transformer_config = model_config.to_transformer_config(
            tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
            pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
            params_dtype=params_dtype,
            **transformer_overrides,
        )
    elif transformer_overrides:
        raise ValueError("pass either transformer_config or transformer overrides, not both")
    return BiGLMModel(
        transformer_config, model_config, pre_process=pre_process, post_process=post_process,
        vp_stage=vp_stage,
    )
