"""Damage a saved checkpoint the way storage does, for the verifier and fault-matrix tests:
zero 64 bytes inside one stored item (located through the DCP metadata, so the file size
and the manifest stay valid)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from train_fixtures import tiny_overrides, train_data  # noqa: F401  (fixture)

#: The item kinds the acceptance tests corrupt: a model weight and an optimizer-state tensor.
ITEMS = {"model weight": "embedding.word_embeddings.weight",
         "optimizer state": "optimizer.state.exp_avg.embedding.word_embeddings.weight"}


def zero_bytes_in_item(iter_dir, item_prefix: str, count: int = 64) -> tuple[str, str]:
    """Zero `count` bytes in the middle of the first stored item whose name starts with
    `item_prefix`; return (its file name, its item name)."""
    from megatron_biglm.checkpoint.checksums import dist_items

    dist = Path(iter_dir) / "dist"
    relative, offset, length, name = next(i for i in dist_items(dist) if i[3].startswith(item_prefix))
    with open(dist / relative, "r+b") as handle:
        handle.seek(offset + length // 2)
        old = handle.read(count)
        assert old != bytes(count), "the chosen bytes are already zero"
        handle.seek(offset + length // 2)
        handle.write(bytes(count))
    return relative, name


@pytest.fixture(scope="session")
def saved_run(train_data, tmp_path_factory):  # noqa: F811  (train_data: a fixture)
    """A tiny run trained 4 steps with checkpoints at steps 2 and 4: (its checkpoint root,
    the data it trained on). Tests copy the root before damaging it."""
    from megatron_biglm.cli.train import train

    run = tmp_path_factory.mktemp("saved_run")
    train(None, tiny_overrides(train_data, run, steps=4, **{"checkpoint.save_interval": 2}))
    return run / "checkpoints", train_data


def damaged_copy(saved_run, dest: Path, item_prefix: str | None = ITEMS["model weight"]) -> tuple[Path, str, str]:
    """A copy of the saved run's checkpoint root whose latest (iter_0000004) has one item
    zeroed (none when `item_prefix` is None): (root, damaged file, item name)."""
    root = dest / "checkpoints"
    shutil.copytree(saved_run[0], root)
    if item_prefix is None:
        return root, "", ""
    file, item = zero_bytes_in_item(root / "iter_0000004", item_prefix)
    return root, file, item


def zero_bytes_in_archive(path, count: int = 64) -> str:
    """Zero `count` bytes inside the largest entry of a `torch.save` file (e.g. a DeepSpeed
    ZeRO shard); return the entry's name."""
    import zipfile

    with zipfile.ZipFile(path) as archive:
        entry = max(archive.infolist(), key=lambda e: e.compress_size)
    with open(path, "r+b") as handle:  # the entry's data lies after its local header (30 bytes + name + extra)
        handle.seek(entry.header_offset + 30 + len(entry.filename.encode()) + len(entry.extra) + 64)
        handle.write(bytes(count))
    return entry.filename


@pytest.fixture(autouse=False)
def own_process_group():
    """Tear down a process group the test's loads created (evaluation and the weights-only load
    set one up), so the tests after it start without one, as they would alone."""
    import torch.distributed as dist

    from megatron_biglm.common.process_groups import destroy

    existed = dist.is_initialized()
    yield
    if not existed:
        destroy(created_group=True)
