"""The run configuration: one YAML file per run plus `section.key=value` CLI overrides.

Why typed dataclasses rather than a free dict: a typo in a 300k-step run's config must fail
at start, naming the key and the valid ones, not hours later (or never). Values are coerced
to the field's type, so `optimizer.lr=6e-4` works although YAML 1.1 reads `6e-4` as a string.

Two sections are open-ended and validated by their owners when the run is built:
`model` (a preset name or path plus any `BiGLMModelConfig` field as an override) and
`objective` (passed to `ObjectiveConfig.from_dict`).
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import yaml


class ConfigError(ValueError):
    """A config file or override is wrong; the message says which key and how to fix it."""


@dataclass
class DataConfig:
    """Indexed-binary corpora. A blend is a list of `[weight, path_prefix]` pairs (or bare
    prefixes for equal weights); `anneal_blend` replaces it once the WSD decay starts."""
    tokenizer: Optional[str] = None
    blend: list = field(default_factory=list)
    anneal_blend: Optional[list] = None
    valid_blend: Optional[list] = None
    split: str = "98,2,0"
    seq_length: int = 2048
    seed: int = 1234
    cache_dir: Optional[str] = None
    num_workers: int = 0


@dataclass
class OptimizerConfig:
    lr: float = 6e-4
    min_lr: float = 6e-5
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    use_distributed_optimizer: bool = False


@dataclass
class ScheduleConfig:
    """`wsd`: linear warmup, constant, then decay over the last `decay_steps` (or
    `decay_fraction` of `train_steps`) to `min_lr`; `cosine`: warmup then cosine to min_lr."""
    style: Literal["wsd", "cosine", "linear", "constant"] = "wsd"
    train_steps: int = 300000
    warmup_steps: int = 2000
    decay_steps: Optional[int] = None
    decay_fraction: Optional[float] = 0.2
    wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "linear"


@dataclass
class ParallelismConfig:
    """Data-parallel size is what is left: world_size / (tensor × pipeline)."""
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1


@dataclass
class DeepSpeedConfig:
    """Used only with `training.backend: deepspeed` (data parallel; TP = PP = 1). Batch sizes,
    clipping and precision come from the rest of this config; `extra` is merged into the
    DeepSpeed config for anything else (e.g. `{zero_optimization: {overlap_comm: true}}`)."""
    zero_stage: Literal[1, 2, 3] = 2
    offload_optimizer: bool = False
    offload_param: bool = False
    extra: dict = field(default_factory=dict)


@dataclass
class TrainingConfig:
    backend: Literal["megatron", "deepspeed"] = "megatron"
    micro_batch_size: int = 4
    global_batch_size: int = 1024
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    recompute: Literal["none", "full", "selective"] = "none"
    seed: int = 1234
    max_nonfinite_in_a_row: int = 5
    eval_interval: int = 1000
    eval_iters: int = 10
    exit_after_steps: Optional[int] = None
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)


@dataclass
class LoggingConfig:
    log_interval: int = 10
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "biglm"
    progress: Literal["auto", "rich", "tqdm", "plain"] = "auto"
    peak_tflops: Optional[float] = None


@dataclass
class CheckpointConfig:
    """`dir` defaults to `{run_dir}/checkpoints`. `load`: `auto` resumes from `dir/latest`
    if present, `none` starts fresh, anything else is a checkpoint directory to start from.
    A weights-only checkpoint (an HF import) starts from its weights with a fresh optimizer at
    step 0, until the run has saved checkpoints of its own, which a re-run then resumes."""
    dir: Optional[str] = None
    save_interval: int = 1000
    save_at_end: bool = True
    load: str = "auto"
    keep_last: Optional[int] = None


@dataclass
class RunConfig:
    run_dir: str = "runs/biglm"
    model: dict = field(default_factory=lambda: {"preset": "tiny"})
    objective: dict = field(default_factory=dict)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.run_dir) / "checkpoints"

    @property
    def decay_steps(self) -> int:
        """WSD annealing length in steps (explicit `decay_steps` wins over the fraction)."""
        s = self.schedule
        if s.decay_steps is not None:
            return s.decay_steps
        return int(round((s.decay_fraction or 0.0) * s.train_steps))

    @property
    def anneal_start_step(self) -> Optional[int]:
        """The last step before the decay; steps after it use the annealing blend."""
        if self.schedule.style != "wsd":
            return None
        return self.schedule.train_steps - self.decay_steps

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


OPEN_SECTIONS = ("model", "objective")


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp, key: str) -> Any:
    """Convert `value` to the annotated type `tp`, or raise ConfigError naming `key`."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None or (isinstance(value, str) and value.lower() in ("null", "none", "~")):
            return None
        return _coerce(value, args[0], key)
    if origin is Literal:
        choices = typing.get_args(tp)
        for choice in choices:
            if value == choice or (isinstance(value, str) and str(choice) == value):
                return choice
        raise ConfigError(f"config key '{key}': {value!r} is not one of {list(choices)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
            return value.lower() in ("true", "yes", "1", "on")
        raise ConfigError(f"config key '{key}': expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"config key '{key}': expected {tp.__name__}, got {value!r}")
        try:
            number = float(value) if isinstance(value, str) else value
            if tp is int:
                if float(number) != int(float(number)):
                    raise ValueError
                return int(number)
            return float(number)
        except (TypeError, ValueError):
            raise ConfigError(f"config key '{key}': expected {tp.__name__}, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"config key '{key}': expected a string, got {value!r}")
        return str(value)
    if tp in (list, dict):
        if not isinstance(value, tp):
            raise ConfigError(f"config key '{key}': expected a {tp.__name__}, got {value!r}")
        return value
    raise ConfigError(f"config key '{key}': unsupported type {_type_name(tp)}")  # pragma: no cover


def _unknown_key(key: str, valid: list[str]) -> ConfigError:
    name = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    section = key.rsplit(".", 1)[0] if "." in key else "the top level"
    return ConfigError(f"unknown config key '{key}'{hint}; valid keys in {section}: {', '.join(valid)}")


def _build(cls, data: dict, prefix: str):
    """Build dataclass `cls` from `data`, failing on unknown keys and coercing types."""
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix.rstrip('.') or 'root'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = prefix + str(key)
        if key not in fields:
            raise _unknown_key(full, list(fields))
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value or {}, full + ".")
        elif key in OPEN_SECTIONS and cls is RunConfig:
            if not isinstance(value, dict):
                raise ConfigError(f"config section '{full}' must be a mapping, got {value!r}")
            default = fields[key].default_factory()
            kwargs[key] = {**default, **value}
        else:
            kwargs[key] = _coerce(value, tp, full)
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` → (['a','b','c'], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. optimizer.lr=3e-4)")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def _apply_override(tree: dict, parts: list[str], value: Any) -> None:
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(parts)}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _merge_defaults(tree: dict, base_dir: Path) -> dict:
    """`defaults: [other.yaml, ...]` (paths relative to this file) are merged under the file:
    how the paper's ablations are written as small overrides of one base config."""
    bases = tree.pop("defaults", None) or []
    merged: dict = {}
    for base in ([bases] if isinstance(bases, str) else bases):
        path = (base_dir / base) if not os.path.isabs(base) else Path(base)
        _deep_update(merged, load_yaml_tree(path))
    _deep_update(merged, tree)
    return merged


def _deep_update(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _deep_update(dst[key], value)
        else:
            dst[key] = value


_ENV_REF = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def expand_env(value, where: str = ""):
    """`${VAR}` / `${VAR:-default}` in config strings, so launch scripts and clusters can
    point a shared config at their own data paths. An unset VAR without default fails."""
    if isinstance(value, dict):
        return {k: expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, where) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(match):
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"config key '{where}' uses ${{{name}}} but the environment variable {name} "
                          f"is not set; export it or write ${{{name}:-default}}")
    return _ENV_REF.sub(sub, value)


def load_yaml_tree(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        try:
            tree = yaml.safe_load(f) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return _merge_defaults(tree, path.parent)


def load_config(source=None, overrides: list[str] | tuple = ()) -> RunConfig:
    """A RunConfig from a YAML path, a dict or None (defaults), then `key=value` overrides."""
    if source is None:
        tree: dict = {}
    elif isinstance(source, RunConfig):
        tree = source.to_dict()
    elif isinstance(source, dict):
        tree = _merge_defaults(dict(source), Path.cwd())
    else:
        tree = load_yaml_tree(source)
    tree = _copy_tree(tree)
    for text in overrides:
        parts, value = parse_override(text)
        _apply_override(tree, parts, value)
    tree = expand_env(tree)
    config = _build(RunConfig, tree, "")
    validate(config)
    return config


def _copy_tree(tree):
    if isinstance(tree, dict):
        return {k: _copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy_tree(v) for v in tree]
    return tree


def validate(config: RunConfig) -> None:
    """Cross-field checks that need no distributed state (batch arithmetic needs the world
    size and is checked in `check_batch_arithmetic`)."""
    s, t = config.schedule, config.training
    positive = {"schedule.train_steps": s.train_steps, "training.micro_batch_size": t.micro_batch_size,
                "training.global_batch_size": t.global_batch_size, "data.seq_length": config.data.seq_length,
                "logging.log_interval": config.logging.log_interval,
                "checkpoint.save_interval": config.checkpoint.save_interval,
                "training.max_nonfinite_in_a_row": t.max_nonfinite_in_a_row,
                "parallelism.tensor_model_parallel_size": config.parallelism.tensor_model_parallel_size,
                "parallelism.pipeline_model_parallel_size": config.parallelism.pipeline_model_parallel_size}
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"config key '{key}' must be > 0, got {value}")
    if s.warmup_steps < 0 or s.warmup_steps >= s.train_steps:
        raise ConfigError(f"schedule.warmup_steps={s.warmup_steps} must be in [0, schedule.train_steps="
                          f"{s.train_steps})")
    if s.style == "wsd":
        decay = config.decay_steps
        if s.decay_fraction is not None and not 0 < s.decay_fraction <= 1 and s.decay_steps is None:
            raise ConfigError(f"schedule.decay_fraction={s.decay_fraction} must be in (0, 1]")
        if not 0 < decay <= s.train_steps - s.warmup_steps:
            raise ConfigError(f"WSD decay of {decay} steps must be > 0 and fit after the warmup: "
                              f"schedule.train_steps - schedule.warmup_steps = {s.train_steps - s.warmup_steps}")
    if config.optimizer.min_lr > config.optimizer.lr:
        raise ConfigError(f"optimizer.min_lr={config.optimizer.min_lr} exceeds optimizer.lr={config.optimizer.lr}")
    if config.data.anneal_blend and s.style != "wsd":
        raise ConfigError("data.anneal_blend needs schedule.style=wsd (the blend switches when the decay starts)")
    if "preset" not in config.model:
        raise ConfigError("config section 'model' needs a 'preset' (a preset name such as 'tiny' or a YAML path)")
    if t.backend == "deepspeed":
        _validate_deepspeed(config)


_DEEPSPEED_OWNED = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                    "gradient_clipping", "optimizer", "scheduler", "fp16", "bf16", "amp")


def _validate_deepspeed(config: RunConfig) -> None:
    p, ds = config.parallelism, config.training.deepspeed
    if p.tensor_model_parallel_size != 1 or p.pipeline_model_parallel_size != 1:
        raise ConfigError(
            f"training.backend=deepspeed is data-parallel only, but parallelism is TP="
            f"{p.tensor_model_parallel_size}, PP={p.pipeline_model_parallel_size}; set both to 1, "
            f"or use training.backend=megatron for tensor/pipeline parallelism")
    if config.optimizer.use_distributed_optimizer:
        raise ConfigError("optimizer.use_distributed_optimizer is the megatron backend's ZeRO-1; with "
                          "training.backend=deepspeed set training.deepspeed.zero_stage instead")
    owned = sorted(k for k in ds.extra if k in _DEEPSPEED_OWNED)
    owned += [f"zero_optimization.{k}" for k in (ds.extra.get("zero_optimization") or {})
              if k in ("stage", "offload_optimizer", "offload_param")]
    if owned:
        raise ConfigError(
            f"training.deepspeed.extra sets {owned}, which this config already decides (batch sizes from "
            f"training.*, clipping and the optimizer from optimizer.*, the lr from schedule.*, precision from "
            f"training.precision, ZeRO from training.deepspeed.zero_stage/offload_*); set them there")
    if ds.offload_param and ds.zero_stage != 3:
        raise ConfigError(f"training.deepspeed.offload_param needs zero_stage=3 (got {ds.zero_stage}): "
                          f"DeepSpeed offloads parameters only when it partitions them")


def check_batch_arithmetic(config: RunConfig, data_parallel_size: int) -> int:
    """Micro-batches per step per rank; the global batch must split evenly over them."""
    t = config.training
    per_step = t.micro_batch_size * data_parallel_size
    if t.global_batch_size % per_step:
        raise ConfigError(
            f"training.global_batch_size={t.global_batch_size} is not divisible by "
            f"training.micro_batch_size × data-parallel size = {t.micro_batch_size} × {data_parallel_size} = "
            f"{per_step}; pick a global batch that is a multiple of {per_step}")
    return t.global_batch_size // per_step


def save_resolved(config: RunConfig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_yaml(), encoding="utf-8")
    return path
