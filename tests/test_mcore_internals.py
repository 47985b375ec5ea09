"""Each private megatron-core member the project wraps (common/mcore_internals.py), pinned
against megatron-core's public behaviour on the installed release."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset

from dataset_fixtures import corpora, process_group  # noqa: F401  (fixtures)
from megatron_biglm.common.mcore_internals import UnsupportedMegatronCore, gpt_sample_tokens, mcore_version
from megatron_biglm.data.pretrain_data import build_pretrain_datasets


def test_query_document_sample_shuffle_indices_gives_the_public_sample_tokens(corpora, tmp_path, process_group):
    """GPTDataset._query_document_sample_shuffle_indices: its tokens are what the public
    GPTDataset.__getitem__ returns as `tokens` for the same sample (no extra token, full windows)."""
    prefix = next(iter(corpora.prefixes.values()))
    config = {"blend": [[1.0, prefix]], "split": "100,0,0", "seq_length": 96, "seed": 3,
              "cache_dir": str(tmp_path / "cache")}
    train = build_pretrain_datasets(config, token_ids=corpora.token_ids, train_samples=24,
                                    valid_samples=0, test_samples=0).train
    assert isinstance(train, GPTDataset)  # one corpus: megatron returns it unblended
    for idx in range(24):
        ours = gpt_sample_tokens(train, idx)
        public = GPTDataset.__getitem__(train, idx)["tokens"]
        assert ours.dtype == np.int64 and ours.shape == (96,)
        assert torch.equal(torch.from_numpy(ours), public), idx


class _Changed:
    """A dataset whose private lookup returns a shape no supported release returns."""

    def __init__(self, result):
        self.result = result

    def _query_document_sample_shuffle_indices(self, idx):
        return self.result


@pytest.mark.parametrize("result", [(np.arange(4), [0], [4], "new"), {"tokens": np.arange(4)},
                                    (np.arange(8).reshape(2, 4), [0])])
def test_an_unknown_return_shape_names_the_member_and_the_tested_releases(result):
    with pytest.raises(UnsupportedMegatronCore, match=r"_query_document_sample_shuffle_indices.*tested on 0\.16\.1"):
        gpt_sample_tokens(_Changed(result), 0)


def test_version_reads_the_installed_release():
    from importlib.metadata import version

    assert ".".join(map(str, mcore_version())) == ".".join(version("megatron-core").split(".")[:3])


WRITER_PROBE = """
import json, multiprocessing, os, signal, time
from megatron.core.dist_checkpointing.strategies import filesystem_async
from megatron_biglm.common.mcore_internals import start_checkpoint_writer_queue
got = []
signal.signal(signal.SIGUSR1, lambda *_: got.append("USR1"))
start_checkpoint_writer_queue()
children = multiprocessing.active_children()
for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGINT):
    for child in children:
        os.kill(child.pid, sig)
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.5)
queue = (getattr(filesystem_async, "get_write_results_queue", None)
         or getattr(filesystem_async, "_get_write_results_queue"))()
alive = [child.is_alive() for child in children]
queue.put("still serving")
print(json.dumps({"alive": alive, "served": queue.get(timeout=10), "got": got}))
"""


def test_the_checkpoint_writer_server_outlives_the_signals_a_scheduler_sends():
    """SLURM signals every process of a job step; the writer's Manager server must survive them
    (or the save they ask for fails), while the trainer still receives them. In a fresh process:
    the server starts on the first save."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", WRITER_PROBE], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["alive"] and all(out["alive"]) and out["served"] == "still serving"
    assert out["got"] == ["USR1"]  # the caller's own handler is untouched
