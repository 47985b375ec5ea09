"""Fine-tuning (floor 5): the task kinds, one module each, that train through the one loop
(`kinds/`: verbalizer, head, span, seq2seq, contrastive, instruct, registered in
`kinds/__init__.py`), tasks declared as data (`tasks/`, which reads `kinds/`, never the reverse), the helpers
kinds share (`metrics/`, `retrieval/`, `instruct/`, `data_files`, `row_report`, `columns`,
`text_fit`, `squad_windows`, `squad_answers`), the one epoch rule
(`epochs`), the schedule it gives a run config (`schedule`) and `validation` (task-metric
validation, the `best` pointer, results.json). The driver that plans and runs a fine-tune is `megatron_biglm.run`; the command line is
`python -m megatron_biglm.cli.finetune`."""
