"""The run configuration: what one run is (model, objective, data, optimizer, schedule, ...).

Why typed dataclasses rather than a free dict: a typo in a 300k-step run's config must fail
at start, naming the key and the valid ones, not hours later (or never). Values are coerced
to the field's type (common.config_fields), so `optimizer.lr=6e-4` works although YAML 1.1
reads `6e-4` as a string. Reading files and overrides is loading.py.

`model` and `objective` are sections whose keys their own packages own (sections.py): they
keep what was written (a preset plus overrides; the objective keys that differ from the
defaults) and carry the resolved `BiGLMModelConfig` / `ObjectiveConfig` as `.resolved`,
built and validated when the config is loaded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional, Union

import yaml

from megatron_biglm.common.config_fields import ConfigError

from .finetune_section import FinetuneConfig
from .sections import ModelSection, ObjectiveSection
from .zero_shot_eval import ZeroShotEvalConfig


@dataclass
class DataConfig:
    """Indexed-binary corpora. A blend is a list of `[weight, path_prefix]` pairs (or bare
    prefixes for equal weights); `anneal_blend` replaces it once the WSD decay starts."""
    tokenizer: Optional[str] = None
    tokenizer_sha256: Optional[str] = None   # set by the run: the digest of data.tokenizer's files it trained with
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

    @property
    def wsd_decay_steps(self) -> int:
        """WSD annealing length in steps (explicit `decay_steps` wins over the fraction)."""
        if self.decay_steps is not None:
            return self.decay_steps
        return int(round((self.decay_fraction or 0.0) * self.train_steps))


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
    """`precision`: `auto` is bf16 on GPU and fp32 on CPU. `bf16` on a machine without CUDA is
    refused unless `allow_cpu_bf16` is true: CPU bf16 matmuls are an order of magnitude slower
    than fp32 ones on most CPUs, so a CPU bf16 run is almost always a config meant for a GPU;
    the opt-in is for checking the mixed-precision path (bf16 weights, fp32 main weights and
    gradients) on CPU.

    megatron DDP settings (training/ddp_settings.py resolves `auto`): `overlap_grad_reduce`
    overlaps the data-parallel gradient reduction with the backward pass; `overlap_param_gather`
    (distributed optimizer only, with `overlap_grad_reduce`) overlaps the parameter all-gather
    with the next forward pass; `auto` turns both on with CUDA and off on CPU.
    `check_for_nan_in_grad` makes a NaN/inf gradient fatal in the reduction, before the
    non-finite-step guard (`max_nonfinite_in_a_row`) could skip the step; `auto` is off."""
    backend: Literal["megatron", "deepspeed"] = "megatron"
    micro_batch_size: int = 4
    global_batch_size: int = 1024
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    allow_cpu_bf16: bool = False
    overlap_grad_reduce: Union[Literal["auto"], bool] = "auto"
    overlap_param_gather: Union[Literal["auto"], bool] = "auto"
    check_for_nan_in_grad: Union[Literal["auto"], bool] = "auto"
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
    step 0, until the run has saved checkpoints of its own, which a re-run then resumes.
    `verify`: CRC-check every stored item (optimizer state included) before loading
    (checkpoint/verify.py); false skips that pass for storage one trusts (sizes are still checked)."""
    dir: Optional[str] = None
    save_interval: int = 1000
    save_at_end: bool = True
    load: str = "auto"
    keep_last: Optional[int] = None
    verify: bool = True


@dataclass
class RunConfig:
    run_dir: str = "runs/biglm"
    model: ModelSection = field(default_factory=ModelSection)
    objective: ObjectiveSection = field(default_factory=ObjectiveSection)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    zero_shot_eval: ZeroShotEvalConfig = field(default_factory=ZeroShotEvalConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir else Path(self.run_dir) / "checkpoints"

    @property
    def anneal_start_step(self) -> Optional[int]:
        """The last step before the decay; steps after it use the annealing blend."""
        if self.schedule.style != "wsd":
            return None
        return self.schedule.train_steps - self.schedule.wsd_decay_steps

    def to_dict(self) -> dict:
        """Plain data (what config.yaml holds): the sections as written, not as resolved."""
        tree = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value):
                value = dataclasses.asdict(value)
            elif isinstance(value, (ModelSection, ObjectiveSection)):
                value = value.to_dict()
            tree[f.name] = value
        return tree

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)


def validate(config: RunConfig) -> None:
    """Cross-field checks that need no distributed state (batch arithmetic needs the world
    size and is checked in `check_batch_arithmetic`)."""
    s, t = config.schedule, config.training
    positive = {"optimizer.lr": config.optimizer.lr, "schedule.train_steps": s.train_steps, "training.micro_batch_size": t.micro_batch_size,
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
        decay = config.schedule.wsd_decay_steps
        if s.decay_fraction is not None and not 0 < s.decay_fraction <= 1 and s.decay_steps is None:
            raise ConfigError(f"schedule.decay_fraction={s.decay_fraction} must be in (0, 1]")
        if not 0 < decay <= s.train_steps - s.warmup_steps:
            raise ConfigError(f"WSD decay of {decay} steps must be > 0 and fit after the warmup: "
                              f"schedule.train_steps - schedule.warmup_steps = {s.train_steps - s.warmup_steps}")
    if config.optimizer.min_lr > config.optimizer.lr:
        raise ConfigError(f"optimizer.min_lr={config.optimizer.min_lr} exceeds optimizer.lr={config.optimizer.lr}")
    if config.data.anneal_blend and s.style != "wsd":
        raise ConfigError("data.anneal_blend needs schedule.style=wsd (the blend switches when the decay starts)")
    if t.allow_cpu_bf16 and t.precision != "bf16":
        raise ConfigError(f"training.allow_cpu_bf16=true only applies to training.precision=bf16, but precision is "
                          f"{t.precision}; set training.precision=bf16, or drop training.allow_cpu_bf16")
    if t.allow_cpu_bf16 and t.backend != "megatron":
        raise ConfigError("training.allow_cpu_bf16 is for the megatron backend (its mixed-precision optimizer is "
                          "what runs and is tested on CPU); use training.backend=megatron, or fp32 on CPU")
    if t.backend == "deepspeed":
        _validate_deepspeed(config)
    if config.zero_shot_eval.problem():
        raise ConfigError(f"zero_shot_eval: {config.zero_shot_eval.problem()}")
    config.finetune.check()
    if config.finetune.enabled and config.parallelism.pipeline_model_parallel_size != 1:
        raise ConfigError("fine-tuning validates with the whole model on each rank: set "
                          "parallelism.pipeline_model_parallel_size=1 (tensor and data parallelism work)")
    if config.zero_shot_eval.enabled and config.parallelism.pipeline_model_parallel_size != 1:
        raise ConfigError("zero_shot_eval needs the whole model on each rank (pipeline_model_parallel_size=1); "
                          "evaluate the saved checkpoints instead")


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


def derive(config: RunConfig, **sections) -> RunConfig:
    """`config` with whole sections replaced (`dataclasses.replace` on the typed sections,
    e.g. `derive(cfg, schedule=replace(cfg.schedule, train_steps=48))`), checked once by the
    same cross-field rules as a loaded config. The one way a run derives its config from facts
    it learned after loading (a start checkpoint's shape, the epochs in steps); `config` is left
    as it was."""
    unknown = sorted(set(sections) - {f.name for f in dataclasses.fields(RunConfig)})
    if unknown:
        raise TypeError(f"derive: RunConfig has no section {unknown}")
    derived = dataclasses.replace(config, **sections)
    validate(derived)
    return derived


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


def check_sequence_fits(config: RunConfig) -> None:
    """`data.seq_length` fits the model (its RoPE tables are built up to `model.seq_length`).
    Checked as the run is prepared, before anything is built, not at load: the model's preset
    file is read only where the run is built (sections.ModelSection), and a fine-tune's plan
    derives both its sequence length and its model from facts it learns after loading."""
    mc = config.model.resolved
    # a fine-tune's sequence length is its finetune.max_length (the plan derives data.seq_length from it)
    key, length = (("finetune.max_length", config.finetune.max_length) if config.finetune.enabled
                   else ("data.seq_length", config.data.seq_length))
    if length > mc.seq_length:
        fixed = config.finetune.enabled and config.finetune.init_from
        raise ConfigError(f"{key}={length} exceeds the model's maximum model.seq_length={mc.seq_length}"
                          + (f" (the start checkpoint's, finetune.init_from={config.finetune.init_from}); lower {key}"
                             if fixed else f"; lower {key} or set model.seq_length"))


def save_resolved(config: RunConfig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_yaml(), encoding="utf-8")
    return path
