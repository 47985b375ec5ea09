"""Every command of megatron-biglm, one module each (top floor: may import any package).

Each module has a `main(argv=None) -> int`; run it as `python -m megatron_biglm.cli.NAME` or
through its console script `biglm-NAME` with underscores as hyphens (setup.py; e.g. `cli.eval_zero_shot`
is `biglm-eval-zero-shot`), installed with the package; `biglm-eval` and `biglm-export` are
aliases of the two commands marked below. A command that runs training (train, finetune, instruct_tune,
lowdata, quickstart) parses its arguments, loads a config once and calls a driver of `megatron_biglm/run/`.

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
  plan               does a layout fit, what does a run cost      biglm-plan
  plot_curves        loss curves of runs (PNG)                    biglm-plot-curves
  lm_eval            lm-eval's own CLI, our models registered   biglm-lm-eval
  fetch_data         corpus, BIG-bench and WordNet, offline-safe  biglm-fetch-data
  serve              an OpenAI-compatible HTTP server             biglm-serve
"""
import errno


#: write failures a command reports as one line (full, over quota, read-only, no permission)
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)


def refuse(exc: BaseException, code: int) -> int:
    """How a command refuses: one line `error: ...` on stderr (the exception's message names the
    file, line or key and what to do), and the exit code it returns."""
    import sys

    print(f"error: {exc}", file=sys.stderr, flush=True)
    return code


def print_result(line: str) -> None:
    """A run's final result line, printed once: by the logging rank (global rank 0, the rank
    whose `DistInfo.is_logger` is true); under torchrun every other rank holds the same result
    and prints nothing."""
    from megatron_biglm.common.process_groups import global_rank

    if global_rank() == 0:
        print(line, flush=True)


def command_logging() -> None:
    """The logging of a data command: warnings from everything, progress from ours, and not
    megatron's note that optional fused kernels are missing (they are for GPU runs)."""
    import logging
    import warnings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("megatron_biglm").setLevel(logging.INFO)
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")


def run_command(argv, *, description: str, config_help: str, overrides_help: str, run, summary) -> int:
    """A run's command line: `--config FILE` and `section.key=value` overrides go to
    `run(config, overrides)`, which loads the config once and calls the driver; `summary(result)`
    is printed as one JSON line by the logging rank (exit 0). A config, checkpoint or
    non-finite-loss error is printed as `error: ...` (exit 2, 3 for non-finite)."""
    import argparse
    import json
    import logging
    import sys
    import warnings

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help=config_help)
    parser.add_argument("overrides", nargs="*", help=overrides_help)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.common.disk import DiskError, describe_os_error
    from megatron_biglm.common.hub import HubUnavailable
    from megatron_biglm.config import ConfigError
    from megatron_biglm.training.nonfinite import TooManyNonFinite
    try:
        result = run(args.config, args.overrides)
    except (ConfigError, CheckpointError, HubUnavailable, TooManyNonFinite, DiskError) as exc:
        return refuse(exc, 3 if isinstance(exc, TooManyNonFinite) else 2)
    except OSError as exc:  # a write the run's own checks could not foresee: the path and the cause, one line
        if exc.errno not in _DISK_ERRNOS:
            raise
        return refuse(describe_os_error(exc, exc.filename or "?", "writing"), 2)
    print_result(json.dumps(summary(result)))
    return 0
