"""Import: an HF directory -> a megatron-biglm checkpoint at a chosen TP/PP, to train or fine-tune from.

Accepted sources: our exports and any native EuroBERT checkpoint of BiGLM's exact architecture
(a checkpoint that was never ours); everything else is refused with the field that differs.
An export of a fine-tuned task head comes back with its head: config.json's record
(`biglm_task_head`) names the head's entry (`model/task_heads.py`), whose rows map its weights,
and the record is sealed with the checkpoint as its `task_head.json`.

How the checkpoint is written: each of the TP×PP ranks builds its own megatron model chunk
(no initialisation), copies its slice of every HF tensor into it while streaming the HF files
tensor by tensor, and saves the chunk's own `sharded_state_dict` with `dist_checkpointing` —
the same keys, layouts and files the trainer writes, so megatron (which reshards on load) and
the trainer accept it. Called from one process with TP×PP > 1, `from_hf` starts those ranks
itself with torchrun. Each rank holds 1/(TP×PP) of the model plus one tensor in flight.

The result is the trainer's layout (``latest`` -> ``iter_0000000/``) with ``"weights_only":
true`` in ``train_state.json``: weights only, no optimizer, scheduler or RNG state. The run
config saved beside it spells out every model field, and ``model_preset.yaml`` in the root is
a preset file to point a training config's ``model.preset`` at.
"""
from __future__ import annotations

import collections
import json
import logging
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import List

import torch
import torch.distributed as dist
import yaml
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel

from megatron_biglm.checkpoint.dirs import WEIGHTS_ONLY_KEY
from megatron_biglm.checkpoint.dist_reader import DistCheckpointWeights
from megatron_biglm.checkpoint.files import begin_checkpoint, seal_when_written
from megatron_biglm.checkpoint.signature import signature_of
from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE, HeadRecord, record_from_json, task_head_text
from megatron_biglm.common import process_groups
from megatron_biglm.common.mcore_internals import in_process_save_strategy
from megatron_biglm.config import load_config, save_resolved
from megatron_biglm.data.tokenizer_check import check_import_tokenizer
from megatron_biglm.model import BiGLMModelConfig, ModelConfigError, load_preset, model_provider, preset_names
from megatron_biglm.model.head_model import head_model_provider, head_of_record
from megatron_biglm.model.heads import HEADS, task_head
from megatron_biglm.model.shape import config_settings
from megatron_biglm.model.standalone import init_single_process
from megatron_biglm.model.task_heads import HF_RECORD_KEY, TaskHead

from .conversion_summary import ConversionSummary, VerificationError, compare_written, with_progress
from .convert_to_hf import ConversionError, check_new_output
from .hf_config import UnsupportedArchitecture, architecture_from_hf_config, shape_from_biglm_config
from .hf_files import CheckpointFileError, HFWeights
from .tp_shards import split_for_tp
from .weight_mapping import (
    ConversionReport,
    detect_norm_naming,
    hf_tensor_shapes,
    hf_to_megatron,
    megatron_tensor_shapes,
)
from .weight_table import WEIGHT_TABLE, head_rows

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.txt", "vocab.json")
#: BiGLMModelConfig fields that must agree for an import to count as "that preset".
_PRESET_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "query_groups", "ffn_hidden_size",
                  "vocab_size", "seq_length", "rotary_base", "norm_epsilon", "make_vocab_size_divisible_by")
_PARAMS_DTYPE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class ImportPlan:
    """Everything decided (and checked) before any rank starts."""

    hf_dir: Path
    model_type: str
    model_config: object  # BiGLMModelConfig
    preset: str
    dtype: torch.dtype
    has_tokenizer: bool
    notes: List[str] = field(default_factory=list)
    head: HeadRecord | None = None   # an export of a task head: its record (config.json's biglm_task_head)

    @property
    def shape(self):
        return shape_from_biglm_config(self.model_config)

    @property
    def table(self):
        """The weight-table rows of this import: the trunk's, and the task head's when it has one."""
        return None if self.head is None else WEIGHT_TABLE + head_rows(self.head.head, head_of_record(self.head)[1])


def _task_head_record(hf_config, hf_dir: Path) -> HeadRecord | None:
    """The task head an HF export holds, from the record its config.json carries (the head's
    entry, `model/task_heads.py`, names its class), or None for a masked LM. A head class
    without the record is refused: its pooling and labels would be guesses."""
    saved = getattr(hf_config, HF_RECORD_KEY, None)
    architectures = list(getattr(hf_config, "architectures", None) or [])
    if saved is None:
        heads = {e.hf_class for e in HEADS.values() if isinstance(e, TaskHead)}
        if set(architectures) & heads:
            raise UnsupportedArchitecture(
                f"{hf_dir}/config.json is a {architectures[0]} without {HF_RECORD_KEY!r}: only a task head "
                "exported by megatron-biglm (which writes its record there) is imported with its head; "
                "import the encoder of a masked-LM export and fine-tune the head")
        return None
    try:
        record = record_from_json(saved)
        entry = task_head(record.head)
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointFileError(f"{hf_dir}/config.json: {HF_RECORD_KEY} is not a task-head record ({exc}); "
                                  "re-export the checkpoint") from None
    if not isinstance(record, HeadRecord) or architectures != [entry.hf_class]:
        raise CheckpointFileError(f"{hf_dir}/config.json: {HF_RECORD_KEY} names head {saved.get('head')!r} "
                                  f"but the architectures are {architectures}; re-export the checkpoint")
    return record


def _read_hf_config(hf_dir: Path):
    from transformers import AutoConfig  # lazy: start-up (transformers: 0.7 CPU s)

    path = hf_dir / "config.json"
    if not path.is_file():
        raise CheckpointFileError(f"{hf_dir} has no config.json; it is not an HF model directory")
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except ValueError as exc:
        raise CheckpointFileError(f"{path} is not valid JSON: {exc}") from exc
    if model_type != "eurobert":  # refuse with the architecture message, before transformers guesses
        architecture_from_hf_config(SimpleNamespace(model_type=model_type))
    return AutoConfig.from_pretrained(str(hf_dir))


def _biglm_model_config(hf_config, arch, hf_dir: Path):
    """Our BiGLMModelConfig for an HF EuroBERT config, refusing what BiGLM cannot express."""
    s = arch.shape
    if s.head_dim * s.num_attention_heads != s.hidden_size:
        raise UnsupportedArchitecture(
            f"head_dim={s.head_dim} is not supported with hidden_size={s.hidden_size} and "
            f"{s.num_attention_heads} heads: BiGLM's head dim is hidden_size / num_attention_heads")
    try:
        mc = BiGLMModelConfig(
            **config_settings(s),  # an untied lm_head -> output_layer
            seq_length=arch.max_position_embeddings, rotary_base=arch.rope_theta, norm_epsilon=arch.rms_norm_eps,
            init_method_std=float(getattr(hf_config, "initializer_range", 0.02) or 0.02),
            name=f"imported-{hf_dir.name}")
    except ModelConfigError as exc:
        raise UnsupportedArchitecture(f"the HF config is not a valid BiGLM shape: {exc}") from None
    for name in preset_names():
        preset = load_preset(name)
        if all(getattr(preset, f) == getattr(mc, f) for f in _PRESET_FIELDS):
            return mc.replace(name=name, init_method_std=preset.init_method_std), name
    return mc, "tiny"  # a base only: every model field is overridden in the saved run config


def plan_import(hf_dir, tp: int = 1, pp: int = 1) -> ImportPlan:
    """Read and check the HF directory (config, weight files and names, tokenizer) and the layout."""
    hf_dir = Path(hf_dir).expanduser()
    if not hf_dir.is_dir():
        raise CheckpointFileError(f"{hf_dir} is not a directory")
    hf_config = _read_hf_config(hf_dir)
    arch = architecture_from_hf_config(hf_config)
    mc, preset = _biglm_model_config(hf_config, arch, hf_dir)

    try:
        mc.check_parallel_layout(tp, pp)
    except ModelConfigError as exc:
        raise ConversionError(f"cannot import at TP={tp}, PP={pp}: {exc}") from None
    head = _task_head_record(hf_config, hf_dir)
    weights = HFWeights(hf_dir)  # missing / corrupt shards are refused here
    table = None if head is None else WEIGHT_TABLE + head_rows(head.head, head_of_record(head)[1])
    hf_to_megatron(weights, shape_from_biglm_config(mc), table=table)  # every name checked before any rank starts
    dtype = weights["model.norm.weight"].dtype
    if dtype not in _PARAMS_DTYPE:
        raise ConversionError(f"weights of dtype {dtype} are not supported; use fp32, bf16 or fp16")
    notes = []
    has_tokenizer = any((hf_dir / name).is_file() for name in TOKENIZER_FILES)
    if has_tokenizer:
        from transformers import AutoTokenizer  # lazy: start-up (transformers: 0.7 CPU s)

        tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
        notes += check_import_tokenizer(tokenizer, hf_config, f"{hf_dir}")
    else:
        notes.append(f"{hf_dir} has no tokenizer: set data.tokenizer to the model's tokenizer before training")
    return ImportPlan(hf_dir, hf_config.model_type, mc, preset, dtype, has_tokenizer, notes, head)


def run_config_tree(plan: ImportPlan, output_dir: Path, tp: int, pp: int) -> dict:
    """The run config saved with the checkpoint: every model field explicit (relocatable)."""
    mc = plan.model_config
    return {
        "model": {"preset": plan.preset, **mc.to_dict()},
        "data": {"tokenizer": str(output_dir / "tokenizer") if plan.has_tokenizer else None,
                 "seq_length": min(2048, mc.seq_length)},
        "parallelism": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
        "checkpoint": {"dir": str(output_dir)},
    }


# ------------------------------------------------------------------------------ per rank


def _local_targets(model, name: str) -> List[str]:
    """The local parameter names of this chunk that hold (a TP slice of) global tensor `name`."""
    if name == "output_layer.weight":  # untied: the last stage's own output projection
        return [name] if model.post_process else []
    if name == "embedding.word_embeddings.weight":
        out = ["embedding.word_embeddings.weight"] if model.pre_process else []
        if model.post_process and not model.pre_process and model.share_embeddings_and_output_weights:
            out.append("output_layer.weight")  # a PP>1 last stage keeps a tied copy
        return out
    if name == "decoder.final_layernorm.weight" or name.startswith("task_head."):
        return [name] if model.post_process else []
    _, _, index, rest = name.split(".", 3)
    local = {layer.layer_number - 1: i for i, layer in enumerate(model.decoder.layers)}
    return [f"decoder.layers.{local[int(index)]}.{rest}"] if int(index) in local else []


def write_checkpoint(plan: ImportPlan, output_dir: Path, tp: int, pp: int, progress: bool = True) -> Path:
    """Run on every rank of a TP×PP(×DP) job (or alone for 1×1): build, fill and save the chunk."""

    created_group = not dist.is_initialized()
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    init_single_process(tp, pp)
    try:
        rank = dist.get_rank()
        tensor_parallel.model_parallel_cuda_manual_seed(0)
        stages = (parallel_state.is_pipeline_first_stage(ignore_virtual=True),
                  parallel_state.is_pipeline_last_stage(ignore_virtual=True))
        if plan.head is None:
            model = model_provider(*stages, config=plan.model_config, params_dtype=_PARAMS_DTYPE[plan.dtype],
                                   perform_initialization=False)
        else:  # the trunk and the task head its record names
            tcfg = plan.model_config.to_transformer_config(
                tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                params_dtype=_PARAMS_DTYPE[plan.dtype], perform_initialization=False)
            model = head_model_provider(*head_of_record(plan.head))(*stages, plan.model_config, tcfg)
        params = dict(model.named_parameters())
        filled = set()
        tp_rank, shape = parallel_state.get_tensor_model_parallel_rank(), plan.shape
        stream = hf_to_megatron(HFWeights(plan.hf_dir), shape, norm_naming="local", table=plan.table)
        with torch.no_grad():
            for name, full in with_progress(stream, len(megatron_tensor_shapes(shape, table=plan.table)),
                                            "HF -> megatron",
                                            progress and rank == 0):
                for target in _local_targets(model, name):
                    params[target].copy_(split_for_tp(name, full, tp)[tp_rank])
                    filled.add(target)
        unfilled = sorted(set(params) - filled)
        if unfilled:
            raise VerificationError(f"rank {rank}: parameters not covered by the HF weights: {unfilled[:4]}")
        dist.barrier()  # every rank has checked that the output is new before rank 0 writes into it
        temp = begin_checkpoint(output_dir, 0, subdirs=("dist",))  # the trainer's own temp-dir protocol
        dist_checkpointing.save({"model": model.sharded_state_dict()}, str(temp / "dist"),
                                sharded_strategy=in_process_save_strategy())
        if rank == 0:
            _write_metadata(plan, temp, output_dir, tp, pp, dist.get_world_size())
        return seal_when_written(temp, 0)
    finally:
        if created_group:
            process_groups.destroy(created_group)


def _write_metadata(plan: ImportPlan, temp: Path, output_dir: Path, tp: int, pp: int, world: int) -> None:
    """Rank 0: the trainer's metadata files in `temp`; preset file and tokenizer in the root."""

    mc = plan.model_config
    state = {WEIGHTS_ONLY_KEY: True, "iteration": 0, "consumed_samples": 0, "consumed_tokens": 0,
             "tp": tp, "pp": pp, "world_size": world, "dp": world // (tp * pp),
             "source": {"hf_dir": str(plan.hf_dir.resolve()), "model_type": plan.model_type}}
    (temp / "train_state.json").write_text(json.dumps(state, indent=1))
    (temp / "model_signature.json").write_text(json.dumps(signature_of(mc), indent=1))
    save_resolved(load_config(run_config_tree(plan, output_dir, tp, pp)), temp / "config.yaml")
    if plan.head is not None:
        (temp / TASK_HEAD_FILE).write_text(task_head_text(plan.head), encoding="utf-8")
    preset = {"model": {k: v for k, v in mc.to_dict().items() if v is not None}}
    (output_dir / "model_preset.yaml").write_text(
        f"# BiGLM shape imported from {plan.hf_dir} (model_type {plan.model_type}).\n"
        + yaml.safe_dump(preset, sort_keys=False))
    if plan.has_tokenizer:
        from transformers import AutoTokenizer  # lazy: start-up (transformers: 0.7 CPU s)

        AutoTokenizer.from_pretrained(str(plan.hf_dir)).save_pretrained(str(output_dir / "tokenizer"))


# ------------------------------------------------------------------------------ driver


def _launched_world_size() -> int:
    """Ranks of the job this process belongs to (1 when run alone, even under a 1-rank launch)."""
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1)) if "RANK" in os.environ else 1


def _spawn_ranks(hf_dir: Path, output_dir: Path, tp: int, pp: int, progress: bool) -> None:
    """Run the import on TP×PP local processes with torchrun; stream their output to stderr."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(tp * pp), "-m", "megatron_biglm.cli.convert", "from-hf",
           "--hf", str(hf_dir), "--output", str(output_dir), "--tp", str(tp), "--pp", str(pp), "--no-verify"]
    cmd += [] if progress else ["--quiet"]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo_root, env.get("PYTHONPATH")) if p)
    tail = collections.deque(maxlen=200)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    for chunk in iter(lambda: proc.stdout.read1(4096), b""):
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        tail.append(chunk)
    if proc.wait() != 0:
        raise ConversionError(f"the {tp * pp} import processes (torchrun) failed with exit code "
                              f"{proc.returncode}; their output ends with:\n"
                              + b"".join(tail).decode(errors="replace")[-4000:])


def verify_import(plan: ImportPlan, checkpoint: Path) -> ConversionSummary:
    """Read the saved checkpoint back (any layout) and compare it with the HF weights."""
    saved = DistCheckpointWeights(checkpoint / "dist", plan.model_config.num_layers)
    report = ConversionReport()
    hf = HFWeights(plan.hf_dir)
    expected = hf_to_megatron(hf, plan.shape, norm_naming=detect_norm_naming(saved.keys()), report=report,
                              table=plan.table)
    comparison = compare_written(saved, expected)
    if comparison.max_abs_diff != 0.0:
        raise VerificationError(f"the saved checkpoint differs from the HF weights by up to "
                                f"{comparison.max_abs_diff} (at {comparison.worst}); do not use {checkpoint}")
    notes = list(plan.notes)
    padding = plan.model_config.padded_vocab_size - plan.model_config.vocab_size
    if padding:
        notes.append(f"{padding} vocabulary padding rows were added as zeros (megatron pads to a "
                     f"multiple of {plan.model_config.make_vocab_size_divisible_by})")
    root = checkpoint.parent
    notes.append(f"weights only (train_state.json: \"{WEIGHTS_ONLY_KEY}\": true): start training or "
                 f"fine-tuning with checkpoint.load={root}; model.preset={root / 'model_preset.yaml'}")
    hf_parameters = sum(math.prod(s) for s in hf_tensor_shapes(plan.shape, plan.table).values())
    return ConversionSummary(
        direction="HF -> megatron", source=str(plan.hf_dir), output=str(checkpoint),
        tensors=comparison.tensors, source_parameters=hf_parameters,
        output_parameters=saved.numel(), max_abs_diff=comparison.max_abs_diff, worst_tensor=comparison.worst,
        dtype=str(plan.dtype).replace("torch.", ""), files=sorted(str(p) for p in (checkpoint / "dist").iterdir()),
        skipped={**report.ignored}, notes=notes)


def from_hf(hf_dir, output_dir, *, tp: int = 1, pp: int = 1, progress: bool = True,
            verify: bool = True) -> ConversionSummary | None:
    """Write a weights-only megatron-biglm checkpoint of `hf_dir` under `output_dir` at TP×PP.

    From one process with TP×PP > 1 this starts TP×PP torchrun ranks; inside a launched job
    every rank must call it. Returns the verified summary (None on ranks other than 0, or when
    `verify` is False).
    """
    plan = plan_import(hf_dir, tp, pp)
    output_dir = Path(output_dir).expanduser()
    world = _launched_world_size()
    if world > 1 and world % (tp * pp):
        raise ConversionError(f"this job has {world} ranks, not a multiple of TP×PP = {tp * pp}; launch "
                              f"{tp * pp} ranks, or run from-hf as one process (it starts the ranks itself)")
    check_new_output(output_dir, plan.hf_dir)  # every rank, before any rank writes
    if world > 1 or tp * pp == 1:
        checkpoint = write_checkpoint(plan, output_dir, tp, pp, progress)
    else:
        _spawn_ranks(plan.hf_dir, output_dir, tp, pp, progress)
        checkpoint = output_dir / "iter_0000000"
    if not verify or (world > 1 and int(os.environ.get("RANK", 0)) != 0):
        return None
    summary = verify_import(plan, checkpoint)
    logger.info("%s", summary.format())
    return summary
