"""From a loaded run config with a `finetune:` section to what `train()` runs: the config the
run really has, the recipe (the task's kind, `finetune/kinds/`), the schedule in steps, and the
validation callback.

`finetune.train_examples=0` plans no training (`train_steps` 0, the schedule as loaded): the
driver scores the start point on the evaluation splits instead (`start_scores.py`).

What the plan learns after loading is written into the typed sections with `config.derive`
(checked once): here, the start checkpoint's model shape and tokenizer; in the kind's plan
(`finetune/kinds/planning.py`), the epochs as steps (only the encoded training set says how
many examples there are; `finetune/schedule.py`) and what the kind settles (a head's
`finetune.options.label_names`, the length head's size). The run's saved config.yaml is that
config: the steps it really ran and what an export needs to know.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from megatron_biglm.checkpoint.dirs import is_weights_only, read_train_state_file
from megatron_biglm.checkpoint.run_checkpoint import locate
from megatron_biglm.config import ConfigError, RunConfig, check_sequence_fits, derive
from megatron_biglm.config.finetune_section import INIT_KEY
from megatron_biglm.config.trained_checkpoint import open_checkpoint
from megatron_biglm.data.tokenizer import TokenizerLoadError, load_tokenizer, looks_like_hub_name
from megatron_biglm.data.tokenizer_check import TokenizerMismatch, check_trained_digest, checkpoint_tokenizer
from megatron_biglm.finetune.kinds.planning import KindPlan, plan_kind, refuse_untrained_scoring
from megatron_biglm.finetune.tasks import get_task
from megatron_biglm.model.shape import SHAPE_SETTINGS

#: what `plan_finetune` returns: the kind's plan (the config the run trains with, the recipe,
#: the validator, the schedule in steps), its notes led by the start checkpoint's
FinetunePlan = KindPlan


#: the model keys a fine-tune takes from its start checkpoint (what its weights' shapes and
#: meaning depend on); runtime settings (attention backend, compile, dropout) stay the run's, and
#: a task's own heads (the CMLM length head) are the recipe's (a head the start lacks starts fresh)
START_MODEL_KEYS = SHAPE_SETTINGS + ("seq_length", "rotary_base", "norm_epsilon", "name")


def open_start(cfg: RunConfig):
    """The start checkpoint (`finetune.init_from`) with its saved run config: opened once, for
    everything the plan takes from it (its shape, its tokenizer and the checks of both)."""
    return open_checkpoint(locate(cfg.finetune.init_from, INIT_KEY), INIT_KEY)


def from_start(cfg: RunConfig, start) -> tuple[RunConfig, str]:
    """`cfg` with the start checkpoint's model shape (`START_MODEL_KEYS`) and its tokenizer
    (unless the run sets one), and the note that says so. A fine-tune's weights come from its
    start point (`finetune.init_from`), so its shape does too: no preset to match by hand."""
    fields = start.model_config.to_dict()
    model = cfg.model.with_values(**{k: fields[k] for k in START_MODEL_KEYS if fields.get(k) is not None})
    note = (f"model from finetune.init_from {start.path}: {fields['num_layers']} layers, hidden "
            f"{fields['hidden_size']}, {fields['num_attention_heads']} heads, vocabulary {fields['vocab_size']}")
    data = cfg.data
    saved_tokenizer = start.run_config.data.tokenizer
    if cfg.data.tokenizer:
        start_tokenizer(cfg, start)
    if not cfg.data.tokenizer and saved_tokenizer:
        data = dataclasses.replace(cfg.data, tokenizer=saved_tokenizer)
        note += f"; its tokenizer {saved_tokenizer}"
        if start.tokenizer_lookup and not looks_like_hub_name(saved_tokenizer):  # found nowhere by the rule
            raise ConfigError(f"data.tokenizer: the tokenizer {saved_tokenizer!r} saved with finetune.init_from "
                              f"{start.path} is not a directory beside its config, in a folder above it or in the "
                              f"working directory ({start.tokenizer_lookup[0]} ... {start.tokenizer_lookup[-1]}); "
                              "set data.tokenizer=DIR, the tokenizer the start checkpoint was trained with")
        try:
            check_trained_digest(saved_tokenizer, start.run_config.data.tokenizer_sha256,
                                 f"the tokenizer saved with finetune.init_from {start.path},")
        except TokenizerMismatch as exc:
            raise ConfigError(f"data.tokenizer: {exc} (set data.tokenizer=DIR)") from None
    return derive(cfg, model=model, data=data), note


def start_tokenizer(cfg: RunConfig, start) -> None:
    """A `data.tokenizer` the run sets must be `init_from`'s own (`checkpoint_tokenizer`: its
    recorded SHA-256 and embedding rows), checked before the model is built."""
    if looks_like_hub_name(cfg.data.tokenizer):
        return
    try:
        checkpoint_tokenizer(cfg.data.tokenizer, vocab_size=start.model_config.vocab_size,
                             trained_digest=start.run_config.data.tokenizer_sha256,
                             trained_path=start.run_config.data.tokenizer,
                             checkpoint=f"finetune.init_from {start.path}")
    except TokenizerMismatch as exc:
        raise ConfigError(str(exc)) from None


def refuse_foreign_resume(cfg) -> None:
    """A fine-tune's `checkpoint.load` may name a weights-only import (a start: fresh optimizer,
    step 0) or this run's own checkpoints (a resume). Another run's full checkpoint, e.g. the
    pretraining run, would be resumed as if it were this fine-tune: its step, its consumed
    samples and its schedule, on the fine-tune's data. Refused before anything is built, naming
    `finetune.init_from`, which takes that checkpoint's weights."""

    load = cfg.checkpoint.load
    if load in ("auto", "none"):
        return
    folder = locate(load)
    own = Path(cfg.checkpoint_dir).resolve()
    if is_weights_only(read_train_state_file(folder)) or own in folder.resolve().parents:
        return
    raise ConfigError(
        f"checkpoint.load={load} is another run's checkpoint ({folder}, with its own step and schedule); a "
        f"fine-tune resumes only its own checkpoints (under {cfg.checkpoint_dir}). To start from its weights, "
        f"pass finetune.init_from={load} instead of checkpoint.load")


def plan_finetune(cfg: RunConfig) -> FinetunePlan:
    """Everything a fine-tune checks and derives before anything is built, from the config
    its command loaded once; `plan.config` is the config the run trains with. The run's own
    checks come first (its resume, its start checkpoint and tokenizer, a zero-shot run's
    start); the task's kind then plans the rest in one call (`plan_kind`)."""
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"plan_finetune takes a loaded RunConfig (megatron_biglm.config.load_config), "
                        f"got {type(cfg).__name__}")
    refuse_foreign_resume(cfg)
    start = start_note = None
    # a run that trains builds the start's model; scoring it (train_examples=0) loads it as
    # saved, and needs only its tokenizer when the run names none
    if cfg.finetune.enabled and cfg.finetune.init_from and (cfg.finetune.train_examples != 0 or not cfg.data.tokenizer):
        start = open_start(cfg)
        cfg, start_note = from_start(cfg, start)
    options = cfg.finetune
    if not options.enabled:
        raise ConfigError("this config has no finetune.task; name one (e.g. finetune.task=mnli) or use "
                          "megatron_biglm.cli.train for pretraining")
    if not cfg.data.tokenizer:
        raise ConfigError("fine-tuning needs data.tokenizer (the pretrained model's tokenizer)")
    check_sequence_fits(cfg)  # finetune.max_length fits the model, before any data is read
    try:
        task = get_task(options.task)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if options.train_examples == 0:
        check_zero_shot(cfg, task, start)
    try:
        tokenizer = load_tokenizer(cfg.data.tokenizer)
    except TokenizerLoadError as exc:
        raise ConfigError(f"data.tokenizer: {exc}") from None
    kind = plan_kind(task, tokenizer, cfg)  # files, labels, every split read once, metrics, schedule
    return dataclasses.replace(kind, notes=[start_note, *kind.notes]) if start_note else kind


def check_zero_shot(cfg: RunConfig, task, start) -> None:
    """`finetune.train_examples=0` scores the start point as it is, checked before any data is
    read: it needs one (`init_from`), a kind that reads answers off the pretrained model (the
    kind's to say: `refuse_untrained_scoring`), and a `data.tokenizer` the run names must be the
    start's own. `start`: the start checkpoint when the plan has opened it already (for its
    tokenizer), else None."""
    if not cfg.finetune.init_from:
        raise ConfigError("finetune.train_examples=0 scores the start point without training: set "
                          "finetune.init_from=CHECKPOINT (the model to score)")
    refuse_untrained_scoring(task)
    if cfg.data.tokenizer:  # scored as saved: a tokenizer the run names must still be the start's own
        start_tokenizer(cfg, start or open_start(cfg))
