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
  cache_layout        grow | pool       (megatron checkpoints: the cache's keys/values as growing
                      tensors, or in preallocated per-prompt slots whose continuations are
                      scored together against one read of the prompt)
  add_eos             close inputs with EOS/SEP after the continuation (default false)
  max_length          override the model's maximum input length
  trust_remote_code   for HF models that ship their own code (default false)
  verify              megatron checkpoints: CRC-check every stored item first (default true;
                      false skips it for storage one trusts)
"""
from __future__ import annotations

import logging
from typing import Any

from megatron_biglm.common.config_fields import coerce
from megatron_biglm.inference.loading import load_adapter

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


class HFMaskedLMEvalLM(MaskedLMEvalLM):
    """`hf-mlm`: any `AutoModelForMaskedLM` (BERT, RoBERTa, EuroBERT, ...); split attention
    "auto" (applied where the model takes a 4D mask) unless asked for."""

    hf_split_attention = "auto"

    def __init__(self, pretrained=None, path=None, tokenizer=None, scoring: str = "beam",
                 beam: int = 1, batch_size=DEFAULT_BATCH_SIZE, max_batch_size=None,
                 device: str | None = None, dtype: str = "float32", split_attention=None,
                 prefix_cache=None, prefix_reuse=None, add_eos: bool = False,
                 max_length: int | None = None, trust_remote_code: bool = False,
                 progress: bool = True, elbo_samples: int = 128, seed: int = 0,
                 length_buckets="auto", verify=True, cache_layout: str = "grow", **unknown):
        if unknown:
            raise TypeError(f"unknown model argument(s) {sorted(unknown)}; see "
                            "megatron_biglm/evaluation/models.py for the supported ones")
        source = pretrained if pretrained is not None else path
        if source is None:
            raise ValueError("give the model as pretrained=DIR (or path=DIR)")
        loaded = load_adapter(
            source, tokenizer=tokenizer, device=device, dtype=str(dtype),
            split_attention=None if split_attention is None else tristate(split_attention, "split_attention"),
            hf_split_attention=self.hf_split_attention,
            prefix_cache=tristate(prefix_cache, "prefix_cache"), max_length=max_length,
            trust_remote_code=bool(trust_remote_code), length_buckets=length_buckets,
            verify=coerce(verify, bool, "verify", error=ValueError), cache_layout=str(cache_layout))
        self.load_notes, self.split_attention_choice = loaded.notes, loaded.split_attention_choice
        super().__init__(loaded.adapter, loaded.tokenizer, scoring=scoring, beam=beam,
                         elbo_samples=elbo_samples, seed=seed,
                         batch_size=batch_size_arg(batch_size),
                         prefix_reuse=tristate(prefix_reuse, "prefix_reuse"),
                         add_eos=bool(add_eos), progress=progress)
        log.info("masked LM ready: %s; %s", "; ".join(loaded.notes),
                 self.get_model_info()["masked_lm_eval"])

    def get_model_info(self):
        info = super().get_model_info()
        info["masked_lm_eval"]["load_notes"] = list(self.load_notes)
        if self.split_attention_choice:
            info["masked_lm_eval"]["split_attention_choice"] = self.split_attention_choice
        return info


class BiGLMEvalLM(HFMaskedLMEvalLM):
    """`biglm`: our model, from an exported HF directory (native EuroBERT layout) or from a
    megatron checkpoint (a checkpoint root, one `iter_*` folder or a run directory; saved at
    any TP/PP), run in-process at TP=1/PP=1 with the run's own tokenizer (or `tokenizer=`),
    both through the one inference loader (`inference.loading.load_adapter`), with the exact
    prefix cache where the split allows it.

    Split attention defaults to "on" for an HF export: BiGLM is trained with it, so an export
    that cannot apply it is refused rather than silently scored with full attention. A megatron
    checkpoint is scored as it was trained: on for `objective.variant: biglm`, off for `mlm`
    and `no_attn` (`split_attention_for_variant`; the choice is in the results JSON)."""

    hf_split_attention = "on"
