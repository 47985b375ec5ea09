"""Multitask evaluation after instruction tuning (paper Table 5; `python -m megatron_biglm.cli.eval_multitask`).

| section | module | what |
|---|---|---|
| MMLU ZS / FS | `evaluation/mmlu.py` | lm-eval's `mmlu` tasks through our masked-LM backend |
| SuperGLUE AVG | `superglue` | zero-shot prompted verbalizer tasks (BoolQ, CB, COPA, RTE, WiC) |
| Genset B-2 / D-2 | `genset` | Mask-Predict generation, sacrebleu BLEU-2, corpus Distinct-2 |
| the row | `table` | the paper's units, a note for every skipped section |
| command line | `cli` | one model loaded once for all sections |
"""
