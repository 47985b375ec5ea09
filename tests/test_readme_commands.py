"""Every command README.md names exists, and takes every flag the README passes to it.

Commands are `python -m megatron_biglm.cli.NAME` (also under torchrun), the console scripts
`biglm-NAME` (setup.py), `tools/NAME.py` and `launch/NAME.sh`, found in the command blocks and
in inline code. A flag counts when the command's own `--help` (its subcommand's, for
`convert to-hf` and the like) shows it; `--help` runs in-process for `cli/` modules. Each
command block carries a marker saying whether the slow README test runs it
(tests/fixtures/readme_blocks.py has the format), and the markers are checked here.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

from readme_blocks import README, RUN_LANGUAGES, mentions, read_blocks
from readme_inputs import INPUTS

ROOT = README.parent


def _console_scripts() -> dict[str, str]:
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    return dict(re.findall(r'"(biglm-[\w-]+)=megatron_biglm\.cli\.(\w+):main"', setup))


@lru_cache(maxsize=None)
def _module_help(module: str, subcommand: str | None) -> str:
    """`--help` of a cli module (and of its subcommand), run in-process."""
    main = importlib.import_module(f"megatron_biglm.cli.{module}").main
    argv = [subcommand, "--help"] if subcommand else ["--help"]
    out, saved_argv = io.StringIO(), sys.argv[:]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            main(argv)
    except SystemExit:
        pass
    finally:
        sys.argv = saved_argv
    return out.getvalue()


def _has_subcommand(module: str, word: str) -> bool:
    return re.search(rf"[{{,]{re.escape(word)}[,}}]", _module_help(module, None)) is not None


def _help_of(mention) -> str:
    module = mention.name if mention.kind == "module" else _console_scripts()[mention.name]
    text = _module_help(module, None)
    sub = mention.subcommand
    if sub and _has_subcommand(module, sub):
        text += _module_help(module, sub)
    return text


@lru_cache(maxsize=None)
def _tool_help(name: str) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "tools" / f"{name}.py"), "--help"],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, f"tools/{name}.py --help exited {result.returncode}:\n{result.stderr[-2000:]}"
    return result.stdout


def _flag_shown(flag: str, help_text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text) is not None


MENTIONS = mentions()


def test_the_readme_names_commands_of_every_kind():
    kinds = {m.kind for m in MENTIONS}
    assert {"module", "script", "launch"} <= kinds, kinds
    assert len({m.name for m in MENTIONS if m.kind == "module"}) >= 15


@pytest.mark.parametrize("mention", MENTIONS, ids=lambda m: f"{m.kind}:{m.name}:{m.where.split(':')[0]}")
def test_each_command_exists_and_takes_its_flags(mention):
    where = mention.where
    if mention.kind == "module":
        assert (ROOT / "megatron_biglm" / "cli" / f"{mention.name}.py").is_file(), \
            f"{where}: megatron_biglm.cli.{mention.name} does not exist"
    elif mention.kind == "script":
        assert mention.name in _console_scripts(), \
            f"{where}: {mention.name} is not a console script in setup.py ({sorted(_console_scripts())})"
    elif mention.kind == "tool":
        assert (ROOT / "tools" / f"{mention.name}.py").is_file(), f"{where}: tools/{mention.name}.py does not exist"
    else:
        script = ROOT / "launch" / f"{mention.name}.sh"
        assert script.is_file(), f"{where}: launch/{mention.name}.sh does not exist"
        text = script.read_text(encoding="utf-8") + (ROOT / "launch" / "common.sh").read_text(encoding="utf-8")
        unknown = [v for v in mention.env if v not in text]
        assert not unknown, f"{where}: launch/{mention.name}.sh reads no {unknown}"
        missing = [f for f in mention.flags if f not in text]
        assert not missing, f"{where}: launch/{mention.name}.sh takes no {missing}"
        return
    help_text = _tool_help(mention.name) if mention.kind == "tool" else _help_of(mention)
    missing = [f for f in mention.flags if not _flag_shown(f, help_text)]
    assert not missing, f"{where}: {mention.name} --help shows no {missing}"


def test_every_command_block_is_marked():
    """Each bash/python/yaml block says whether the README test runs it, with what overrides,
    or why not; replacements name text the block holds; inputs are ones the test writes."""
    blocks = [b for b in read_blocks() if b.language in RUN_LANGUAGES]
    assert len(blocks) >= 20
    problems = []
    for block in blocks:
        if block.verdict is None:
            problems.append(f"README line {block.line}: a ```{block.language} block without a readme-test marker")
            continue
        problems += [f"README line {block.line}: {p}" for p in block.problems]
        problems += [f"README line {block.line}: unknown input {name!r} (known: {sorted(INPUTS)})"
                     for name in block.inputs if name not in INPUTS]
        try:
            prepared = block.prepared() if block.runs else block.text
        except AssertionError as exc:
            problems.append(str(exc))
            continue
        problems += [f"README line {block.line}: `then: {c}` is not in the block" for c in block.then
                     if c not in prepared]
        if block.runs and block.language == "yaml" and not block.write:
            problems.append(f"README line {block.line}: a yaml block that runs needs `write: FILE`")
    assert not problems, "\n".join(problems)


def test_a_flag_missing_from_help_is_caught():
    """The check above can fail: a flag the command does not take is reported."""
    from readme_blocks import mentions_in

    (bad,) = mentions_in("python -m megatron_biglm.cli.plot_curves runs/x --outfile c.png", "here")
    assert bad.flags == ["--outfile"] and not _flag_shown("--outfile", _help_of(bad))
    (good,) = mentions_in("python -m megatron_biglm.cli.convert to-hf --checkpoint c --no-verify", "here")
    assert all(_flag_shown(f, _help_of(good)) for f in good.flags) and good.subcommand == "to-hf"
