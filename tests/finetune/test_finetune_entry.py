"""The fine-tuning entry point: a tiny model learns a synthetic prompted-classification task
through `python -m megatron_biglm.cli.finetune`'s main() (the verbalizer recipe, the one training
loop), validation per epoch with the task metric, the `best` pointer beside `latest`, and
results.json; a run stopped mid-epoch and resumed writes the same results.json.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from export_fixtures import BLOCK_OUR_PACKAGES
from finetune_entry_fixtures import finetune_overrides, write_task

REPO = Path(__file__).resolve().parents[2]
# Accuracy bar (chance 0.5: balanced labels; step-0 validation measured 0.5): over training.seed
# 1..5 best validation accuracy 1.00, test 0.98-1.00 (first validation, step 12: 0.89-0.98);
# bar = chance + 1/3 of the smallest gain over chance (0.5 + 0.48 / 3 = 0.66).
ACC_BAR = 0.65


def _run(config_dir: Path, task: dict, run_dir: Path, **extra) -> dict:
    from megatron_biglm.cli.finetune import main

    config = config_dir / "ft.yaml"
    config.write_text("finetune: {task: rte}\n")
    assert main(["--config", str(config), *finetune_overrides(task, run_dir, **extra)]) == 0
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return write_task(tmp_path_factory.mktemp("ft_task"))


@pytest.fixture(scope="module")
def straight(task, tmp_path_factory) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("ft_straight") / "run"
    return run, _run(run.parent, task, run, **{"checkpoint.keep_last": 1})


def test_verbalizer_recipe_learns_the_prompted_task_through_the_entry_point(straight):
    run, results = straight
    # 192 examples / global batch 16 = 12 steps per epoch; 4 epochs; validation each epoch
    assert (results["steps_per_epoch"], results["train_steps"], results["finished"]) == (12, 48, True)
    assert [v["step"] for v in results["validations"]] == [12, 24, 36, 48]
    assert results["select"] == {"split": "validation", "metric": "accuracy"}
    assert results["best_metric"] >= ACC_BAR, results["validations"]
    assert results["test"]["test"]["accuracy"] >= ACC_BAR
    best = results["best_valid"]["validation"]["accuracy"]
    assert best == max(v["valid"]["validation"]["accuracy"] for v in results["validations"]) == results["best_metric"]
    first_best = next(v for v in results["validations"] if v["valid"]["validation"]["accuracy"] == best)
    assert results["best_step"] == first_best["step"]  # a tie keeps the earlier epoch
    ckpts = run / "checkpoints"
    assert (ckpts / "best").read_text().strip() == results["best_checkpoint"]
    # keep_last=1 keeps the latest and the best, nothing else
    assert sorted(p.name for p in ckpts.glob("iter_*")) == sorted({results["best_checkpoint"], "iter_0000048"})
    assert "rows 192: kept 192" in results["data"]["train"]
    saved = (run / "config.yaml").read_text()
    assert "train_steps: 48" in saved and "seq_length: 16" in saved


def test_sigterm_mid_epoch_and_resume_write_the_same_results(straight, task, tmp_path):
    run = tmp_path / "run"
    keep = {"checkpoint.keep_last": 1}
    from megatron_biglm.cli.finetune import finetune

    def sigterm_at_18(step, loop_state):  # noqa: ARG001 - a preemption mid epoch 2
        if step == 18:
            os.kill(os.getpid(), signal.SIGTERM)

    first = finetune(None, finetune_overrides(task, run, **keep), callbacks=[sigterm_at_18])
    assert first["train"]["stopped_by"] == "SIGTERM" and first["train"]["iteration"] == 18
    assert not first["finished"] and [v["step"] for v in first["validations"]] == [12]
    assert (run / "checkpoints" / "best").read_text().strip() == "iter_0000012"
    assert (run / "checkpoints" / "iter_0000012").is_dir()  # the best survives keep_last=1
    resumed = _run(tmp_path, task, run, **keep)  # the same command again: resumes at step 18
    assert resumed == straight[1]
    assert json.loads((run / "train_done.json").read_text())["resumed_from"].endswith("iter_0000018")


def test_epochs_become_steps_rounding_up():
    from megatron_biglm.config import load_config
    from megatron_biglm.finetune.schedule import derived_schedule

    cfg = load_config(None, ["finetune.task=mnli", "finetune.epochs=5", "finetune.warmup_fraction=0.06",
                             "finetune.max_length=128", "training.global_batch_size=32"])
    d = derived_schedule(cfg, 1000)
    assert d.schedule.train_steps == 5 * 32  # ceil(1000 / 32) = 32 steps per epoch
    assert d.checkpoint.save_interval == 32 and d.training.eval_interval == 0  # no loss pass
    assert d.schedule.warmup_steps == round(0.06 * 160) and d.data.seq_length == 128
    assert (cfg.schedule.train_steps, cfg.data.seq_length) == (300000, 2048)  # the loaded config is kept
    every = derived_schedule(load_config(cfg, ["finetune.validate_every_steps=10"]), 1000)
    assert every.checkpoint.save_interval == 10


def test_keep_last_never_deletes_the_best(tmp_path):
    from megatron_biglm.checkpoint.dirs import best_checkpoint_name, new_temp_dir, point_best, seal

    seal(new_temp_dir(tmp_path, 1), 1, keep_last=1)
    point_best(tmp_path, 1)
    for it in (2, 3):
        seal(new_temp_dir(tmp_path, it), it, keep_last=1)
    assert sorted(p.name for p in tmp_path.glob("iter_*")) == ["iter_0000001", "iter_0000003"]
    assert best_checkpoint_name(tmp_path) == "iter_0000001"


def _recipe(task_files, **options):
    from megatron_biglm.config import FinetuneConfig
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.finetune.kinds import recipe_for
    from megatron_biglm.finetune.tasks import get_task

    from finetune_entry_fixtures import TEMPLATE
    opts = FinetuneConfig(task="rte", max_length=16, options={"template": TEMPLATE, "label_words": ["yes", "no"],
                                                              **options})
    return recipe_for(get_task("rte"), load_tokenizer(task_files["tokenizer"]), opts)


@pytest.mark.parametrize("over", ["labels", "vocab"])
def test_loss_is_the_cross_entropy_at_the_mask_slot(task, over):
    recipe = _recipe(task, loss_over=over)
    enc = recipe.encoder
    rows = [{"premise": "red cat dog sun moon rock", "hypothesis": "cat", "label": 0},
            {"premise": "red blue dog sun moon rock", "hypothesis": "cat", "label": 1}]
    examples = [enc.encode(r, r["label"]) for r in rows]
    batch = recipe.collate(examples)
    assert batch["split"].tolist() == batch["mask_positions"][:, 0].tolist()  # split = first mask slot
    logits = torch.randn(2, 16, 40)
    loss_sum, count, report = recipe._loss(batch, logits)
    yes, no = (ids[0] for ids in enc.label_token_ids)
    expected = 0.0
    for b, gold in enumerate((yes, no)):
        logp = torch.log_softmax(logits[b, int(batch["mask_positions"][b, 0])], -1)
        expected += float(-(logp[gold] - torch.logsumexp(logp[[yes, no]], 0)) if over == "labels" else -logp[gold])
    assert int(count) == 2 and math.isclose(float(loss_sum), expected, rel_tol=1e-5)
    assert report["accuracy"][1] == 2


def test_bad_settings_fail_with_a_message(task, monkeypatch):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run import plan_finetune

    with pytest.raises(ConfigError, match="quote them"):
        plan_finetune(load_config(None, [f"data.tokenizer={task['tokenizer']}", "finetune.task=rte",
                                         "finetune.options.template='{premise} ? <mask>'",
                                         "finetune.options.label_words=[yes, no]"]))
    monkeypatch.setattr("megatron_biglm.finetune.kinds.KINDS", {})
    with pytest.raises(ConfigError, match="unknown task kind 'verbalizer'"):
        plan_finetune(load_config(None, [f"data.tokenizer={task['tokenizer']}", "finetune.task=rte"]))
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="finetune.data.validation"):
        plan_finetune(load_config(None, [f"data.tokenizer={task['tokenizer']}", "finetune.task=rte",
                                         f"finetune.data.train={task['files']['train']}"]))


def test_module_entry_and_launch_script_dry_run():
    env = {**os.environ, "PYTHONPATH": str(REPO), "DRY_RUN": "1", "TASK": "cb", "NODES": "1",
           "PYTHON": sys.executable}
    for key in ("TP", "PP", "MBS", "GBS"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.finetune", "--help"], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and "finetune" in proc.stdout, proc.stderr
    proc = subprocess.run(["bash", str(REPO / "launch" / "finetune.sh")], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    import shlex

    from megatron_biglm.config import load_config
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert argv[argv.index("-m", argv.index("torch.distributed.run")) + 1] == "megatron_biglm.cli.finetune"
    config = argv[argv.index("--config") + 1]
    assert config.endswith("examples/configs/finetune/cb.yaml")
    cfg = load_config(config, argv[argv.index("--config") + 2:])
    # the task config's batch sizes: the launcher passes none of its own
    assert cfg.finetune.task == "cb" and cfg.training.global_batch_size == load_config(config).training.global_batch_size


def test_starts_from_the_weights_of_another_run(straight, task, tmp_path):
    """`finetune.init_from`: any checkpoint's weights, fresh optimizer and schedule at step 0
    (here the trained run's: the first validation is already at its accuracy)."""
    from megatron_biglm.cli.finetune import finetune

    run = tmp_path / "from_trained"
    results = finetune(None, finetune_overrides(task, run, **{"finetune.epochs": 1, "optimizer.lr": 1e-5,
                                                              "finetune.init_from": str(straight[0])}))
    assert results["train"]["initialized_from"] == str(straight[0] / "checkpoints" / "iter_0000048")
    assert results["train"]["resumed_from"] is None and results["train"]["iteration"] == 12
    assert results["validations"][0]["valid"]["validation"]["accuracy"] >= ACC_BAR


def test_another_runs_checkpoint_as_checkpoint_load_is_refused_naming_init_from(straight, task, tmp_path, capsys):
    """`checkpoint.load` of another (non weights-only) run would be resumed as this fine-tune,
    with that run's step and schedule: refused before anything is built, and the message
    names `finetune.init_from`, which takes its weights instead."""
    from megatron_biglm.cli.finetune import main

    run = tmp_path / "wrong_start"
    config = tmp_path / "ft.yaml"
    config.write_text("finetune: {task: rte}\n")
    load = straight[0] / "checkpoints"
    assert main(["--config", str(config), *finetune_overrides(task, run), f"checkpoint.load={load}"]) == 2
    err = capsys.readouterr().err
    assert f"pass finetune.init_from={load} instead of checkpoint.load" in err and "Traceback" not in err
    assert not (run / "checkpoints").exists()


def test_multi_token_label_words_are_scored_by_their_summed_log_probs(task):
    recipe = _recipe(task)  # "yes" / "no": one slot
    two = _recipe(task, label_words=["yes", "no no"])
    assert recipe.encoder.num_slots == 1 and two.encoder.num_slots == 2
    row = {"premise": "red cat dog sun moon rock", "hypothesis": "cat", "label": 1}
    batch = two.collate([two.encoder.encode(row, 1)])
    logits = torch.randn(1, 16, 40)
    loss_sum, _, _ = two._loss(batch, logits)
    slots = batch["mask_positions"][0].tolist()
    logp = torch.log_softmax(logits[0, slots], -1)
    yes, no = two.encoder.label_token_ids[0][0], two.encoder.label_token_ids[1][0]
    scores = torch.stack([logp[0, yes], logp[0, no] + logp[1, no]])
    assert math.isclose(float(loss_sum), float(-torch.log_softmax(scores, 0)[1]), rel_tol=1e-5)


def dp_worker(task: dict, out: str) -> dict:
    """One torchrun rank (DP=2): a straight run, and one stopped mid-epoch then resumed."""
    from megatron_biglm.cli.finetune import finetune

    dp = {"training.micro_batch_size": 8}
    straight = finetune(None, finetune_overrides(task, Path(out) / "straight", **dp))
    finetune(None, finetune_overrides(task, Path(out) / "split", **dp, **{"training.exit_after_steps": 18}))
    resumed = finetune(None, finetune_overrides(task, Path(out) / "split", **dp))
    drop = ("train",)
    return {"straight": {k: v for k, v in straight.items() if k not in drop},
            "resumed": {k: v for k, v in resumed.items() if k not in drop},
            "resumed_from": resumed["train"]["resumed_from"]}


@pytest.mark.slow
def test_data_parallel_fine_tune_learns_and_resumes(task, tmp_path):
    from torchrun_util import run_function

    res = run_function("tests/finetune/test_finetune_entry.py:dp_worker", nproc=2, timeout=600,
                       kwargs={"task": task, "out": str(tmp_path)}).check().results[0]
    assert res["straight"]["best_metric"] >= ACC_BAR and res["straight"]["finished"]
    assert res["resumed_from"].endswith("iter_0000018")
    assert res["resumed"] == res["straight"]
    assert json.loads((tmp_path / "straight" / "results.json").read_text())["best_metric"] == \
        res["straight"]["best_metric"]


VERBALIZER_HF_SCRIPT = BLOCK_OUR_PACKAGES + r"""
import json, sys, torch
from transformers import AutoModelForMaskedLM
folder, batch = sys.argv[1], json.load(open(sys.argv[2]))
model = AutoModelForMaskedLM.from_pretrained(folder).eval()
ids, lengths, split = (torch.tensor(batch[k]) for k in ("tokens", "lengths", "split"))
q = torch.arange(ids.shape[1])[None, :, None]
k = torch.arange(ids.shape[1])[None, None, :]
# the model card's split mask, padding included: prefix rows never see the suffix
blocked = ((k >= split[:, None, None]) & (q < split[:, None, None])) | (k >= lengths[:, None, None])
mask = torch.zeros(blocked.shape).masked_fill(blocked, torch.finfo(torch.float32).min)[:, None]
with torch.no_grad():
    logp = model(input_ids=ids, attention_mask=mask).logits.log_softmax(-1)
slots = torch.tensor(batch["mask_positions"])
labels = torch.tensor(batch["label_tokens"])  # [L, K]: one token per slot
at = logp[torch.arange(len(ids))[:, None], slots]  # [B, K, V]
scores = torch.stack([at[:, torch.arange(labels.shape[1]), label].sum(-1) for label in labels], -1)
print(json.dumps({"scores": scores.tolist(), "predicted": scores.argmax(-1).tolist()}))
"""


def test_verbalizer_model_exports_as_masked_lm_with_the_same_predictions(straight, task, tmp_path):
    """The fine-tuned verbalizer model, exported, loads in a fresh process with plain
    transformers only (our packages blocked) and, with the model card's split mask, scores the
    label words at the mask slot as we do: the same predictions."""
    from megatron_biglm.config import load_config
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.finetune.kinds import recipe_for
    from megatron_biglm.finetune.row_report import RowReport
    from megatron_biglm.finetune.tasks import get_task
    from megatron_biglm.inference.loading import load_megatron_checkpoint

    from finetune_entry_fixtures import rows

    run, results = straight
    best = run / "checkpoints" / results["best_checkpoint"]
    to_hf(best, tmp_path / "hf", progress=False)
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["EuroBertForMaskedLM"]
    loaded = load_megatron_checkpoint(best)
    cfg = load_config(best / "config.yaml")
    recipe = recipe_for(get_task(cfg.finetune.task), load_tokenizer(cfg.data.tokenizer), cfg.finetune)
    recipe.use_split = cfg.objective.resolved.restricts_attention
    examples = recipe.encode(rows(24, 9), RowReport(), training=False)
    batch = recipe.collate(examples)
    assert bool((batch["split"] > 0).all()) and recipe.slot_targets.shape == (2, 1)
    ours = recipe.predict(loaded.model, examples, "cpu", 32)
    spec = tmp_path / "batch.json"
    spec.write_text(json.dumps({"tokens": batch["tokens"].tolist(), "lengths": batch["valid_lengths"].tolist(),
                                "split": batch["split"].tolist(), "mask_positions": batch["mask_positions"].tolist(),
                                "label_tokens": recipe.slot_targets.tolist()}))
    done = subprocess.run([sys.executable, "-c", VERBALIZER_HF_SCRIPT, str(tmp_path / "hf"), str(spec)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs["predicted"] == ours
    with torch.no_grad():
        our_scores = recipe.scores(batch, recipe.logits(loaded.model, batch, "cpu")).float()
    torch.testing.assert_close(torch.tensor(theirs["scores"]), our_scores, atol=1e-4, rtol=1e-4)
    assert sum(p == e.label for p, e in zip(ours, examples)) >= 22  # the fine-tune's answers, not noise
