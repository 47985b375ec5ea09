"""The paper's experiment harnesses, apart from the library of task kinds they run.

  lowdata/          the low-data sweep (Figure/IPR): cells of task x paradigm x N x seed, each a
                    fine-tune, with resumable results and the IPR table
  multitask/        the Table 5 row after instruction tuning: SuperGLUE zero-shot prompts, Genset
  bigbench_data.py  BIG-bench's XSum and natural-instructions rows, from its PyPI sdist

They stand above finetune/ (they run its kinds and metrics) and below cli/ (whose commands
`lowdata`, `eval_multitask` and `fetch_data` run them); a fine-tune itself never imports them.
"""
