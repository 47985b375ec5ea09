"""Task metrics for fine-tuning. Every score is a fraction in [0, 1] (x100 for the paper's
tables), so best-checkpoint selection compares like with like.

| metric | module | what |
|---|---|---|
| accuracy, macro-F1 (CB) | `classification` | plain counts |
| SQuAD EM / F1 | `squad` | official v1.1 normalisation, max over gold answers |
| ROUGE-1/2/L, BLEU-n, METEOR | `generation` | `rouge-score` (Porter stemming), `sacrebleu` corpus BLEU, nltk METEOR with offline WordNet (`wordnet`: Debian's WordNet laid out for nltk) |
| a task's metrics as one flat dict | `task_scores` | keys a `Task.select` can name |
| IPR (“Scaling Effects of Instruction Tuning”) | `ipr` | ∫f/∫g − 1, trapezoid over the Ns both curves have |
| Genset BLEU-2 / Distinct-2 | `generation` | sacrebleu BLEU (order 2), corpus-level distinct bigrams |
"""
from .classification import accuracy, macro_f1
from .generation import bleu, meteor, rouge
from .squad import exact_match_score, f1_score, normalize_answer, squad_scores
from .task_scores import task_scores

METRICS = {"accuracy": accuracy, "macro_f1": macro_f1, "squad": squad_scores,
           "rouge": rouge, "bleu": bleu, "meteor": meteor}

__all__ = ["METRICS", "accuracy", "bleu", "exact_match_score", "f1_score", "macro_f1",
           "meteor", "normalize_answer", "rouge", "squad_scores", "task_scores"]
