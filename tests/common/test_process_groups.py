"""common/process_groups.py: who creates a group destroys it, and nobody else does.

Runs in a fresh interpreter: the pytest process may already hold a group (module fixtures
keep theirs), and these checks are about creating one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

_SCRIPT = textwrap.dedent("""
    import json
    import torch.distributed as dist
    from megatron_biglm.common.process_groups import (destroy, init_default_group,
                                                      single_process_group)

    out = {}
    with single_process_group():
        out["inside"] = (dist.is_initialized(), dist.get_world_size(), dist.get_backend())
        with single_process_group():  # nested: uses the outer group, must not destroy it
            pass
        out["after_nested"] = dist.is_initialized()
    out["after_outer"] = dist.is_initialized()
    out["created"] = init_default_group("gloo")
    out["created_again"] = init_default_group("gloo")
    with single_process_group():
        pass
    out["kept_by_context"] = dist.is_initialized()
    destroy(created_group=out["created"])
    out["destroyed"] = not dist.is_initialized()
    print(json.dumps(out))
""")


def test_groups_are_created_once_and_destroyed_only_by_their_creator():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"inside": [True, 1, "gloo"], "after_nested": True, "after_outer": False,
                   "created": True, "created_again": False, "kept_by_context": True,
                   "destroyed": True}


_REBUILD_SCRIPT = textwrap.dedent("""
    import json
    import psutil
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron_biglm.common.process_groups import destroy, init_default_group, init_model_parallel

    init_default_group("gloo")  # kept for the whole process, like a test session's
    mine = dist.new_group([0])  # a group the user made: not megatron's, must survive
    live = lambda: len(dist.distributed_c10d._world.pg_map)
    out = {"groups_before": live(), "threads": []}
    for tp_pp in [(1, 1), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1)]:
        init_model_parallel(*tp_pp)
        out["groups_megatron"] = live()
        t = torch.ones(2)
        dist.all_reduce(t, group=parallel_state.get_data_parallel_group())
        destroy(created_group=False)
        out["threads"].append(psutil.Process().num_threads())
    out["groups_after"] = live()
    t = torch.ones(1)
    dist.all_reduce(t, group=mine)
    out["mine_works"] = t.item() == 1.0
    out["default_kept"] = dist.is_initialized()
    print(json.dumps(out))
""")


def test_rebuilding_megatron_groups_frees_the_torch_groups_and_their_threads():
    """megatron's destroy_model_parallel only forgets its groups; torch keeps them, and every
    gloo group keeps ~3 polling threads. Under one long-lived default group (a test session,
    a sweep) each init would leak ~17 groups and ~50 threads."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", _REBUILD_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["groups_megatron"] > out["groups_before"] + 5  # megatron did make its groups
    assert out["groups_after"] == out["groups_before"]  # ... and they are gone
    assert out["mine_works"] and out["default_kept"]
    threads = out["threads"]
    assert threads[-1] - threads[0] <= 5, threads  # without the fix: +~50 per rebuild
