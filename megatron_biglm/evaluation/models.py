"""The lm-eval models we register: `hf-mlm` (any HF masked LM) and `biglm` (our models).

Model arguments (lm-eval `--model_args k=v,...`, or keyword arguments):
  pretrained / path   HF directory, or an already loaded model object; for `biglm` also a
                      megatron checkpoint (root, iter_* folder or run directory, any TP/PP)
  tokenizer           tokenizer directory or object (default: same as the model; for a
                      megatron checkpoint the run's data.tokenizer)
  scoring             beam (default) | oneshot | pll | l2r | elbo;  beam: beam width (default 1)
  elbo_samples, seed  Monte-Carlo draws per request of the elbo rule (default 128) and their seed
  length_buckets      auto | off | pow2 | N: round padded lengths up (auto: multiples of 64 on
                      GPU so compiled kernels do not recompile per length, off on CPU)
  batch_size          rows per forward pass (default 16; lm-eval's "auto" means 16)
  device, dtype       e.g. cpu / cuda:0, float32 / bfloat16 / float16 / float64 / auto
                      (megatron checkpoints: not float64; auto = the stored dtype)
  split_attention     auto | on | off   (how context rows are restricted; see hf_adapter)
  prefix_cache        auto | on | off   (whether the adapter may cache prefix keys/values)
  prefix_reuse        auto | on | off   (whether scoring uses that cache)
  add_eos             close inputs with EOS/SEP after the continuation (default false)
  max_length          override the model's maximum input length
  trust_remote_code   for HF models that ship their own code (default false)
  verify              megatron checkpoints: CRC-check every stored item first (default true;
                      false skips it for storage one trusts)
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from megatron_biglm.common.config_fields import coerce
from megatron_biglm.inference.buckets import resolve_length_buckets
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.inference.loading import (  # noqa: F401 - re-exported for callers
    hf_max_length, is_megatron_checkpoint, load_hf_masked_lm, resolve_device)
from megatron_biglm.inference.protocol import inference_token_ids

from .lm import MaskedLMEvalLM

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 16


def tristate(value: Any, name: str) -> str:
    """auto/on/off from lm-eval's parsed arguments (which turn true/false into bools)."""
    if value is None:
        return "auto"
    if isinstance(value, bool):
        return "on" if value else "off"
    value = str(value).lower()
    if value not in ("auto", "on", "off"):
        raise ValueError(f"{name} must be auto, on or off (or true/false), got {value!r}")
    return value


def batch_size_arg(value: Any) -> int:
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {value!r}")
    return size


def split_attention_for_variant(variant: str, requested: str | None) -> tuple[str, str]:
    """("on"/"off", why) for a megatron checkpoint trained as `variant` (objective.variant).

    Scored as trained by default: `biglm` was trained with split attention, `mlm` and `no_attn`
    with full attention, so scoring those with the split would measure a model that never
    existed. An explicit `split_attention=on/off` wins, and the reason is recorded in the
    results JSON (`config.model_info.masked_lm_eval.split_attention_choice`).
    """
    if requested in ("on", "off"):
        return requested, f"split_attention={requested} (argument; checkpoint trained as {variant!r})"
    chosen = "on" if variant == "biglm" else "off"
    return chosen, f"{chosen}: the checkpoint's objective.variant is {variant!r}"


def _refuse_unknown(unknown: dict) -> None:
    if unknown:
        raise TypeError(f"unknown model argument(s) {sorted(unknown)}; see "
                        "megatron_biglm/evaluation/models.py for the supported ones")


def load_tokenizer_for(path_or_obj):
    if not isinstance(path_or_obj, (str, os.PathLike)):
        return path_or_obj
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path_or_obj))


class HFMaskedLMEvalLM(MaskedLMEvalLM):
    """`hf-mlm`: any `AutoModelForMaskedLM` (BERT, RoBERTa, EuroBERT, ...)."""

    default_split_attention = "auto"

    def __init__(self, pretrained=None, path=None, tokenizer=None, scoring: str = "beam",
                 beam: int = 1, batch_size=DEFAULT_BATCH_SIZE, max_batch_size=None,
                 device: str | None = None, dtype: str = "float32", split_attention=None,
                 prefix_cache=None, prefix_reuse=None, add_eos: bool = False,
                 max_length: int | None = None, trust_remote_code: bool = False,
                 progress: bool = True, elbo_samples: int = 128, seed: int = 0,
                 length_buckets="auto", **unknown):
        _refuse_unknown(unknown)
        source = pretrained if pretrained is not None else path
        if source is None:
            raise ValueError("give the model as pretrained=DIR (or path=DIR)")
        device = resolve_device(device)
        model = source if not isinstance(source, (str, os.PathLike)) else self._load(
            source, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        if tokenizer is None and not isinstance(source, (str, os.PathLike)):
            raise ValueError("a model object needs tokenizer= (a directory or tokenizer object)")
        tok = load_tokenizer_for(tokenizer if tokenizer is not None else source)
        special = inference_token_ids(tok)
        adapter = HFMaskedLMAdapter(
            model, special, max_length=max_length or hf_max_length(model, tok),
            split_attention=tristate(split_attention, "split_attention")
            if split_attention is not None else self.default_split_attention,
            prefix_cache=tristate(prefix_cache, "prefix_cache"))
        adapter.length_buckets = resolve_length_buckets(length_buckets, adapter.device)
        super().__init__(adapter, tok, scoring=scoring, beam=beam, elbo_samples=elbo_samples,
                         seed=seed,
                         batch_size=batch_size_arg(batch_size),
                         prefix_reuse=tristate(prefix_reuse, "prefix_reuse"),
                         add_eos=bool(add_eos), progress=progress)
        log.info("masked LM ready: %s", self.get_model_info()["masked_lm_eval"])

    def _load(self, source, **kwargs):
        return load_hf_masked_lm(source, **kwargs)


class BiGLMEvalLM(HFMaskedLMEvalLM):
    """`biglm`: our model, from an exported HF directory (native EuroBERT layout) or from a
    megatron checkpoint (a checkpoint root, one `iter_*` folder or a run directory; saved at
    any TP/PP), run in-process at TP=1/PP=1 with the run's own tokenizer (or `tokenizer=`).

    Split attention defaults to "on" for an HF export: BiGLM is trained with it, so an export
    that cannot apply it is refused rather than silently scored with full attention. A megatron
    checkpoint is scored as it was trained: on for `objective.variant: biglm`, off for `mlm`
    and `no_attn` (`split_attention_for_variant`; the choice is in the results JSON). The megatron path applies
    it natively and has no prefix cache (`prefix_cache=on` is refused there: evaluate the
    `to_hf` export for prefix reuse; its scores are the same)."""

    default_split_attention = "on"

    def __init__(self, pretrained=None, path=None, tokenizer=None, **kwargs):
        source = pretrained if pretrained is not None else path
        if isinstance(source, (str, os.PathLike)) and is_megatron_checkpoint(source):
            self._init_megatron(source, tokenizer, **kwargs)
            return
        if isinstance(source, (str, os.PathLike)) and not (Path(source) / "config.json").is_file():
            raise FileNotFoundError(
                f"{source} is neither an exported HF directory (no config.json) nor a megatron "
                "checkpoint (no `latest`, COMPLETE.json, checkpoints/latest or iter_* folders); "
                "pass path=DIR of one of them")
        super().__init__(pretrained=pretrained, path=path, tokenizer=tokenizer, **kwargs)

    def _init_megatron(self, source, tokenizer, scoring: str = "beam", beam: int = 1,
                       batch_size=DEFAULT_BATCH_SIZE, max_batch_size=None,
                       device: str | None = None, dtype: str = "float32", split_attention=None,
                       prefix_cache=None, prefix_reuse=None, add_eos: bool = False,
                       max_length: int | None = None, trust_remote_code: bool = False,
                       progress: bool = True, elbo_samples: int = 128, seed: int = 0,
                 length_buckets="auto", verify=True, **unknown):
        from megatron_biglm.inference.loading import load_megatron_checkpoint
        from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter

        _refuse_unknown(unknown)
        if tristate(prefix_cache, "prefix_cache") == "on":
            raise ValueError(f"prefix_cache=on is not available for a megatron checkpoint ({source}): "
                             "export it with `convert_checkpoint.py to-hf` and evaluate path=EXPORT_DIR "
                             "for prefix reuse, or drop prefix_cache")
        split = tristate(split_attention, "split_attention") if split_attention is not None else None
        loaded = load_megatron_checkpoint(source, tokenizer=tokenizer, device=resolve_device(device),
                                          dtype=str(dtype), verify=coerce(verify, bool, "verify", error=ValueError))
        variant = loaded.checkpoint.run_config.objective.resolved.variant
        split, self.split_attention_choice = split_attention_for_variant(variant, split)
        model_max = int(loaded.checkpoint.model_config.seq_length)
        adapter = MegatronMaskedLMAdapter(
            loaded.model, inference_token_ids(loaded.tokenizer),
            vocab_size=loaded.checkpoint.model_config.vocab_size,
            max_length=min(int(max_length), model_max) if max_length else model_max,
            split_attention=split != "off",
            # The adapter's cache is exact, but lm-eval's `biglm` keeps the uncached megatron
            # path (and refuses prefix_cache=on above) until that behaviour is changed on purpose.
            prefix_cache=False)
        adapter.length_buckets = resolve_length_buckets(length_buckets, adapter.device)
        self.load_notes = loaded.notes
        MaskedLMEvalLM.__init__(self, adapter, loaded.tokenizer, scoring=scoring, beam=beam,
                                elbo_samples=elbo_samples, seed=seed,
                                batch_size=batch_size_arg(batch_size),
                                prefix_reuse=tristate(prefix_reuse, "prefix_reuse"),
                                add_eos=bool(add_eos), progress=progress)
        log.info("megatron checkpoint ready: %s; %s", "; ".join(loaded.notes),
                 self.get_model_info()["masked_lm_eval"])

    def get_model_info(self):
        info = super().get_model_info()
        if getattr(self, "split_attention_choice", None):
            info["masked_lm_eval"]["split_attention_choice"] = self.split_attention_choice
        if getattr(self, "load_notes", None):
            info["masked_lm_eval"]["load_notes"] = list(self.load_notes)
        return info
