"""The fine-tuning example configs encode the paper's settings (Table 3) and name real tasks."""
from __future__ import annotations

from pathlib import Path

import pytest

from megatron_biglm.config import load_config
from megatron_biglm.finetune.tasks import get_task

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "configs" / "finetune"
TASKS = ["mnli", "boolq", "cb", "copa", "rte", "wic", "squad", "xsum", "msqg"]


@pytest.mark.parametrize("name", TASKS)
def test_config_loads_and_names_its_task(name):
    cfg = load_config(FOLDER / f"{name}.yaml")
    task = get_task(cfg.finetune.task)
    assert task.name == name and cfg.finetune.validate_every_steps == 0  # validation every epoch
    assert cfg.checkpoint.keep_last == 1 and cfg.finetune.init_from
    splits = [task.train_split, *task.eval_splits]
    assert sorted(cfg.finetune.data) == sorted(splits), "one file per split the task reads"


def test_paper_epochs_and_metrics():
    epochs = {n: load_config(FOLDER / f"{n}.yaml").finetune.epochs for n in TASKS}
    assert (epochs["mnli"], epochs["squad"], epochs["xsum"], epochs["msqg"]) == (5, 5, 50, 50)
    mnli = load_config(FOLDER / "mnli.yaml")
    assert mnli.finetune.select_split == "validation_matched"
    assert get_task("mnli").eval_splits == ("validation_matched", "validation_mismatched")
    assert get_task("cb").select == "macro_f1"


@pytest.mark.parametrize("name", ["xsum", "msqg"])
def test_seq2seq_configs_decode_with_the_paper_mask_predict_settings(name):
    """T = 10 and a length beam of 5 (Ghazvininejad et al.), source + target budgets filling
    the model's positions, and a length head with a class for every target length."""
    from finetune_fixtures import word_tokenizer

    from megatron_biglm.finetune.kinds import recipe_for

    cfg = load_config(FOLDER / f"{name}.yaml")
    recipe = recipe_for(get_task(name), word_tokenizer(["a b c"]), cfg.finetune)
    assert (recipe.decoding.steps, recipe.decoding.length_beam) == (10, 5)
    assert recipe.decoding.max_new_tokens == recipe.max_target_length
    assert recipe.max_source_length + recipe.max_target_length == cfg.finetune.max_length
    assert cfg.model.overrides["length_head_max"] >= recipe.max_target_length


def test_seq2seq_decoding_options_are_checked_and_a_fixed_length_is_kept():
    from finetune_fixtures import word_tokenizer

    from megatron_biglm.config.finetune_section import FinetuneConfig
    from megatron_biglm.finetune.kinds import recipe_for

    def recipe(**options):
        return recipe_for(get_task("xsum"), word_tokenizer(["a b c"]),
                          FinetuneConfig(task="xsum", max_length=32, options={"max_target_length": 8, **options}))

    assert recipe().decoding.max_new_tokens == 8 and recipe().max_source_length == 24
    fixed = recipe(generation={"length": 5}).decoding
    assert (fixed.length, fixed.max_new_tokens, fixed.length_beam) == (5, None, 5)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="finetune.options.eval_limit"):
            recipe(eval_limit=bad)
    with pytest.raises(ValueError, match="finetune.options.generation.*expected a dict"):
        recipe(generation=[10])
    with pytest.raises(ValueError, match=r"unknown option 'finetune.options.max_targt_length' for task kind "
                                         r"'seq2seq' \(did you mean 'max_target_length'\?\); valid keys"):
        recipe(max_targt_length=8)
