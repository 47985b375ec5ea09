"""ObjectiveConfig: every knob of the BiGLM pretraining objective (paper §2.1, Tables 1 and 8).

Defaults are the public reference's: α = 0.2, adaptive β_X = 0.3 − 0.2·β_Y, β_Y ~ U(0, 1),
suffix masked in spans of up to 3 tokens, every masked position replaced by ``<mask>``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from megatron_biglm.common.config_fields import ConfigError, build_dataclass

from . import split_rule
from .split_rule import VARIANTS

PREFIX_MODES = ("adaptive", "uniform")
SUFFIX_UNITS = ("token", "span")
SPAN_LENGTH_LAWS = ("uniform", "harmonic")
REPLACEMENTS = ("mask", "bert")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The objective. Build from YAML/JSON with :meth:`from_dict`.

    variant:
        ``biglm``: split + prefix/suffix masking + attention restriction (the paper).
        ``no_attn``: split + masking, full attention ("w/o attn", Table 1).
        ``mlm``: no split, ``mlm_ratio`` of tokens masked, full attention ("w/o both").
    alpha: the split point is uniform over the integers in [ceil(α·L), floor((1−α)·L)].
    prefix_mode: ``adaptive`` β_X = lambda1 − lambda2·β_Y (paper), or ``uniform`` β_X ~
        U(beta_x_range) independent of β_Y (Table 1's BiGLM row uses U(0.1, 0.3)).
    beta_y_range: β_Y ~ U(beta_y_range) (Table 8 ablates (0.1,0.9), (0.2,0.8), (0.3,0.7)).
    suffix_unit: ``token`` masks single tokens; ``span`` masks whole spans of 1..max_ngram
        tokens (the reference's "span uniform masking"), lengths drawn by ``span_length_law``
        (``uniform`` over 1..max_ngram, or ``harmonic`` ∝ 1/n as Megatron's BERT n-grams).
    replacement: ``mask`` puts ``<mask>`` at every masked position (the reference);
        ``bert`` uses ``bert_probs`` = (mask, random token, unchanged), 80/10/10 by default.
    """

    variant: str = "biglm"
    alpha: float = 0.2
    prefix_mode: str = "adaptive"
    lambda1: float = 0.3
    lambda2: float = 0.2
    beta_x_range: tuple[float, float] = (0.1, 0.3)
    beta_y_range: tuple[float, float] = (0.0, 1.0)
    suffix_unit: str = "span"
    max_ngram: int = 3
    span_length_law: str = "uniform"
    mlm_ratio: float = 0.15
    replacement: str = "mask"
    bert_probs: tuple[float, float, float] = field(default=(0.8, 0.1, 0.1))

    def __post_init__(self):
        # Tuples may arrive as lists from YAML/JSON; normalise so the config stays hashable.
        for name in ("beta_x_range", "beta_y_range", "bert_probs"):
            object.__setattr__(self, name, tuple(float(x) for x in getattr(self, name)))
        self._validate()

    def _validate(self):
        def choice(name, allowed):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"ObjectiveConfig.{name}={getattr(self, name)!r}; expected one of {allowed}")

        choice("variant", VARIANTS)
        choice("prefix_mode", PREFIX_MODES)
        choice("suffix_unit", SUFFIX_UNITS)
        choice("span_length_law", SPAN_LENGTH_LAWS)
        choice("replacement", REPLACEMENTS)
        if not 0.0 < self.alpha < 0.5:
            raise ConfigError(
                f"alpha={self.alpha} must be in (0, 0.5): the paper's split lies strictly inside the "
                "sequence (alpha 0 would allow an empty prefix or suffix) and [αL, (1−α)L] must not "
                "be empty; the paper uses 0.2")
        for name in ("beta_x_range", "beta_y_range"):
            lo, hi = getattr(self, name)
            if len(getattr(self, name)) != 2 or not 0.0 <= lo <= hi <= 1.0:
                raise ConfigError(f"{name}={getattr(self, name)} must be (low, high) with 0 <= low <= high <= 1")
        if self.prefix_mode == "adaptive":
            lo, hi = self.beta_y_range
            for beta_y in (lo, hi):
                beta_x = self.lambda1 - self.lambda2 * beta_y
                if not 0.0 <= beta_x <= 1.0:
                    raise ConfigError(
                        f"adaptive β_X = {self.lambda1} − {self.lambda2}·β_Y = {beta_x:.3f} at β_Y={beta_y} "
                        "leaves [0, 1]; choose lambda1/lambda2 so β_X stays a ratio over beta_y_range"
                    )
        if self.max_ngram < 1:
            raise ConfigError(f"max_ngram={self.max_ngram} must be >= 1")
        if not 0.0 < self.mlm_ratio <= 1.0:
            raise ConfigError(f"mlm_ratio={self.mlm_ratio} must be in (0, 1]")
        if len(self.bert_probs) != 3 or min(self.bert_probs) < 0 or abs(sum(self.bert_probs) - 1) > 1e-6:
            raise ConfigError(f"bert_probs={self.bert_probs} must be 3 non-negative numbers summing to 1")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None, section: str = "objective") -> "ObjectiveConfig":
        """Build from a plain mapping (common.config_fields): values coerced to the field
        types; unknown keys raise ConfigError (a typo must not silently use a default)."""
        return build_dataclass(cls, data, section, headline="unknown ObjectiveConfig keys {keys}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @property
    def restricts_attention(self) -> bool:
        """Whether this variant restricts attention (see ``split_rule.restricts_attention``)."""
        return split_rule.restricts_attention(self.variant)
