"""lm-eval's own command line with our models registered (lm-eval has no model plugins):

    python -m megatron_biglm.cli.lm_eval run --model biglm --model_args path=DIR --tasks arc_easy
    python -m megatron_biglm.cli.lm_eval run --model hf-mlm --model_args pretrained=DIR --tasks piqa

Every lm-eval option works as documented by lm-eval; `eval_zero_shot` is our own front end
(the paper's suite, local task data, the paper-style table).
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    import megatron_biglm.evaluation  # noqa: F401 - registers biglm / hf-mlm
    from lm_eval.__main__ import cli_evaluate

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
