"""Every command of megatron-biglm, one module each (top floor: may import any package).

Each module has a `main(argv=None) -> int`; run it as `python -m megatron_biglm.cli.NAME` or
through its console script `biglm-NAME` with underscores as hyphens (setup.py; e.g. `cli.eval_zero_shot`
is `biglm-eval-zero-shot`), installed with the package; `biglm-eval` and `biglm-export` are
aliases of the two commands marked below. The two drivers that wire the floors together are here too, because they are what the commands run:
`train.train` (the one loop with the run's callbacks) and `finetune.finetune` (a recipe on it).

  quickstart         the README's main job end to end           biglm-quickstart
  train              pretraining (also under torchrun)            biglm-train
  finetune           every fine-tuning task, from its config      biglm-finetune
  instruct_tune      instruction tuning (epochs -> steps)         biglm-instruct-tune
  instruct_data      FLAN/xP3 rows -> tokenized instruction data  biglm-instruct-data
  lowdata            the low-data sweep (IPR)                     biglm-lowdata
  generate           Mask-Predict generation                      biglm-generate
  eval_zero_shot     lm-eval suites with a masked LM              biglm-eval-zero-shot (alias biglm-eval)
  eval_multitask     the Table 5 row (MMLU, SuperGLUE, Genset)    biglm-eval-multitask
  eval_retrieval     BEIR-format nDCG/Recall/MRR                  biglm-eval-retrieval
  convert            to-hf, from-hf, to-st                        biglm-convert (alias biglm-export)
  preprocess         corpora -> Megatron .bin/.idx                biglm-preprocess
  preprocess_shards  one SLURM array task of a sharded preprocess biglm-preprocess-shards
  merge_datasets     concatenate datasets or merge shards         biglm-merge-datasets
  inspect_dataset    a dataset's statistics and documents         biglm-inspect-dataset
  train_tokenizer    byte-level BPE on a (sampled) corpus         biglm-train-tokenizer
  count_params       a preset's parameter breakdown               biglm-count-params
  kernels            the kernels a config gets on this machine    biglm-kernels
  plot_curves        loss curves of runs (PNG)                    biglm-plot-curves
  lm_eval            lm-eval's own CLI, our models registered   biglm-lm-eval
  fetch_data         corpus, BIG-bench and WordNet, offline-safe  biglm-fetch-data
  serve              an OpenAI-compatible HTTP server             biglm-serve
"""


def command_logging() -> None:
    """The logging of a data command: warnings from everything, progress from ours, and not
    megatron's note that optional fused kernels are missing (they are for GPU runs)."""
    import logging
    import warnings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("megatron_biglm").setLevel(logging.INFO)
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
