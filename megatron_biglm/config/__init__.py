"""The run config (floor 2): below training, export and evaluation, which all read it.

It composes the typed sections owned by model/ and objective/ (those packages never import
config/). `load_config(path_or_dict, ["section.key=value", ...])` gives a validated
`RunConfig`; a wrong key or value raises `ConfigError` there, before anything is built.
`trained_checkpoint.open_checkpoint` reads a saved checkpoint together with its run config.
"""
from megatron_biglm.common.config_fields import ConfigError

from .loading import expand_env, load_config, load_saved_config, load_yaml_tree, parse_override
from .run_config import (
    CheckpointConfig,
    DataConfig,
    DeepSpeedConfig,
    LoggingConfig,
    OptimizerConfig,
    ParallelismConfig,
    RunConfig,
    ScheduleConfig,
    TrainingConfig,
    check_batch_arithmetic,
    check_sequence_fits,
    derive,
    save_resolved,
    validate,
)
from .sections import ModelSection, ObjectiveSection
from .finetune_section import FinetuneConfig
from .zero_shot_eval import ZeroShotEvalConfig

__all__ = [
    "ConfigError", "RunConfig", "derive", "DataConfig", "OptimizerConfig", "ScheduleConfig", "ParallelismConfig",
    "DeepSpeedConfig", "TrainingConfig", "LoggingConfig", "CheckpointConfig", "ModelSection",
    "ObjectiveSection", "load_config", "load_saved_config", "load_yaml_tree", "parse_override", "expand_env",
    "validate",
    "check_batch_arithmetic", "check_sequence_fits", "save_resolved", "ZeroShotEvalConfig", "FinetuneConfig",
]
