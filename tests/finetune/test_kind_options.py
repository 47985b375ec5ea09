"""A kind's settings live in its `Options` alone (`finetune.options`): a user's config that still
sets one under `finetune:` is refused naming its new place, and what a run saved before (its
config.yaml; its run record: tests/run/test_run_claim.py) is read through the one migration that
moves them there."""
from __future__ import annotations

import pytest
import yaml

from finetune_entry_fixtures import TEMPLATE, finetune_overrides, write_task


@pytest.mark.parametrize("key, value, place", [
    ("template", "'{premise} <mask>'", "finetune.options.template"),
    ("label_words", "['yes', 'no']", "finetune.options.label_words"),
    ("loss_over", "vocab", "finetune.options.loss_over"),
    ("fill_short_labels_with", "2", "finetune.options.fill_short_labels_with"),
    ("label_names", "[a, b]", "finetune.options.label_names"),
    ("problem_type", "regression", "finetune.task.problem_type"),
])
def test_a_kind_setting_under_finetune_is_refused_naming_its_new_place(tmp_path, key, value, place):
    from megatron_biglm.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=rf"finetune\.{key} is a setting of the task kind .* \(did you mean "
                                          rf"'{place}'\?\)"):
        load_config(None, ["finetune.task=rte", f"finetune.{key}={value}"])
    config = tmp_path / "ft.yaml"
    config.write_text(f"finetune:\n  task: rte\n  {key}: {value}\n")
    with pytest.raises(ConfigError, match=rf"did you mean '{place}'"):
        load_config(config)


def _old_saved_config(tmp_path, task) -> tuple:
    """A verbalizer run's config.yaml as runs saved it when the prompt was a `finetune:` key."""
    from megatron_biglm.config import load_config

    cfg = load_config(None, finetune_overrides(task, tmp_path / "run"))
    tree = cfg.to_dict()
    options = tree["finetune"].pop("options")
    tree["finetune"].update(options, loss_over="vocab", fill_short_labels_with=None, label_names=None,
                            problem_type="single_label_classification")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return cfg, path


def test_a_saved_config_with_the_old_keys_reads_through_the_one_migration(tmp_path):
    from megatron_biglm.config import ConfigError, load_config, load_saved_config
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.finetune.kinds import recipe_for
    from megatron_biglm.finetune.tasks import get_task

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    cfg, path = _old_saved_config(tmp_path, task)
    refused = r"is a setting of the task kind 'verbalizer' now \(did you mean 'finetune\.options\."
    with pytest.raises(ConfigError, match=refused):
        load_config(path)  # as a user's config: refused
    saved = load_saved_config(path)
    assert saved.finetune.options == {"template": TEMPLATE, "label_words": ["yes", "no"], "loss_over": "vocab"}
    recipe = recipe_for(get_task(saved.finetune.task), load_tokenizer(saved.data.tokenizer), saved.finetune)
    assert (recipe.task.prompt.template, recipe.opts.loss_over, recipe.opts.label_words) == (
        TEMPLATE, "vocab", ["yes", "no"])
    tree = yaml.safe_load(path.read_text())
    tree["finetune"]["problem_type"] = "regression"  # beside a single-label task: not a migration, an error
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match=r"config\.yaml: finetune\.problem_type='regression' but its task is"):
        load_saved_config(path)
    tree["finetune"].update(problem_type=None, options={"template": "{premise} ? <mask>"})
    path.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError, match="finetune.template=.* and finetune.options.template=.*; keep one"):
        load_saved_config(path)
