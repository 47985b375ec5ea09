"""The masked-LM dataset over real preprocessed text: shapes, text, order, resume, blends, anneal."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dataset_fixtures import corpora, process_group  # noqa: F401  (fixtures)
from megatron_biglm.data.collate import collate_masked_lm
from megatron_biglm.data.pretrain_data import build_pretrain_datasets, make_loader
from megatron_biglm.objective import IGNORE_INDEX

SEQ = 128
MAIN, OTHER, ANNEAL = "antony_and_cleopatra_gut", "alls_well_that_ends_well_gut", "as_you_like_it_gut"


def build(corpora, tmp_path, *, train_samples=64, valid_samples=0, test_samples=0, objective=None,
          anneal_start_sample=None, **data):
    config = {"blend": [[1.0, corpora.prefixes[MAIN]]], "split": "90,5,5", "seq_length": SEQ,
              "seed": 1234, "cache_dir": str(tmp_path / "cache")}
    config.update(data)
    return build_pretrain_datasets(config, token_ids=corpora.token_ids, objective=objective,
                                   train_samples=train_samples, valid_samples=valid_samples,
                                   test_samples=test_samples, anneal_start_sample=anneal_start_sample)


def original_tokens(sample):
    """Undo the <mask> replacement: labels hold the original token wherever masked."""
    return torch.where(sample["labels"] != IGNORE_INDEX, sample["labels"], sample["tokens"])


def text_pieces(corpora, ids):
    """The decoded window cut at EOS; pieces shorter than a few words are not informative."""
    text = corpora.decode(ids.tolist())
    return [p.strip() for p in text.split("</s>") if len(p.strip()) > 20]


def comes_from(corpora, ids, documents):
    pieces = text_pieces(corpora, ids)
    return bool(pieces) and all(any(piece in doc for doc in documents) for piece in pieces)


def test_samples_have_shapes_dtypes_splits_and_real_text(corpora, tmp_path, process_group):
    ds = build(corpora, tmp_path, train_samples=64, valid_samples=8, test_samples=8)
    lo, hi = math.ceil(0.2 * SEQ), math.floor(0.8 * SEQ)
    docs = corpora.texts[MAIN]
    n_docs = len(docs)
    train_docs = docs[: round(0.9 * n_docs)]
    valid_docs = docs[round(0.9 * n_docs): round(0.95 * n_docs)]
    test_docs = docs[round(0.95 * n_docs):]
    assert len(ds.train) >= 64 and len(ds.valid) >= 8 and len(ds.test) >= 8
    for dataset, held in ((ds.train, train_docs), (ds.valid, valid_docs), (ds.test, test_docs)):
        for i in range(8):
            s = dataset[i]
            assert s["tokens"].shape == s["labels"].shape == s["loss_mask"].shape == (SEQ,)
            assert s["tokens"].dtype == s["labels"].dtype == torch.int64
            assert s["loss_mask"].dtype == torch.float32 and isinstance(s["split"], int)
            assert lo <= s["split"] <= hi
            masked = s["loss_mask"].bool()
            assert masked.any() and torch.equal(masked, s["labels"] != IGNORE_INDEX)
            assert (s["tokens"][masked] == corpora.token_ids.mask_id).all()
            raw = torch.from_numpy(dataset.window(i))
            assert torch.equal(original_tokens(s), raw)
            assert not masked[raw == corpora.token_ids.eos_id].any(), "EOS was masked"
            assert text_pieces(corpora, raw) and comes_from(corpora, raw, held), "text not from its split's documents"


def test_same_seed_same_samples_other_seed_other_samples(corpora, tmp_path, process_group):
    a = build(corpora, tmp_path / "a").train
    b = build(corpora, tmp_path / "b").train
    c = build(corpora, tmp_path / "c", seed=99).train
    for i in range(20):
        assert all(torch.equal(a[i][k], b[i][k]) for k in ("tokens", "labels", "loss_mask"))
        assert a[i]["split"] == b[i]["split"]
    assert sum(not torch.equal(a[i]["tokens"], c[i]["tokens"]) for i in range(20)) >= 18


def test_masking_depends_on_the_corpus_not_its_folder(corpora, tmp_path, process_group):
    """The same files at another path (another job's scratch, pytest's numbered temp folders)
    give the same masked samples; another corpus under the same file name does not."""
    import shutil

    src = Path(corpora.prefixes[MAIN])
    moved = tmp_path / "elsewhere" / "deeper" / src.name
    moved.parent.mkdir(parents=True)
    for suffix in (".bin", ".idx"):
        shutil.copyfile(f"{src}{suffix}", f"{moved}{suffix}")
    impostor = tmp_path / "impostor" / src.name
    impostor.parent.mkdir()
    other = Path(corpora.prefixes[OTHER])
    for suffix in (".bin", ".idx"):
        shutil.copyfile(f"{other}{suffix}", f"{impostor}{suffix}")

    a = build(corpora, tmp_path / "a").train
    b = build(corpora, tmp_path / "b", blend=[[1.0, str(moved)]]).train
    c = build(corpora, tmp_path / "c", blend=[[1.0, str(impostor)]]).train
    for i in range(20):
        assert all(torch.equal(a[i][k], b[i][k]) for k in ("tokens", "labels", "loss_mask")), i
        assert a[i]["split"] == b[i]["split"]
    assert sum(a[i]["split"] != c[i]["split"] for i in range(20)) >= 15


def test_cached_indices_reload_identically(corpora, tmp_path, process_group):
    first = build(corpora, tmp_path).train
    again = build(corpora, tmp_path).train  # same cache dir: megatron loads the saved indices
    for i in range(10):
        assert torch.equal(first[i]["tokens"], again[i]["tokens"])


@pytest.mark.parametrize("dp_size", [1, 2])
def test_resume_at_consumed_samples_reproduces_the_uninterrupted_order(corpora, tmp_path, process_group, dp_size):
    ds = build(corpora, tmp_path, train_samples=96).train
    mb = 4
    uninterrupted = [[b for b in make_loader(ds, 0, mb, r, dp_size)] for r in range(dp_size)]
    consumed = 5 * mb * dp_size
    for rank in range(dp_size):
        resumed = list(make_loader(ds, consumed, mb, rank, dp_size))
        assert len(resumed) == len(uninterrupted[rank]) - 5
        for got, want in zip(resumed, uninterrupted[rank][5:]):
            assert all(torch.equal(got[k], want[k]) for k in want)
    # ranks together cover each global block exactly once
    seen = torch.cat([torch.stack([b["tokens"] for b in uninterrupted[r]]) for r in range(dp_size)])
    assert len({tuple(t.tolist()) for t in seen.view(-1, SEQ)}) == seen.view(-1, SEQ).shape[0]


def test_resume_rejects_a_misaligned_consumed_count(corpora, tmp_path, process_group):
    ds = build(corpora, tmp_path).train
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        make_loader(ds, 6, 4, 0, 1)


def test_blend_follows_weights_and_sources(corpora, tmp_path, process_group):
    ds = build(corpora, tmp_path, train_samples=1000,
               blend=[[0.7, corpora.prefixes[MAIN]], [0.3, corpora.prefixes[OTHER]]]).train
    ids = np.array([int(ds[i]["dataset_id"]) for i in range(1000)])
    assert abs((ids == 1).mean() - 0.3) < 0.01
    for start in range(0, 1000, 200):  # the blend interleaves; it does not front-load a corpus
        assert abs((ids[start:start + 200] == 1).mean() - 0.3) < 0.03
    for i in range(0, 60, 3):
        source, other = (MAIN, OTHER) if ids[i] == 0 else (OTHER, MAIN)
        assert comes_from(corpora, original_tokens(ds[i]), corpora.texts[source])
        assert not comes_from(corpora, original_tokens(ds[i]), corpora.texts[other])


def test_anneal_blend_takes_over_at_the_given_step(corpora, tmp_path, process_group):
    global_batch, anneal_step, steps = 8, 5, 9
    ds = build(corpora, tmp_path, train_samples=steps * global_batch,
               anneal_start_sample=anneal_step * global_batch,
               anneal_blend=[[1.0, corpora.prefixes[ANNEAL]]]).train
    total = steps * global_batch
    batches = list(make_loader(ds, 0, global_batch, total_samples=total))
    assert len(batches) == steps
    for step, batch in enumerate(batches):
        want_phase = int(step >= anneal_step)
        assert (batch["phase"] == want_phase).all()
        source = ANNEAL if want_phase else MAIN
        for row in range(0, global_batch, 2):
            sample = {k: batch[k][row] for k in ("tokens", "labels")}
            assert comes_from(corpora, original_tokens(sample), corpora.texts[source])
    resumed = list(make_loader(ds, 3 * global_batch, global_batch, total_samples=total))  # resume before the switch
    assert len(resumed) == steps - 3
    for got, want in zip(resumed, batches[3:]):
        assert torch.equal(got["tokens"], want["tokens"]) and torch.equal(got["phase"], want["phase"])


def test_valid_blend_uses_separate_corpora(corpora, tmp_path, process_group):
    ds = build(corpora, tmp_path, valid_samples=8, split=None,
               valid_blend=[corpora.prefixes[OTHER]])
    for i in range(8):
        assert comes_from(corpora, original_tokens(ds.valid[i]), corpora.texts[OTHER])


@pytest.mark.parametrize("variant", ["no_attn", "mlm"])
def test_variants_without_attention_mask_give_split_zero(corpora, tmp_path, process_group, variant):
    ds = build(corpora, tmp_path, objective={"variant": variant}).train
    batch = collate_masked_lm([ds[i] for i in range(16)])
    assert (batch["split"] == 0).all()
    frac = batch["loss_mask"].mean().item()
    assert (abs(frac - 0.15) < 0.01) if variant == "mlm" else frac > 0.1


@pytest.mark.timeout(60)
def test_split_leaving_a_set_empty_is_an_error_not_a_hang(corpora, tmp_path, process_group):
    with pytest.raises(ValueError, match="leaves a split empty.*valid gets 0 of 10 documents"):
        build(corpora, tmp_path, blend=[corpora.tiny_prefix], split="98,1,1", valid_samples=4)


def test_requesting_samples_from_a_zero_weight_split_is_an_error(corpora, tmp_path, process_group):
    with pytest.raises(ValueError, match="valid weight 0"):
        build(corpora, tmp_path, split="100,0,0", valid_samples=4)


def test_bad_data_configs_get_clear_errors(corpora, tmp_path, process_group):
    with pytest.raises(FileNotFoundError, match="PREFIX.bin"):
        build(corpora, tmp_path, blend=[str(tmp_path / "nope")])
    with pytest.raises(ValueError, match="weights must be > 0"):
        build(corpora, tmp_path, blend=[[0, corpora.prefixes[MAIN]], [1, corpora.prefixes[OTHER]]])
    with pytest.raises(ValueError, match="unknown ObjectiveConfig keys"):
        build(corpora, tmp_path, objective={"alpah": 0.1})
    with pytest.raises(ValueError, match="anneal_start_sample"):
        build(corpora, tmp_path, anneal_blend=[corpora.prefixes[ANNEAL]])


_NO_GROUP_SCRIPT = """
import dataclasses, json, sys
import numpy as np, torch
from megatron_biglm.data.pretrain_data import build_pretrain_datasets
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.objective import IGNORE_INDEX

prefix, ids, cache = json.loads(sys.argv[1])
assert not torch.distributed.is_initialized()

def build(cache_dir):
    config = {"blend": [[1.0, prefix]], "split": "90,5,5", "seq_length": %d, "seed": 1234, "cache_dir": cache_dir}
    return build_pretrain_datasets(config, token_ids=TokenIds(**ids), train_samples=64, valid_samples=0,
                                   test_samples=0)

try:
    build(cache)
except RuntimeError as exc:
    print("refused:", exc)
else:
    print("built with a cache and no process group")
sample = build(None).train  # without a cache dir megatron never synchronizes: no group needed
original = torch.where(sample[3]["labels"] != IGNORE_INDEX, sample[3]["labels"], sample[3]["tokens"])
print("uncached window matches:", torch.equal(original, torch.from_numpy(sample.window(3))))
""" % SEQ


def test_cache_dir_without_process_group_is_a_clear_error(corpora, tmp_path):
    """In a fresh interpreter: no process group another test left up can hide the refusal."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)}
    args = json.dumps([corpora.prefixes[MAIN], dataclasses.asdict(corpora.token_ids), str(tmp_path / "cache")])
    done = subprocess.run([sys.executable, "-c", _NO_GROUP_SCRIPT, args], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("refused:") and "single_process_group" in lines[0], done.stdout
    assert lines[-1] == "uncached window matches: True", done.stdout


def test_worker_processes_yield_the_same_batches(corpora, tmp_path, process_group):
    ds = build(corpora, tmp_path, train_samples=32).train
    in_process = list(make_loader(ds, 8, 4, total_samples=32))
    with_workers = list(make_loader(ds, 8, 4, num_workers=2, total_samples=32))
    assert len(with_workers) == len(in_process) == 6
    for got, want in zip(with_workers, in_process):
        assert all(torch.equal(got[k], want[k]) for k in want)
