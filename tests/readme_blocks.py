"""README.md read as the tests see it: its fenced command blocks with the marker before each,
and every command it names (in blocks and in inline code).

A marker is an HTML comment right before a ```bash, ```python or ```yaml block (GitHub does not
render it):

    <!-- readme-test: run -->                      run as written
    <!-- readme-test: run with overrides           run after these changes, in order:
    inputs: corpus, reviews                        files a user brings, written by the test first
    replace: OLD => NEW                            text replaced in the block
    skip: TEXT => REASON                           commands containing TEXT are not run
    write: FILE                                    (yaml) the block is saved as FILE
    then: COMMAND                                  (yaml) a command the block's comment names
    -->
    <!-- readme-test: not run: REASON -->          GPU, SLURM, hub, installs: with the reason

`tests/test_readme_commands.py` checks the markers and every command's name and flags;
`tests/test_readme_runs.py` (slow) runs the blocks in order.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
RUN_LANGUAGES = ("bash", "python", "yaml")
VERDICTS = ("run", "run with overrides", "not run")
DIRECTIVES = ("inputs", "replace", "skip", "write", "then")

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"<!--\s*readme-test:(.*?)-->", re.S)


@dataclass
class Block:
    line: int                     # 1-based line of the opening fence
    language: str
    text: str
    verdict: str | None = None    # one of VERDICTS, None: no marker
    reason: str = ""              # of a `not run` block
    inputs: list[str] = field(default_factory=list)
    replace: list[tuple[str, str]] = field(default_factory=list)
    skip: list[tuple[str, str]] = field(default_factory=list)
    write: str | None = None
    then: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what is wrong with the marker

    @property
    def runs(self) -> bool:
        return self.verdict in ("run", "run with overrides")

    def prepared(self) -> str:
        """The block's text with the marker's replacements applied, in order."""
        text = self.text
        for old, new in self.replace:
            if old not in text:
                raise AssertionError(f"README line {self.line}: the marker replaces {old!r}, "
                                     "which the block does not hold")
            text = text.replace(old, new)
        return text

    def commands(self) -> list[tuple[str, str | None]]:
        """The block's shell commands after the replacements (continuations joined, comments
        dropped), each with the reason it is skipped or None."""
        out = []
        for command in shell_commands(self.prepared()):
            reason = next((why for text, why in self.skip if text in command), None)
            out.append((command, reason))
        return out


def _parse_marker(block: Block, body: str) -> None:
    lines = [line.strip() for line in body.strip().splitlines() if line.strip()]
    head = lines[0] if lines else ""
    if head.startswith("not run"):
        block.verdict, block.reason = "not run", head[len("not run"):].lstrip(" :")
        if not block.reason:
            block.problems.append("`not run` without a reason")
    elif head in ("run", "run with overrides"):
        block.verdict = head
    else:
        block.problems.append(f"unknown verdict {head!r} (expected one of {', '.join(VERDICTS)})")
    for line in lines[1:]:
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "inputs":
            block.inputs += [v.strip() for v in value.split(",") if v.strip()]
        elif key in ("replace", "skip"):
            old, sep, new = value.partition(" => ")
            if not sep:
                block.problems.append(f"`{key}:` needs `TEXT => ...`: {line!r}")
            getattr(block, key).append((old, "" if new == "''" else new))
        elif key == "write":
            block.write = value
        elif key == "then":
            block.then.append(value)
        else:
            block.problems.append(f"unknown directive {key!r} (expected one of {', '.join(DIRECTIVES)})")
    overridden = bool(block.replace or block.skip or block.inputs)
    if block.verdict == "run" and overridden:
        block.problems.append("a block with replace/skip/inputs is `run with overrides`")
    if block.verdict == "run with overrides" and not overridden:
        block.problems.append("`run with overrides` names no override")


def read_blocks(path: Path = README) -> list[Block]:
    """Every fenced block, with the marker (if any) in the lines before it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        block = Block(start + 1, fence.group(1), "\n".join(lines[start + 1:i]) + "\n")
        before = "\n".join(lines[max(0, start - 12):start])
        markers = list(_MARKER.finditer(before))
        if markers and not before[markers[-1].end():].strip():  # the marker ends right above the fence
            _parse_marker(block, markers[-1].group(1))
        blocks.append(block)
        i += 1
    return blocks


def shell_commands(text: str) -> list[str]:
    """The shell commands of a block: backslash continuations joined, comment lines and
    trailing `# ...` comments dropped."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        line = _strip_comment(line)
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((pending + line).strip())
        pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def _strip_comment(line: str) -> str:
    """The line without a trailing ` # comment` outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


# ------------------------------------------------------------------ commands named in the text

@dataclass(frozen=True)
class Mention:
    """A command the README names: kind `module` (python -m megatron_biglm.cli.NAME), `script`
    (biglm-NAME), `tool` (tools/NAME.py) or `launch` (launch/NAME.sh); the words after it up to
    the end of the command; the environment variables set before it; where it was found."""
    kind: str
    name: str
    words: tuple[str, ...]
    env: tuple[str, ...]
    where: str

    @property
    def flags(self) -> list[str]:
        return sorted({w.split("=", 1)[0] for w in self.words if re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", w)})

    @property
    def subcommand(self) -> str | None:
        first = self.words[0] if self.words else ""
        return first if re.fullmatch(r"[a-z][a-z0-9-]*", first) else None


_COMMAND_START = re.compile(
    r"(?:-m\s+megatron_biglm\.cli\.(?P<module>[a-z_][a-z0-9_]*)(?![\w.]))|(?<![\w./-])(?P<script>biglm-[a-z0-9-]+)(?![\w-])"
    r"|(?P<tool>tools/\w+\.py)|(?P<launch>launch/\w+\.sh)")
_END = re.compile(r"\s(?:\||&&|;|#)\s|`|$")


def _words(rest: str) -> list[str]:
    rest = re.sub(r"\[([^\[\]]*)\]", r"\1", rest)  # optional parts: [--steps 300] -> --steps 300
    try:
        return shlex.split(rest)
    except ValueError:
        return rest.split()


def mentions_in(text: str, where: str) -> list[Mention]:
    out = []
    for match in _COMMAND_START.finditer(text):
        kind = match.lastgroup
        name = match.group(kind)
        if kind == "module":
            name = match.group("module")
        elif kind in ("tool", "launch"):
            name = Path(name).stem
        else:
            name = name
        rest = text[match.end():]
        rest = rest[:_END.search(rest).start()]
        head = text[:match.start()].rsplit("\n", 1)[-1]
        env = tuple(re.findall(r"(?:^|\s)([A-Z][A-Z0-9_]*)=", head))
        out.append(Mention(kind, name, tuple(_words(rest)), env, where))
    return out


def mentions(path: Path = README) -> list[Mention]:
    """Every command named in the README: in its shell blocks (one logical command at a time)
    and in inline code spans of the prose."""
    out = []
    blocks = read_blocks(path)
    for block in blocks:
        if block.language == "bash":
            for command in shell_commands(block.text):
                out += mentions_in(command, f"README line {block.line}: {command[:80]}")
        if block.language in ("bash", "yaml"):  # commands named in comments (`# or: biglm-finetune ...`)
            for line in block.text.splitlines():
                comment = line[len(_strip_comment(line)):].strip()
                if comment:
                    out += mentions_in(comment, f"README line {block.line}: {comment[:80]}")
    prose = _without_blocks(path.read_text(encoding="utf-8"))
    for number, line in enumerate(prose.splitlines(), start=1):
        for span in re.findall(r"`([^`]+)`", line):
            out += mentions_in(span, f"README line {number}: `{span[:80]}`")
    return out


def _without_blocks(text: str) -> str:
    """The README with fenced blocks blanked (line numbers kept)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            out.append("")
            continue
        out.append("" if inside else line)
    return "\n".join(out)
