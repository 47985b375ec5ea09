"""Request bodies of the OpenAI-shaped endpoints, checked strictly before any model work.

Fields follow OpenAI's completions API; BiGLM's decoding and scoring settings are extra body
fields (the `openai` client's `extra_body`):

| field | meaning |
|---|---|
| `steps` | T, Mask-Predict iterations per block (default 10) |
| `block_size` | slots per block (default: one block of `max_tokens`); a stream sends one event per block |
| `blocks` | how a finished block joins the prefix: `refresh` (default, re-encoded with the prompt) or `cached` (block-causal: appended to the request's cached keys/values; a megatron checkpoint only) |
| `remasking` | `low_confidence` (default), `random` or `none` (LLaDA) |
| `length_beam` | L candidate lengths `max_tokens, max_tokens - 1, ...`; the best mean confidence wins, `max_tokens` is then the upper bound |
| `scoring` | the rule of `echo` + `logprobs` scoring: `pll` (default), `beam`, `oneshot`, `l2r`, `elbo` |
| `beam` | the width of the `beam` rule (default 1) |
| `context_tokens` | where the context ends in the prompt's tokens: the rule scores what follows it (default 0: the whole prompt after BOS) |

`/v1/embeddings` takes OpenAI's fields (`dimensions`, when given, must be the model's),
`input_type`: the prompt put before each text (`query`, `passage`; none by default), and
`truncate`: an input longer than the model embeds is cut to its length (default false: refused
with a 400 naming both lengths).

`logprobs` of a generated token is the log-probability the model gave it when it was last
predicted (what re-masking ranked), and its `top_logprobs` entry holds that token only (a
sampled token need not be the most likely one); with `echo` the prompt's entries come from the
scoring rule, with the best token of each query in `top_logprobs`.

`temperature` defaults to 0 (greedy, like `biglm-generate`), `seed` to 0. An unknown field, a
wrong type or a value out of range is refused with HTTP 400 naming the field
(`BadRequest.from_validation`).
"""
from __future__ import annotations

import json
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from megatron_biglm.evaluation.scoring import RULES

RemaskName = Literal["low_confidence", "random", "none"]
RuleName = Literal[tuple(RULES)]  # type: ignore[valid-type]


class BadRequest(ValueError):
    """HTTP 400 (or `status`): `message` says what is wrong, `param` names the field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    @classmethod
    def from_validation(cls, exc: ValidationError) -> "BadRequest":
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        param = str(first["loc"][0]) if first["loc"] else None
        if first["type"] == "extra_forbidden":
            return cls(f"unknown field {param!r}; see the documented fields of this endpoint", param)
        if first["type"] == "missing":
            return cls(f"field {param!r} is required", param)
        return cls(f"field {param!r}: {first['msg']} at {path!r} (got {first.get('input')!r})", param)


class StrictBody(BaseModel):
    """A request body: unknown fields and loosely typed values are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class DecodingFields(StrictBody):
    """The sampling and Mask-Predict fields that completions and chat completions share."""

    model: str
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, gt=0.0, le=1.0)
    seed: int = Field(0, ge=0)
    stop: Optional[Union[str, list[str]]] = None
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    user: Optional[str] = None
    steps: int = Field(10, ge=1)
    block_size: Optional[int] = Field(None, ge=1)
    blocks: Literal["refresh", "cached"] = "refresh"
    remasking: RemaskName = "low_confidence"
    length_beam: int = Field(1, ge=1, le=16)


class CompletionRequest(DecodingFields):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int = Field(16, ge=0)
    logprobs: Optional[int] = Field(None, ge=0, le=5)
    echo: bool = False
    scoring: RuleName = "pll"
    beam: int = Field(1, ge=1)
    context_tokens: int = Field(0, ge=0)


class EmbeddingRequest(StrictBody):
    model: str
    input: Union[str, list[str]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(None, ge=1)
    user: Optional[str] = None
    input_type: Optional[str] = None
    truncate: bool = False


class TokenizeRequest(StrictBody):
    prompt: str
    add_special_tokens: bool = False
    model: Optional[str] = None


class DetokenizeRequest(StrictBody):
    tokens: list[int]
    model: Optional[str] = None


def parse(model: type[BaseModel], body: bytes):
    """The validated request, or BadRequest naming the field (bad JSON names no field)."""
    try:
        data = json.loads(body or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest.from_validation(exc) from None
