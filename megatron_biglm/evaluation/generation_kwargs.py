"""lm-eval generation kwargs -> `GenerationConfig` (for `generate_until`).

Why a mapping and not a pass-through: lm-eval tasks speak HF `generate`'s language
(`do_sample`, `temperature`, `max_gen_toks`, ...) and Mask-Predict has its own knobs. Every key
is either mapped below or must be a `GenerationConfig` field (`steps`, `block_size`,
`length_beam`, `remask`, `seed`, ...); anything else is an error naming the valid keys, never
silently ignored.

| lm-eval kwarg | GenerationConfig |
|---|---|
| `until` (str or list) | `until`: the text is cut before the first stop string |
| `max_gen_toks` (aliases `max_new_tokens`, `max_tokens`, `max_completion_tokens`; default 256) | `max_new_tokens`: N slots decoded, cut at the first EOS; capped at the model's room (`[BOS]` + 1 context token + N <= max_length), each cap counted |
| `do_sample: false` (or absent with temperature 0) | `temperature = 0` (greedy argmax); `top_k`/`top_p` do not apply to greedy decoding and are dropped, as HF `generate` does |
| `do_sample: true` | `temperature` as given, 1.0 when given as 0 or absent; `top_k`, `top_p` as given |
| `temperature`, `top_k`, `top_p` | the same fields (see above) |
| `length` | `length` (exactly N, no EOS cut; `max_gen_toks` is then not used) |
| any `GenerationConfig` field | itself; `overflow` defaults to `truncate_left` (contexts cut from the left and counted, lm-eval's convention) |

The normalisation of aliases and of `do_sample`/`temperature` is lm-eval's own
(`lm_eval.models.utils.normalize_gen_kwargs`), so a task means the same thing here as for HF models.
"""
from __future__ import annotations

from typing import Any, Mapping

from megatron_biglm.generation import GenerationConfig


def generation_config_from_kwargs(gen_kwargs: Mapping[str, Any], *, max_length: int,
                                  default_max_gen_toks: int = 256) -> tuple[GenerationConfig, bool]:
    """The config for one request's kwargs, and whether `max_gen_toks` was capped to fit."""
    from lm_eval.models.utils import normalize_gen_kwargs  # lazy: optional (eval extra)

    if not isinstance(gen_kwargs, Mapping):
        raise TypeError(f"generation kwargs must be a mapping, got {type(gen_kwargs).__name__}")
    values = dict(normalize_gen_kwargs(dict(gen_kwargs), default_max_gen_toks))
    do_sample = bool(values.pop("do_sample", False))
    max_gen_toks = int(values.pop("max_gen_toks"))
    values["until"] = tuple(values.get("until") or ())
    if do_sample:
        if not values.get("temperature"):
            values["temperature"] = 1.0
    else:
        values["temperature"] = 0.0
        values.pop("top_k", None)
        values.pop("top_p", None)
    capped = False
    if values.get("length") is None:
        room = max(1, int(max_length) - 2)
        capped = max_gen_toks > room
        values["max_new_tokens"] = min(max_gen_toks, room)
    values.setdefault("overflow", "truncate_left")
    return GenerationConfig.from_dict(values), capped
