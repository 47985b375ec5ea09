"""lm-eval's own CLI with our models registered: `python -m megatron_biglm.evaluation run
--model hf-mlm --model_args pretrained=DIR --tasks arc_easy` (lm-eval has no model plugins)."""
from __future__ import annotations

import megatron_biglm.evaluation  # noqa: F401 - registers biglm / hf-mlm

if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
