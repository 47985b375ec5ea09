"""`biglm` on a megatron checkpoint: the in-process megatron model scores exactly like its
HF export, for every scoring rule, whatever TP the checkpoint was saved at.

The checkpoint is a real one in the trainer's layout, written by `from_hf` from a random
EuroBERT (logits O(1..10)) with a BPE tokenizer trained on Shakespeare (vocab 400, padded to
512 by megatron: the padding rows must not enter the softmax). The reference is `biglm` on
the `to_hf` export of that same checkpoint (4D split mask, HF attention).
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from convert_fixtures import random_eurobert_source
from eval_fixtures import corpus_texts, instances, one_torch_thread, write_task_data  # noqa: F401

from megatron_biglm.evaluation.models import BiGLMEvalLM
from megatron_biglm.export.convert_from_hf import from_hf
from megatron_biglm.export.convert_to_hf import to_hf
from megatron_biglm.checkpoint.dirs import CheckpointError

TOL = 1e-4
RULES = [("beam", 1), ("beam", 3), ("oneshot", 1), ("pll", 1), ("l2r", 1)]


@pytest.fixture(scope="module")
def source_dir(tokenizer_dir, tmp_path_factory):
    return random_eurobert_source(tokenizer_dir, tmp_path_factory, seed=3)


@pytest.fixture(scope="module")
def checkpoint(source_dir, tmp_path_factory):
    """A TP=1 megatron checkpoint root (`latest` + iter_0000000)."""
    out = tmp_path_factory.mktemp("ckpt") / "ckpt"
    from_hf(source_dir, out, progress=False, verify=False)
    return out


@pytest.fixture(scope="module")
def export_dir(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "hf"
    to_hf(checkpoint, out, progress=False)
    return out


@pytest.fixture(scope="module")
def pairs(corpus_jsonl):
    """(context, continuation) pairs from real text: multi-token continuations, an empty
    context, and a context longer than the model's 128 positions (truncated from the left)."""
    words = " ".join(corpus_texts(corpus_jsonl, limit=6)).split()
    out = [("", "To be, or not to be")]
    for start, n_ctx, n_cont in [(0, 9, 3), (40, 15, 1), (90, 4, 5), (130, 20, 2), (300, 160, 2)]:
        out.append((" ".join(words[start:start + n_ctx]) + " ",
                    " ".join(words[start + n_ctx:start + n_ctx + n_cont])))
    return out


def _scores(path, pairs, **args):
    lm = BiGLMEvalLM(path=str(path), batch_size=4, progress=False, **args)
    return lm, lm.loglikelihood(instances(pairs))


@pytest.mark.parametrize("scoring,beam", RULES, ids=[f"{s}{b}" for s, b in RULES])
def test_megatron_checkpoint_scores_equal_its_hf_export(checkpoint, export_dir, pairs, scoring, beam):
    mega, got = _scores(checkpoint, pairs, scoring=scoring, beam=beam)
    hf, want = _scores(export_dir, pairs, scoring=scoring, beam=beam, prefix_cache="off")
    info = mega.get_model_info()["masked_lm_eval"]
    assert info["split_mode"] == "native" and info["model_class"] == "BiGLMModel"
    assert hf.get_model_info()["masked_lm_eval"]["split_mode"] == "4d-mask"
    assert info["truncated_contexts"] == 1  # the 160-word context does not fit 128 positions
    for (lp, greedy), (ref_lp, ref_greedy) in zip(got, want):
        assert lp == pytest.approx(ref_lp, abs=TOL)
        assert greedy == ref_greedy
    spread = [lp for lp, _ in got]
    assert max(spread) - min(spread) > 1.0  # non-trivial scores, not all equal


@pytest.mark.parametrize("scoring,beam", [("beam", 2), ("oneshot", 1), ("l2r", 1)])
def test_megatron_prefix_cache_scores_equal_the_uncached_forward(checkpoint, pairs, scoring, beam):
    """lm-eval on a megatron checkpoint reuses the exact prefix K/V cache by default (the one
    loader offers it wherever the split makes it exact); every score equals the full forward's,
    with each context encoded once instead of once per candidate row."""
    cached_lm, cached = _scores(checkpoint, pairs, scoring=scoring, beam=beam)
    plain_lm, plain = _scores(checkpoint, pairs, scoring=scoring, beam=beam, prefix_cache="off")
    assert cached_lm.adapter.prefix_cache and cached_lm.prefix_reuse
    assert not plain_lm.adapter.prefix_cache and not plain_lm.prefix_reuse
    for (lp, greedy), (ref, ref_greedy) in zip(cached, plain):
        assert lp == pytest.approx(ref, abs=TOL) and greedy == ref_greedy
    assert max(lp for lp, _ in plain) - min(lp for lp, _ in plain) > 1.0


@pytest.mark.parametrize("variant,requested,expected", [
    ("biglm", None, "on"), ("mlm", None, "off"), ("no_attn", None, "off"), ("mlm", "auto", "off"),
    ("mlm", "on", "on"), ("biglm", "off", "off")])
def test_split_attention_defaults_to_the_trained_variant(variant, requested, expected):
    from megatron_biglm.inference.loading import split_attention_for_variant

    chosen, why = split_attention_for_variant(variant, requested)
    assert chosen == expected and repr(variant) in why


def test_the_split_attention_choice_is_recorded_from_the_checkpoint(checkpoint, pairs):
    lm, _ = _scores(checkpoint, pairs[:1], scoring="oneshot")
    info = lm.get_model_info()["masked_lm_eval"]
    assert info["split_attention_choice"] == "on: the checkpoint's objective.variant is 'biglm'"
    assert info["split_mode"] == "native"


def test_split_attention_matters_and_off_matches_full_attention_export(checkpoint, export_dir, pairs):
    _, split_on = _scores(checkpoint, pairs, scoring="oneshot")
    _, split_off = _scores(checkpoint, pairs, scoring="oneshot", split_attention="off")
    _, hf_off = _scores(export_dir, pairs, scoring="oneshot", split_attention="off")
    assert max(abs(a[0] - b[0]) for a, b in zip(split_on[1:], split_off[1:])) > 1e-2
    for (lp, _), (ref, _) in zip(split_off, hf_off):
        assert lp == pytest.approx(ref, abs=TOL)


def test_rolling_loglikelihood_and_iter_folder_and_run_dir_paths(checkpoint, export_dir, corpus_jsonl,
                                                                 tmp_path):
    """Rolling windows (a text longer than the model) agree too; an iter_* folder and a run
    directory (`<run>/checkpoints/latest`) name the same checkpoint."""
    text = " ".join(corpus_texts(corpus_jsonl, limit=2))[:1500]
    reqs = instances([(text,)], "loglikelihood_rolling")
    run = tmp_path / "run"
    shutil.copytree(checkpoint, run / "checkpoints")
    got = [BiGLMEvalLM(path=str(p), scoring="oneshot", progress=False).loglikelihood_rolling(reqs)[0]
           for p in (checkpoint / "iter_0000000", run)]
    want = BiGLMEvalLM(path=str(export_dir), scoring="oneshot", prefix_cache="off",
                       progress=False).loglikelihood_rolling(reqs)[0]
    assert got[0] == got[1] and got[0] == pytest.approx(want, abs=TOL * 10)
    assert want < -50.0  # a long real text under a random model: many tokens scored


def test_logits_at_positions_equal_the_full_forward_sliced_to_the_vocab(checkpoint):
    """The adapter runs the tied head at chosen positions only; it must equal the model's own
    full forward, cut to the tokenizer's 400 entries of the 512-row padded embedding."""
    lm = BiGLMEvalLM(path=str(checkpoint), progress=False)
    adapter, model = lm.adapter, lm.adapter.model
    gen = torch.Generator().manual_seed(11)
    ids = torch.randint(0, 400, (3, 20), generator=gen)
    lengths, split = torch.tensor([20, 14, 9]), torch.tensor([5, 1, 8])
    positions = torch.randint(0, 9, (3, 6), generator=gen)
    got = adapter.logits(ids, lengths, split, positions)
    with torch.no_grad():
        full = model(ids, split=split, valid_lengths=lengths)
    assert full.shape[-1] == 512 and got.shape == (3, 6, 400)
    want = full.gather(1, positions[..., None].expand(-1, -1, 512))[..., :400]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got.abs().max() > 1.0


def test_bad_paths_and_arguments_get_clear_errors(checkpoint, tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an exported HF directory"):
        BiGLMEvalLM(path=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="nor a megatron checkpoint"):
        BiGLMEvalLM(path=str(tmp_path / "empty"))
    broken = tmp_path / "broken"
    shutil.copytree(checkpoint, broken)
    (broken / "iter_0000000" / "COMPLETE.json").unlink()  # an unfinished save
    with pytest.raises(CheckpointError, match="incomplete"):
        BiGLMEvalLM(path=str(broken))
    (tmp_path / "bare" / "iter_0000010").mkdir(parents=True)  # `latest` -> an empty folder
    (tmp_path / "bare" / "latest").write_text("iter_0000010\n")
    with pytest.raises(CheckpointError, match="incomplete"):
        BiGLMEvalLM(path=str(tmp_path / "bare"))
    with pytest.raises(FileNotFoundError, match="neither an exported HF directory"):
        BiGLMEvalLM(path=str(tmp_path / "bare" / "iter_0000010"))
    with pytest.raises(ValueError, match="prefix_cache=on is impossible.*split_attention=off"):
        BiGLMEvalLM(path=str(checkpoint), prefix_cache="on", split_attention="off")
    with pytest.raises(ValueError, match="float32"):
        BiGLMEvalLM(path=str(checkpoint), dtype="float64")
    with pytest.raises(TypeError, match="unknown model argument"):
        BiGLMEvalLM(path=str(checkpoint), beams=2)


def test_missing_run_tokenizer_needs_tokenizer_arg(checkpoint, tokenizer_dir, tmp_path, pairs):
    moved = tmp_path / "moved"
    shutil.copytree(checkpoint, moved)
    config = moved / "iter_0000000" / "config.yaml"
    text = config.read_text()
    assert str(checkpoint / "tokenizer") in text
    gone = tmp_path / "gone_tokenizer"
    config.write_text(text.replace(str(checkpoint / "tokenizer"), str(gone)))
    _refresh_manifest(moved / "iter_0000000")
    with pytest.raises(ValueError, match="tokenizer=DIR"):
        BiGLMEvalLM(path=str(moved))
    _, got = _scores(moved, pairs[:3], scoring="oneshot", tokenizer=str(tokenizer_dir))
    _, want = _scores(checkpoint, pairs[:3], scoring="oneshot")
    assert got == want


def _refresh_manifest(folder):
    """Editing config.yaml changes its size; re-record it so the checkpoint stays complete."""
    complete = folder / "COMPLETE.json"
    data = json.loads(complete.read_text())
    data["files"]["config.yaml"] = (folder / "config.yaml").stat().st_size
    complete.write_text(json.dumps(data))


def test_zero_shot_tool_runs_on_a_megatron_checkpoint(checkpoint, tmp_path, capsys):
    """`python -m megatron_biglm.cli.eval_zero_shot --model biglm --model-args path=CKPT` (its main, in-process)."""
    from megatron_biglm.cli.eval_zero_shot import main

    data = write_task_data(tmp_path / "data", ["boolq"], n=3)
    out = tmp_path / "results.json"
    assert main(["--model", "biglm", "--model-args", f"path={checkpoint},scoring=oneshot",
                 "--suite", "boolq", "--data-dir", str(data), "--output", str(out)]) == 0
    results = json.loads(out.read_text())
    info = results["config"]["masked_lm_eval"]
    assert info["split_mode"] == "native" and info["scored_requests"] == 6  # 3 docs x yes/no
    assert results["results"]["boolq"]["acc,none"] * 3 in (0.0, 1.0, 2.0, 3.0)
    assert "BoolQ" in capsys.readouterr().out


@pytest.mark.slow  # from_hf at TP=2 starts two torchrun ranks: ~20-40 s
def test_checkpoint_saved_at_tp2_scores_the_same(source_dir, checkpoint, pairs, tmp_path):
    tp2 = tmp_path / "tp2"
    from_hf(source_dir, tp2, tp=2, progress=False, verify=False)
    lm, got = _scores(tp2, pairs, scoring="beam", beam=2)
    _, want = _scores(checkpoint, pairs, scoring="beam", beam=2)
    assert any("saved at TP=2" in note for note in lm.get_model_info()["masked_lm_eval"]["load_notes"])
    for (lp, g), (ref, ref_g) in zip(got, want):
        assert lp == pytest.approx(ref, abs=TOL) and g == ref_g


def test_training_hook_on_the_live_megatron_model_matches_the_export(checkpoint, export_dir, tmp_path):
    """The in-training path (`megatron_adapter_for` as the hook's make_adapter) gives the
    metrics the exported model gives, and restores the model's train mode."""
    from functools import partial

    from megatron_biglm.inference.megatron_adapter import megatron_adapter_for
    from megatron_biglm.evaluation.training_hook import ZeroShotHookConfig, ZeroShotTrainingHook

    lm = BiGLMEvalLM(path=str(checkpoint), progress=False)
    model, tok = lm.adapter.model, lm.tokenizer
    data = write_task_data(tmp_path / "data", ["piqa", "boolq"], n=4)
    cfg = ZeroShotHookConfig(enabled=True, every_n_steps=5, tasks=("piqa", "boolq"), limit=None,
                             scoring="beam", beam=2, data_dir=str(data))
    hook = ZeroShotTrainingHook(cfg, tok, make_adapter=partial(megatron_adapter_for, tokenizer=tok))
    model.train()
    assert hook(3, model) is None
    got = hook(10, model)
    assert model.training
    from transformers import AutoModelForMaskedLM

    hf_model = AutoModelForMaskedLM.from_pretrained(str(export_dir)).eval()
    want = ZeroShotTrainingHook(cfg, tok)(10, hf_model)
    assert set(got) == {"zero_shot/piqa/acc_norm", "zero_shot/boolq/acc", "zero_shot/avg"}
    assert got == pytest.approx(want, abs=1e-9)
