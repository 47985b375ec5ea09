"""The long-form benchmark at toy size: its three decoders, the exactness check and its metrics.

Timings are not checked (benchmarks are not tests); what must hold is that the cached decoder's
tokens equal the uncached reference's in every run, that each ratio is computed from its own
decoder's time, and that the text metrics equal hand-counted values.
"""
from __future__ import annotations

import json

import pytest
from eval_fixtures import one_torch_thread  # noqa: F401 - fixture

from benchmarks import bench_longform, text_metrics


def test_longform_toy_run_is_exact_and_reports_every_decoder(tmp_path, capsys, one_torch_thread):  # noqa: F811
    out = tmp_path / "longform.json"
    assert bench_longform.main(["--preset", "tiny", "--prompt-tokens", "12", "--new-tokens", "40",
                                "--block", "8", "--steps", "3", "--batches", "1", "3",
                                "--device", "cpu", "--reps", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [r["batch"] for r in results["runs"]] == [1, 3]
    for row in results["runs"]:
        assert row["identical"] is True and row["lengths_ok"] is True
        assert row["first_difference"] == [None] * row["batch"]
        for name in bench_longform.DECODERS:
            assert row[name]["tokens_per_s"] == pytest.approx(row["batch"] * 40 / row[name]["seconds"])
        assert row["cached_vs_uncached"] == pytest.approx(row["uncached"]["seconds"] / row["cached"]["seconds"])
        assert row["cached_vs_canvas"] == pytest.approx(row["canvas"]["seconds"] / row["cached"]["seconds"])
    table = capsys.readouterr().out
    assert table.count("| identical |") == 2 and "blocks of 8" in table


def test_longform_megatron_pool_matches_the_growing_cache(tmp_path, one_torch_thread):  # noqa: F811
    """`--backend megatron`: our model with the slot-pool cache, its tokens checked against the
    growing cache (the reference it names) before any speed."""
    out = tmp_path / "longform.json"
    assert bench_longform.main(["--backend", "megatron", "--preset", "tiny", "--prompt-tokens", "12",
                                "--new-tokens", "24", "--block", "8", "--steps", "2", "--batches", "1", "3",
                                "--device", "cpu", "--reps", "1", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert "growing K/V cache" in results["meta"]["reference"] and "slot pool" in results["meta"]["cache"]
    for row in results["runs"]:
        assert row["identical"] is True and row["lengths_ok"] is True and row["cached_vs_canvas"] > 0


def test_first_difference_counts_a_short_output():
    """A shorter output is a difference (at its end), never a match of the common part."""
    assert bench_longform.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bench_longform.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert bench_longform.first_difference([1, 2], [1, 2, 3]) == 2
    assert bench_longform.first_difference([1, 2, 3], [1, 2]) == 2


def test_text_metrics_equal_hand_counts():
    outputs = [[1, 2, 1, 2, 1, 2, 3], [5, 5, 5, 5, 5]]
    # bigrams: (1,2)(2,1)(1,2)(2,1)(1,2)(2,3): 3 distinct of 6; (5,5) x4: 1 of 4
    assert text_metrics.distinct_2(outputs) == pytest.approx((3 / 6 + 1 / 4) / 2)
    # 4-grams: 1212 2121 1212* 2123: 1 repeat of 4; 5555 x2: 1 repeat of 2
    assert text_metrics.repeated_4gram_rate(outputs) == pytest.approx((1 / 4 + 1 / 2) / 2)


def test_full_context_nll_masks_every_generated_token_once():
    """A fake model whose log-probability of token t is known: the NLL is their mean over the
    generated tokens, each scored once, with the prompt as the prefix."""
    import torch
    from types import SimpleNamespace

    calls = []

    class Fake:
        special = SimpleNamespace(bos_id=1, mask_id=3, pad_id=0)
        device = torch.device("cpu")

        def logits(self, ids, lengths, split, positions):
            calls.append((ids.clone(), int(split), positions.clone()))
            assert bool((ids[0, positions[0]] == 3).all())  # the scored tokens are masked
            logits = torch.full((1, positions.shape[1], 10), -1e9)
            logits[..., 4:] = torch.log(torch.arange(1, 7, dtype=torch.float))  # p(t) ∝ t - 3
            return logits

    prompt, generated = [5, 6], [4, 9, 7] * 6
    nll = text_metrics.full_context_nll(Fake(), [prompt], [generated])
    probs = torch.arange(1, 7, dtype=torch.float) / 21
    want = -sum(float(torch.log(probs[t - 4])) for t in generated) / len(generated)
    assert nll == pytest.approx(want)
    scored = sorted(int(p) for _, _, pos in calls for p in pos[0])
    assert scored == list(range(3, 3 + len(generated)))  # each generated position once
    assert all(split == 3 for _, split, _ in calls)
