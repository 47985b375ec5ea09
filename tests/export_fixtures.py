"""For the tests that load an export in a fresh interpreter: the prelude of such a script,
which makes importing our packages (megatron_biglm, patches, megatron) fail, so that the
export is shown to load without them."""
from __future__ import annotations

BLOCK_OUR_PACKAGES = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("megatron_biglm", "patches", "megatron"):
            raise ImportError(f"{name} is blocked: the export must load without it")
sys.meta_path.insert(0, Block())
"""
