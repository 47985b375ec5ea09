"""`python -m megatron_biglm.finetune.lowdata`: runs the top-floor entry point
`megatron_biglm/lowdata_main.py` (which hands the fine-tuning entry to the sweep's cell
runners; finetune/ itself stays below the entry points, see ARCHITECTURE.md)."""
import runpy

runpy.run_module("megatron_biglm.lowdata_main", run_name="__main__", alter_sys=True)
