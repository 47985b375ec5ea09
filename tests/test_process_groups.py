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

REPO = Path(__file__).resolve().parents[1]

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
