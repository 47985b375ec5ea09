"""Genset (paper Table 5, "B-2 / D-2"): Mask-Predict generation on source/reference pairs,
scored with BLEU-2 and Distinct-2 (`metrics/generation.py`: sacrebleu corpus BLEU of order 2,
corpus-level distinct bigrams).

The paper's Genset is 100 sampled instances each of WIKI-AUTO (simplification), QQP
(paraphrase) and PersonaChat (dialogue), scored as one set. Input is one JSON object per line:
`{"source": ..., "reference": ...}` (`reference` may be a list of references; an optional
`dataset` name adds per-data-set scores to the JSON). The prompt is the source, or the source
in a chat template (`template`: the instruction-tuning layout `user + source + assistant`),
so an instruction-tuned model sees the layout it was tuned on.
"""
from __future__ import annotations

from pathlib import Path

from megatron_biglm.data.rows import json_lines
from megatron_biglm.finetune.instruct.chat_template import prompt_of
from megatron_biglm.finetune.metrics.generation import genset_scores


class BadGensetData(ValueError):
    """A Genset file that cannot be used; the message names file:line and the fix."""


_HINT = 'write one {"source": "...", "reference": "..." or ["...", ...]} object per line'


def read_pairs(path) -> list[dict]:
    """Rows {"source", "references" (list), "dataset" (or None)}, in file order."""
    path = Path(path)
    if not path.is_file():
        raise BadGensetData(f"--genset {path} does not exist; {_HINT}")
    rows = []
    for n, raw in json_lines(path, BadGensetData, _HINT):
        if not isinstance(raw, dict):
            raise BadGensetData(f"{path}:{n} is not a JSON object; {_HINT}")
        source, ref = raw.get("source"), raw.get("reference")
        refs = [ref] if isinstance(ref, str) else ref
        if not isinstance(source, str) or not source.strip():
            raise BadGensetData(f"{path}:{n} has no non-empty string \"source\"; {_HINT}")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise BadGensetData(f"{path}:{n} has no non-empty \"reference\" (a string or a list of "
                                f"strings); {_HINT}")
        rows.append({"source": source, "references": refs, "dataset": raw.get("dataset")})
    if not rows:
        raise BadGensetData(f"--genset {path} holds no pairs; {_HINT}")
    return rows


def evaluate_genset(generator, path, config, *, template: str | None = None,
                    batch_size: int = 8) -> dict:
    """Generate for every pair with `generator` (a MaskPredictGenerator) and `config` (a
    GenerationConfig); {"bleu2", "distinct2"} (fractions) overall and per data set, and the
    generations."""
    rows = read_pairs(path)
    outputs = generator.generate([prompt_of(r["source"], template) for r in rows], config,
                                 batch_size=batch_size)
    predictions = [o.text.strip() for o in outputs]
    result = {"file": str(path), "pairs": len(rows), "template": template,
              **genset_scores(predictions, [r["references"] for r in rows])}
    names = sorted({r["dataset"] for r in rows if r["dataset"] is not None}, key=str)
    if names:
        result["per_dataset"] = {
            str(name): genset_scores([p for p, r in zip(predictions, rows) if r["dataset"] == name],
                                     [r["references"] for r in rows if r["dataset"] == name])
            for name in names}
    result["generations"] = [{"source": r["source"], "prediction": p, "references": r["references"]}
                             for r, p in zip(rows, predictions)]
    return result
