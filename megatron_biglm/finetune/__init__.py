"""Fine-tuning (floor 5): tasks and their building blocks (`tasks/`, `metrics/`, `data_files`,
`row_report`), the recipes that train them through the one loop (`recipes/`, one per task
kind, picked by `recipes.recipe_for`), the one epoch rule (`epochs`) and `validation`
(task-metric validation, the `best` pointer, results.json). The driver that plans and runs a
fine-tune is `megatron_biglm.run`; the command line is `python -m megatron_biglm.cli.finetune`."""
