"""`python -m megatron_biglm.finetune`: runs the top-floor entry point
`megatron_biglm/finetune_main.py` (which wires finetune/ into train.py; finetune/ itself
stays below train.py, see ARCHITECTURE.md)."""
import runpy

runpy.run_module("megatron_biglm.finetune_main", run_name="__main__", alter_sys=True)
