"""“Scaling Effects of Instruction Tuning”'s low-data study: head vs prompted vs instruction-tuned-then-prompted over
N ∈ {0, 8, ..., 128} training examples and seeds, with the IPR table.

| concept | module |
|---|---|
| the grid (`Grid`, `Cell`; no N = 0 for head fine-tuning) | `grid` |
| results CSV, mean ± std plots, IPR table | `results` |
| the resumable run over pluggable cell runners | `runner` |
| the real cell runners: one fine-tune per cell through the fine-tuning entry | `cells` |

The command is `python -m megatron_biglm.cli.lowdata` (top floor: it hands the fine-tuning entry
to the cell runners).
"""
from .grid import PARADIGMS, Cell, Grid
from .runner import load_runner, run_sweep

__all__ = ["PARADIGMS", "Cell", "Grid", "load_runner", "run_sweep"]
