"""Export a fine-tuned head run to HF and compare our logits with plain transformers' in a
fresh process where our packages cannot be imported (`export_fixtures.BLOCK_OUR_PACKAGES`)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from export_fixtures import BLOCK_OUR_PACKAGES

HF_SCRIPT = BLOCK_OUR_PACKAGES + r"""
import json, sys, torch, transformers
folder, cls, batch = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
model = getattr(transformers, cls).from_pretrained(folder).eval()
ids = torch.tensor(batch["tokens"]); lengths = torch.tensor(batch["lengths"])
mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
with torch.no_grad():
    logits = model(input_ids=ids, attention_mask=mask).logits
labels = [model.config.id2label[int(i)] for i in logits.argmax(-1).flatten()]
print(json.dumps({"logits": logits.tolist(), "architectures": model.config.architectures,
                  "id2label": model.config.id2label, "argmax_labels": labels}))
"""


def export_and_compare(run: Path, out: Path, batch: dict, hf_class: str) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(our logits, HF logits, what HF read: its `id2label` and the label name of every argmax)
    for `batch` (tokens [b, s], valid_lengths [b]) after exporting the run's best checkpoint to
    `out`."""
    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.inference.loading import load_megatron_checkpoint

    best = run / "checkpoints" / (run / "checkpoints" / "best").read_text().strip()
    to_hf(best, out, progress=False)
    assert json.loads((out / "config.json").read_text())["architectures"] == [hf_class]
    loaded = load_megatron_checkpoint(best)
    with torch.no_grad():
        ours = loaded.model(batch["tokens"], split=None, valid_lengths=batch["valid_lengths"]).float()
    spec = out / "batch.json"
    spec.write_text(json.dumps({"tokens": batch["tokens"].tolist(), "lengths": batch["valid_lengths"].tolist()}))
    done = subprocess.run([sys.executable, "-c", HF_SCRIPT, str(out), hf_class, str(spec)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    return ours, torch.tensor(read["logits"]), {k: read[k] for k in ("id2label", "argmax_labels")}
