"""WordNet for METEOR without a data hub: lay out Debian's WordNet 3.0 the way nltk reads it.

nltk's METEOR matches synonyms through WordNet, which nltk normally downloads from the web.
Our machines reach only package registries, but Debian's `wordnet-base` (data, index and
exception files) and `wordnet-sense-index` (`index.sense`) hold WordNet 3.0. nltk's reader
wants them under `<root>/corpora/wordnet/` plus a `lexnames` file that Debian ships only as a
man page, so `build_wordnet_dir` copies the files into a cache folder (copies, not links:
nltk's path sandbox resolves links and refuses targets outside its data roots) and writes
`lexnames` from the fixed WordNet 3.0 table (lexnames(5WN)). The cache root is added to
`nltk.data.path`, nltk's documented way to authorise a data folder.

    apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index
    python -m megatron_biglm.cli.fetch_data wordnet      # builds the layout, prints where

`wordnet_reader()` is what the METEOR metric calls: an explicit `$BIGLM_WORDNET_DIR`, else a
WordNet nltk already finds (e.g. after `nltk.download("wordnet")`), else the layout built from
/usr/share/wordnet on first use. When none exists it raises `WordNetUnavailable` naming the fix.
"""
from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

DEBIAN_WORDNET = Path("/usr/share/wordnet")
INSTALL_HINT = ("apt-get install -y --no-install-recommends wordnet-base wordnet-sense-index, "
                "then `python -m megatron_biglm.cli.fetch_data wordnet` (or set "
                "BIGLM_WORDNET_DIR to a folder holding corpora/wordnet, or run "
                "nltk.download('wordnet') where the web is reachable)")

#: The files nltk's WordNetCorpusReader opens (lexnames is generated, the rest are Debian's).
_DEBIAN_FILES = ("cntlist.rev", "index.sense", "index.adj", "index.adv", "index.noun",
                 "index.verb", "data.adj", "data.adv", "data.noun", "data.verb", "adj.exc",
                 "adv.exc", "noun.exc", "verb.exc")

#: WordNet 3.0 lexicographer files, number -> (name, syntactic category), per lexnames(5WN).
_LEXNAMES = (
    ("adj.all", 3), ("adj.pert", 3), ("adv.all", 4), ("noun.Tops", 1), ("noun.act", 1),
    ("noun.animal", 1), ("noun.artifact", 1), ("noun.attribute", 1), ("noun.body", 1),
    ("noun.cognition", 1), ("noun.communication", 1), ("noun.event", 1), ("noun.feeling", 1),
    ("noun.food", 1), ("noun.group", 1), ("noun.location", 1), ("noun.motive", 1),
    ("noun.object", 1), ("noun.person", 1), ("noun.phenomenon", 1), ("noun.plant", 1),
    ("noun.possession", 1), ("noun.process", 1), ("noun.quantity", 1), ("noun.relation", 1),
    ("noun.shape", 1), ("noun.state", 1), ("noun.substance", 1), ("noun.time", 1),
    ("verb.body", 2), ("verb.change", 2), ("verb.cognition", 2), ("verb.communication", 2),
    ("verb.competition", 2), ("verb.consumption", 2), ("verb.contact", 2),
    ("verb.creation", 2), ("verb.emotion", 2), ("verb.motion", 2), ("verb.perception", 2),
    ("verb.possession", 2), ("verb.social", 2), ("verb.stative", 2), ("verb.weather", 2),
    ("adj.ppl", 3),
)


class WordNetUnavailable(RuntimeError):
    """No WordNet could be found or built; the message names the install command."""


def default_cache_root() -> Path:
    """`$XDG_CACHE_HOME/megatron_biglm/nltk_data` (the nltk_data root we build)."""
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "megatron_biglm" / "nltk_data"


def build_wordnet_dir(nltk_data_root: Path | None = None, source: Path = DEBIAN_WORDNET) -> Path:
    """Create `<nltk_data_root>/corpora/wordnet` from Debian's files (copied, ~30 MB) plus
    `lexnames`; return `nltk_data_root`. Idempotent: `lexnames` is written last, so its
    presence marks a complete folder. Raises WordNetUnavailable when `source` lacks files."""
    root = Path(nltk_data_root) if nltk_data_root else default_cache_root()
    source = Path(source)
    missing = [name for name in _DEBIAN_FILES if not (source / name).is_file()]
    if missing:
        raise WordNetUnavailable(f"WordNet files missing in {source}: {', '.join(missing)}. "
                                 f"Fix: {INSTALL_HINT}")
    target = root / "corpora" / "wordnet"
    if (target / "lexnames").is_file():
        return root
    target.mkdir(parents=True, exist_ok=True)
    for name in _DEBIAN_FILES:
        tmp = target / (name + ".part")
        shutil.copyfile(source / name, tmp)
        os.replace(tmp, target / name)
    lines = [f"{i:02d}\t{name}\t{category}\n" for i, (name, category) in enumerate(_LEXNAMES)]
    (target / "lexnames").write_text("".join(lines), encoding="utf-8")
    return root


def reader_at(corpus_dir: Path):
    import nltk  # lazy: optional (eval extra)
    from nltk.corpus.reader.wordnet import WordNetCorpusReader  # lazy: optional (eval extra)

    data_root = str(Path(corpus_dir).resolve().parent.parent)
    if data_root not in nltk.data.path:
        nltk.data.path.append(data_root)  # nltk's sandbox only opens files under its data path

    with warnings.catch_warnings():  # "multilingual functions are not available": not needed
        warnings.simplefilter("ignore", UserWarning)
        return WordNetCorpusReader(str(corpus_dir), None)


def wordnet_reader(*, build: bool = True):
    """A loaded nltk WordNetCorpusReader (see the module docstring for the search order)."""
    env = os.environ.get("BIGLM_WORDNET_DIR")
    if env:
        corpus = Path(env) / "corpora" / "wordnet"
        if not (corpus / "lexnames").is_file():
            raise WordNetUnavailable(f"BIGLM_WORDNET_DIR={env} has no corpora/wordnet/lexnames. "
                                     f"Fix: {INSTALL_HINT}")
        return reader_at(corpus)
    cached = default_cache_root() / "corpora" / "wordnet"
    if (cached / "lexnames").is_file():
        return reader_at(cached)
    try:  # a WordNet nltk itself finds (nltk.download, a folder or zip on its data path)
        import nltk  # lazy: optional (eval extra)

        nltk.data.find("corpora/wordnet")
        from nltk.corpus import wordnet  # lazy: optional (eval extra)

        wordnet.ensure_loaded()
        return wordnet
    except LookupError:
        pass
    if build and DEBIAN_WORDNET.is_dir():
        return reader_at(build_wordnet_dir() / "corpora" / "wordnet")
    raise WordNetUnavailable(f"METEOR needs WordNet, and none was found. Fix: {INSTALL_HINT}")
