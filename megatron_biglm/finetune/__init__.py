"""Fine-tuning (floor 5): tasks and their building blocks (`tasks/`, `metrics/`, `data_files`,
`row_report`), the recipes that train them through the one loop (`recipes/`, one per task
kind, picked by `recipes.recipe_for`), the run plan (`plan`: epochs -> steps, the recipe, the
validation callback) and `validation` (task-metric validation, the `best` pointer,
results.json). The command line is `python -m megatron_biglm.cli.finetune` (top floor)."""
