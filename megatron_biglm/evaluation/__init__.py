"""Zero-shot evaluation of masked LMs with lm-eval.

`import megatron_biglm.evaluation` registers two lm-eval models, lazily (nothing heavy is
imported until lm-eval asks for the class):
  `biglm`   our model: an exported HF directory, or a megatron checkpoint (any TP/PP) run
            in-process at TP=1/PP=1
  `hf-mlm`  any HF `AutoModelForMaskedLM`
lm-eval has no plugin entry point for models, so use them through `simple_evaluate` after
this import, through `python -m megatron_biglm.cli.eval_zero_shot`, or through lm-eval's own CLI as
`python -m megatron_biglm.cli.eval_zero_shot run --model hf-mlm ...`.

Layout: `scoring/` (the rules, model-agnostic), `runner.py` (the rules' rounds on the
inference engine), `lm.py`/`models.py` (lm-eval models), `tasks.py` (paper suite, offline task
YAMLs, table), `training_hook.py`. The model side lives in `megatron_biglm.inference`: the
adapter protocol, the HF and megatron adapters, the batching engine with the prefix cache, and
checkpoint loading.
"""
from __future__ import annotations

import logging

MODEL_CLASSES = {
    "biglm": "megatron_biglm.evaluation.models:BiGLMEvalLM",
    "hf-mlm": "megatron_biglm.evaluation.models:HFMaskedLMEvalLM",
}


def register_lm_eval_models() -> bool:
    """Register our models with lm-eval; False (and a debug log) when lm-eval is absent."""
    try:
        # built-ins first: lm-eval only loads them into an empty registry
        import lm_eval.models  # noqa: F401  lazy: optional (eval extra)
        from lm_eval.api.registry import model_registry  # lazy: optional (eval extra)
    except ImportError:  # lm-eval is the optional "eval" extra
        logging.getLogger(__name__).debug("lm-eval not installed: models not registered")
        return False
    for name, target in MODEL_CLASSES.items():
        if name not in model_registry:
            model_registry.register(name, target=target)
    return True


register_lm_eval_models()
