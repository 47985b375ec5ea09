"""Build a run's pieces: model chunks in megatron DDP, optimizer, pretraining data.

Each builder takes the config sections it reads (as megatron-core's builders take a
TransformerConfig, an OptimizerConfig, a DDP config), never the whole run config: run/train.py
reads the sections and hands them down. Each checks the input it is responsible for and fails
with a message that says what to change: a missing data path, a tokenizer that does not fit
the indexed data or the model's vocabulary.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer

from megatron_biglm import patches
from megatron_biglm.config import ConfigError, DataConfig, OptimizerConfig, TrainingConfig
from megatron_biglm.data.blend import parse_blend
from megatron_biglm.data.indexed_tools import CorruptDatasetError, check_dataset
from megatron_biglm.data.pretrain_data import build_pretrain_datasets
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.data.tokenizer import load_tokenizer
from megatron_biglm.model import model_provider
from megatron_biglm.model.config import resolve_dtype
from megatron_biglm.model.kernels import kernel_report
from megatron_biglm.training.finalize_grads import finalize_model_grads_per_token


def resolve_precision(training: TrainingConfig) -> str:
    """`auto`: bf16 on GPU, fp32 on CPU (CPU bf16 matmuls are slow and the tests need fp32).
    `bf16` without CUDA runs only with the explicit `training.allow_cpu_bf16: true`."""
    p = training.precision
    if p == "auto":
        return "bf16" if torch.cuda.is_available() else "fp32"
    if p == "bf16" and not torch.cuda.is_available() and not training.allow_cpu_bf16:
        raise ConfigError("training.precision=bf16 without a GPU is refused (bf16 matmuls are slow on most "
                          "CPUs); use fp32 (or auto) on CPU, or set training.allow_cpu_bf16=true to run "
                          "megatron's bf16 mixed precision on CPU anyway")
    return p


def kernels(mc, precision: str):
    """The kernel report (model/kernels.py) for the model config `mc` at `precision` on this
    machine; ConfigError when it names a kernel that is not installed, saying what to pip install."""
    return kernel_report(mc.attention_backend, resolve_dtype(precision), float(mc.attention_dropout),
                         mc.attention_compile, mc.transformer_impl)


def build_module(mc, precision: str, recompute: str, provider=None, random_init: bool = True):
    """This rank's bare model chunk and its TransformerConfig (shared by both backends), for the
    model config `mc` at `precision` with `training.recompute`'s activation recomputation.
    `provider`: a recipe's `model_provider` (model.model_provider's signature); None builds BiGLMModel.
    `random_init`: False when the caller loads the weights from a checkpoint next (a fine-tune's
    start point): megatron then leaves its layers' weights uninitialised instead of drawing
    136M normal samples it would overwrite (about a second of setup at the 136M shape). What
    the checkpoint lacks is not left so: the heads a fine-tune adds initialise themselves, and
    the loader (checkpoint/weights_only.py) refuses a checkpoint that leaves any other tensor
    unfilled."""
    extra = {"calculate_per_token_loss": True, "perform_initialization": random_init}
    if recompute == "full":
        extra.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    elif recompute == "selective":
        extra.update(recompute_granularity="selective")
    tcfg = mc.to_transformer_config(
        tensor_model_parallel_size=parallel_state.get_tensor_model_parallel_world_size(),
        pipeline_model_parallel_size=parallel_state.get_pipeline_model_parallel_world_size(),
        params_dtype=precision, **extra)
    module = (provider or model_provider)(
        pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=True),
        post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=True),
        config=mc, transformer_config=tcfg)
    if torch.cuda.is_available():
        module.cuda(torch.cuda.current_device())
    return module, tcfg


def build_model(mc, precision: str, ddp: DistributedDataParallelConfig, recompute: str, provider=None,
                random_init: bool = True):
    """This rank's model chunk wrapped in megatron DDP with the settings `ddp`
    (ddp_settings.ddp_config; one chunk: no virtual pipeline); the rest as in build_module."""
    module, tcfg = build_module(mc, precision, recompute, provider, random_init)
    model = DistributedDataParallel(config=tcfg, ddp_config=ddp, module=module)
    model.broadcast_params()
    tcfg.finalize_model_grads_func = finalize_model_grads_per_token
    if ddp.overlap_grad_reduce:  # the schedules hold the reduction back until the last micro-batch
        tcfg.no_sync_func = model.no_sync
    return [model], tcfg


def build_optimizer(o: OptimizerConfig, model_chunks, precision: str):
    """megatron's optimizer as the run config's `optimizer:` section says, over the DDP chunks,
    with the checkpoint fixes from patches/."""
    ocfg = MegatronOptimizerConfig(
        optimizer="adam", lr=o.lr, min_lr=o.min_lr, weight_decay=o.weight_decay, adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2, adam_eps=o.adam_eps, clip_grad=o.clip_grad, bf16=precision == "bf16",
        fp16=False, params_dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
        use_distributed_optimizer=o.use_distributed_optimizer)
    optimizer = get_megatron_optimizer(ocfg, model_chunks)
    # Makes the distributed optimizer's checkpoints save and load exactly (a no-op for the
    # plain optimizer); checkpoint.py then saves and loads with patches.DISTOPT_METADATA.
    patches.apply_distopt_checkpoint_fixes(optimizer)
    model_chunks[0].config.grad_scale_func = optimizer.scale_loss
    return optimizer


@dataclass
class DataBundle:
    tokenizer: object
    token_ids: object
    train: object
    valid: object
    anneal_start_sample: int | None


def check_vocab(token_ids, mc, prefixes) -> None:
    """The tokenizer must fit the model, and the indexed data must fit the tokenizer."""
    if token_ids.vocab_size > mc.vocab_size:
        raise ConfigError(
            f"tokenizer vocab {token_ids.vocab_size} is larger than model.vocab_size={mc.vocab_size}; "
            f"set model.vocab_size={token_ids.vocab_size} (or use the tokenizer the model was sized for)")
    for prefix in prefixes:
        # Header, version, .idx-vs-.bin sizes and ids-vs-tokenizer, before megatron-core opens
        # the files: a truncated .bin would otherwise fail deep inside its reader.
        try:
            check_dataset(prefix, vocab_size=token_ids.vocab_size)
        except CorruptDatasetError as exc:
            raise ConfigError(f"data: {exc}") from None


def build_data(d: DataConfig, objective, mc, *, train_samples: int, valid_samples: int,
               anneal_start_sample: int | None) -> DataBundle:
    """Pretraining's tokenizer and datasets from the `data:` section, for the resolved objective
    (`ObjectiveConfig`) and model config `mc`: `train_samples` and `valid_samples` samples, the
    annealing blend from `anneal_start_sample` on (None: no annealing)."""
    if not d.tokenizer:
        raise ConfigError("data.tokenizer is not set: give the tokenizer directory the data was preprocessed with")
    if not d.blend:
        raise ConfigError("data.blend is empty: give [[weight, path_prefix], ...] or [path_prefix, ...]")
    prefixes = []
    for key in ("blend", "anneal_blend", "valid_blend"):
        spec = getattr(d, key)
        if spec:
            try:
                prefixes += parse_blend(spec, f"data.{key}")[0]
            except FileNotFoundError as exc:
                raise ConfigError(str(exc)) from None
    if not os.path.exists(os.path.expanduser(d.tokenizer)):
        raise ConfigError(f"data.tokenizer={d.tokenizer} does not exist (a tokenizer directory is expected)")
    tokenizer = load_tokenizer(d.tokenizer)
    token_ids = TokenIds.from_tokenizer(tokenizer)
    check_vocab(token_ids, mc, prefixes)
    ds = build_pretrain_datasets(
        d, token_ids=token_ids, objective=objective, train_samples=train_samples, valid_samples=valid_samples,
        anneal_start_sample=anneal_start_sample, is_built_on_rank=lambda: True)
    return DataBundle(tokenizer, token_ids, ds.train, ds.valid, ds.anneal_start_sample)
