"""lm-eval's own command line with our models registered (lm-eval has no model plugins):

    python -m megatron_biglm.cli.lm_eval run --model biglm --model_args path=DIR --tasks arc_easy
    python -m megatron_biglm.cli.lm_eval run --model hf-mlm --model_args pretrained=DIR --tasks piqa

Every lm-eval option works as documented by lm-eval; `eval_zero_shot` is our own front end
(the paper's suite, local task data, the paper-style table). Without the hub, a task that
reads its data from it stops with one line naming the offline way (`eval_zero_shot --data-dir`).
"""
from __future__ import annotations

import sys

from megatron_biglm.cli import refuse


def main(argv=None) -> int:
    from lm_eval.__main__ import cli_evaluate

    import megatron_biglm.evaluation  # noqa: F401 - registers biglm / hf-mlm
    from megatron_biglm.common.hub import HubUnavailable, hub_access

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    try:
        with hub_access("the tasks' data", "local data: `python -m megatron_biglm.cli.eval_zero_shot --data-dir DIR` "
                        "(or --include_path with task YAMLs that read local files)"):
            cli_evaluate()
    except HubUnavailable as exc:
        return refuse(exc, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
