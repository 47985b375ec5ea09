"""Heads: what turns the encoder's final hidden states into a task's output.

The trunk (`BiGLMModel`: embedding, layers, final norm) is shared by every task; a head reads
its hidden states `[s, b, h]` (full sequence, gathered under sequence parallelism) and returns
the task's output: the masked-LM head, pooling, and the optional CMLM `length` head (built by
BiGLMModel when `model.length_head_max > 0`). A task head with weights of its own (sequence
classification, span start/end) is a `TaskHead` entry (`task_heads.py`): export, import, the
head model and the loaders read its facts there.

The masked-LM head owns no weights: it projects through megatron's `output_layer` with the
tied word embedding, so its parameter names (`output_layer.weight` on a PP>1 last stage) stay
where megatron's checkpoints have them. It is therefore a plain callable, not an `nn.Module`:
registering it as a submodule would add nothing to the state dict but a second path to it.

A head is called as ``head(model, hidden, **inputs)``; `inputs` are the keyword arguments the
model's forward received for it (labels, loss_mask, valid_lengths, ...).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, NamedTuple, Optional, Protocol

import torch

from .loss import mask_padded_vocab, sparse_prediction_loss
from .pooling import POOLING_MODES, pool_hidden
from .task_heads import TaskHead


class Head(Protocol):
    """Final hidden states [s, b, h] of `model` -> the head's output."""

    def __call__(self, model: torch.nn.Module, hidden: torch.Tensor, **inputs) -> torch.Tensor:
        ...


@dataclass(frozen=True)
class HeadSpec:
    """One kind of head. `build(**options)` returns the head; `owns_weights` says whether it
    brings parameters of its own (then it needs rows in the HF weight-mapping table)."""

    name: str
    build: Callable[..., Head]
    owns_weights: bool
    doc: str


class MaskedLMHead:
    """Vocabulary projection through the tied output layer.

    Without labels: logits [b, s, vocab/tp] (all positions). With labels and loss_mask [b, s]:
    the per-token loss [b, s] fp32, computed by sparse prediction at masked positions only
    (see `loss.sparse_prediction_loss`).
    """

    def __call__(self, model, hidden: torch.Tensor, *, labels: Optional[torch.Tensor] = None,
                 loss_mask: Optional[torch.Tensor] = None, predicted_rows: Optional[torch.Tensor] = None,
                 runtime_gather_output: Optional[bool] = None) -> torch.Tensor:
        output_weight = model.output_projection_weight()  # None: untied, output_layer owns it
        if labels is None:
            logits, _ = model.output_layer(
                hidden, weight=output_weight, runtime_gather_output=runtime_gather_output
            )
            # Padding rows (ids >= the tokenizer's vocab_size) are never predicted.
            mc = model.model_config
            logits = mask_padded_vocab(logits, mc.vocab_size, mc.padded_vocab_size)
            return logits.transpose(0, 1).contiguous()
        if loss_mask is None:
            raise ValueError(
                "labels need a loss_mask [b, s] (1 at the positions to predict): BiGLM's loss "
                "is computed at masked positions only"
            )
        return sparse_prediction_loss(hidden, labels, loss_mask, model.output_layer, output_weight,
                                      vocab_size=model.model_config.vocab_size, rows=predicted_rows)


class PoolingHead:
    """One vector per sample [b, h] from the hidden states: `mode` is mean, first or last
    (over each sample's valid tokens; see `pooling.pool_hidden`). No weights: the embedding
    output of retrieval, and the input of classification heads."""

    def __init__(self, mode: str = "mean"):
        if mode not in POOLING_MODES:
            raise ValueError(f"pooling mode must be one of {POOLING_MODES}, got {mode!r}")
        self.mode = mode

    def __call__(self, model, hidden: torch.Tensor, *,
                 valid_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        return pool_hidden(hidden.transpose(0, 1), valid_lengths, self.mode)


class ClassificationHead(torch.nn.Module):
    """Sequence classification: pool (mean over valid tokens, or the first token) -> dense
    [h, h] -> GELU -> classifier [labels, h], both with bias: exactly the head of HF's
    `EuroBertForSequenceClassification` (`classifier_pooling` "mean" / "bos"), so a trained
    head exports as that class with nothing approximated. Output: logits [b, labels] (one
    column for regression), fp32 math in the parameters' dtype. Replicated under TP (a few
    h^2 weights)."""

    def __init__(self, hidden_size: int, num_labels: int, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "first"):
            raise ValueError(f"classification pooling must be 'mean' or 'first', got {pooling!r}")
        if int(num_labels) < 1:
            raise ValueError(f"a classification head needs >= 1 output (1: regression), got {num_labels}")
        self.pooling = pooling
        self.dense = torch.nn.Linear(hidden_size, hidden_size)
        self.classifier = torch.nn.Linear(hidden_size, int(num_labels))

    def forward(self, model, hidden: torch.Tensor, *,  # noqa: ARG002 - the Head signature
                valid_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        pooled = pool_hidden(hidden.transpose(0, 1), valid_lengths, self.pooling)
        return self.classifier(torch.nn.functional.gelu(self.dense(pooled)))


class SpanHead(torch.nn.Module):
    """Extractive QA: one linear map [2, h] (with bias) per position -> start and end logits
    [b, s] each, returned stacked as [b, s, 2] (start = [..., 0]). Positions past
    `valid_lengths` get -inf, so no loss or prediction can pick padding. HF's EuroBERT has
    no QA class; this is `EuroBertForTokenClassification` with 2 labels (start, end)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.classifier = torch.nn.Linear(hidden_size, 2)

    def forward(self, model, hidden: torch.Tensor, *,  # noqa: ARG002 - the Head signature
                valid_lengths: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = self.classifier(hidden.transpose(0, 1)).float()  # [b, s, 2]
        if valid_lengths is not None:
            s = logits.shape[1]
            pad = torch.arange(s, device=logits.device)[None, :] >= valid_lengths.to(logits.device)[:, None]
            logits = logits.masked_fill(pad[..., None], float("-inf"))
        return logits


class LengthCandidates(NamedTuple):
    """A length predictor's answer per prefix: the top-k target lengths `[g, k]`, best first,
    and the predictor's log-probability of each `[g, k]` (fp32)."""

    lengths: torch.Tensor
    logprobs: torch.Tensor


class LengthHead(torch.nn.Module):
    """CMLM's length prediction (Ghazvininejad et al., 2019): the target length as a class
    0..max_length, from the mean of the prefix's final hidden states over [0, split).

    Why the prefix mean rather than CMLM's extra LENGTH token: BiGLM's prefix rows never see the
    target, so their pooled state is the same in training (full sequence, split attention) and
    at decoding time (the prefix alone), and no input token is added. Weights: `weight`
    [max_length + 1, h] and `bias` (state-dict names `length_head.weight` / `.bias`),
    replicated under tensor parallelism. Returns fp32 logits [b, max_length + 1]."""

    def __init__(self, hidden_size: int, max_length: int, init_std: float = 0.02):
        super().__init__()
        if max_length < 1:
            raise ValueError(f"a length head needs max_length >= 1, got {max_length}")
        self.max_length = int(max_length)
        self.weight = torch.nn.Parameter(torch.empty(max_length + 1, hidden_size))
        self.bias = torch.nn.Parameter(torch.zeros(max_length + 1))
        torch.nn.init.normal_(self.weight, std=init_std)

    def forward(self, model, hidden: torch.Tensor, *, prefix_lengths: torch.Tensor) -> torch.Tensor:
        """hidden [s, b, h] (the model's layout), prefix_lengths [b] in 1..s -> logits [b, max+1]."""
        pooled = pool_hidden(hidden.transpose(0, 1), prefix_lengths, "mean")
        return torch.nn.functional.linear(pooled, self.weight.to(pooled.dtype),
                                          self.bias.to(pooled.dtype)).float()

    def predict(self, logits: torch.Tensor, k: int) -> LengthCandidates:
        """The top-k lengths [b, k], best first, never below 1 (a target has a token), with
        their log-probabilities among the lengths >= 1."""
        logits = logits.float().clone()
        logits[:, 0] = float("-inf")
        top = logits.log_softmax(dim=-1).topk(min(k, self.max_length), dim=-1)
        return LengthCandidates(top.indices, top.values)


HEADS: Dict[str, HeadSpec | TaskHead] = {}


def register_head(spec: HeadSpec | TaskHead) -> HeadSpec | TaskHead:
    """Add a kind of head; a name is registered once (a second spec under it is a mistake)."""
    if spec.name in HEADS:
        raise ValueError(f"a head named {spec.name!r} is already registered")
    HEADS[spec.name] = spec
    return spec


def build_head(name: str, **options) -> Head:
    """The head registered as `name`, built with `options` (e.g. mode="last" for pooling)."""
    if name not in HEADS:
        raise ValueError(f"unknown head {name!r}; registered: {sorted(HEADS)}")
    return HEADS[name].build(**options)


def task_head(name: str) -> TaskHead:
    """The entry of the task head `name`; an unknown name is refused, naming the task heads."""
    entry = HEADS.get(name)
    if not isinstance(entry, TaskHead):
        raise ValueError(f"{name!r} is not a registered task head; task heads: "
                         f"{sorted(n for n, e in HEADS.items() if isinstance(e, TaskHead))} (a new one: "
                         "model.heads.register_head(TaskHead(...)))")
    return entry


# the built-in heads without an export of their own: (name, build, owns_weights, doc)
for _name, _build, _owns, _doc in (
        ("masked_lm", MaskedLMHead, False,
         "logits, or the sparse-prediction per-token loss, through the tied output layer"),
        ("pooling", PoolingHead, False,
         "one vector per sample: mean / first / last over the valid tokens"),
        ("length", LengthHead, True,
         "CMLM length classes 0..max_length from the mean-pooled prefix [0, split)")):
    register_head(HeadSpec(name=_name, build=_build, owns_weights=_owns, doc=_doc))
del _name, _build, _owns, _doc

#: HF's names of the pooling modes EuroBertForSequenceClassification reads (`classifier_pooling`)
HF_POOLING = {"mean": "mean", "first": "bos"}

register_head(TaskHead(
    name="classification", module=ClassificationHead, hf_class="EuroBertForSequenceClassification",
    hf_names={"dense": "dense", "classifier": "classifier"},
    options_of=lambda r: {"num_labels": r.num_labels, "pooling": r.pooling},
    hf_config=lambda r: {"classifier_pooling": HF_POOLING[r.pooling], "problem_type": r.problem_type},
    doc="sequence labels: pooled -> dense -> GELU -> classifier (EuroBertForSequenceClassification)"))
register_head(TaskHead(
    name="span", module=SpanHead, hf_class="EuroBertForTokenClassification",
    hf_names={"classifier": "classifier"}, options_of=lambda r: {}, hf_config=lambda r: {},
    doc="extractive QA: start/end logits per position (EuroBertForTokenClassification, 2 labels)"))
