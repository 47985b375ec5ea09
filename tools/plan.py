"""Plan a run's layout from a checkout, as Megatron-LM users run its tools/ scripts:

    python tools/plan.py --config examples/configs/biglm_3p5b.yaml --nodes 32 --gpus-per-node 8 --gpu a100-80gb

Runs `biglm-plan` (megatron_biglm/cli/plan.py, where the code lives) with the same arguments.
"""
import os, sys  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's package first
from megatron_biglm.cli.plan import main  # noqa: E402
if __name__ == "__main__":
    sys.exit(main())
