"""The house keeps its shape: packages import only from lower floors, and nothing imports in a circle.

Why a test: the floors in ARCHITECTURE.md are what lets generation, fine-tuning and retrieval
land without reaching across the tree. Every import counts, including the lazy ones inside
functions (a lazy import hides a circle; it does not remove it).
"""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "megatron_biglm"

# The floors of ARCHITECTURE.md. A package may import its own modules, and packages of a
# lower floor; on the same floor only the pairs listed in SAME_FLOOR, in that direction.
FLOORS = {
    "common": 0,
    "checkpoint": 1, "objective": 1, "patches": 1,
    "model": 2, "data": 2, "config": 2,
    "inference": 3, "training": 3,
    "export": 4, "evaluation": 4, "generation": 4, "planner": 4,
    "finetune": 5,
    "run": 6,
    "experiments": 7,
    "serving": 7,
    "cli": 8,
}
TOP = max(FLOORS.values())
SAME_FLOOR = {
    ("checkpoint", "patches"),                 # the distributed-optimizer checkpoint fixes
    ("config", "model"), ("config", "data"),   # the run config composes their typed sections
    ("evaluation", "generation"),              # lm-eval's generate_until drives the generator
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every megatron_biglm module this file imports, at any depth of the file."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import x` depends on the submodule x when there is one, else on pkg.
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                where = PACKAGE.parent / candidate.replace(".", "/")
                found.add(candidate if where.with_suffix(".py").exists() or (where / "__init__.py").exists()
                          else target)
    return {name for name in found if name == "megatron_biglm" or name.startswith("megatron_biglm.")}


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported in _imports(path):
            # the longest existing module that the import names
            while imported not in modules and "." in imported:
                imported = imported.rpartition(".")[0]
            if imported in modules and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_import_names_a_module_that_exists():
    """A lazy import of a module that moved away fails only when its line runs (a server's chat
    endpoint, a command's rare branch): every `megatron_biglm` import, at any depth of any file
    (the tests' too), must name an existing module or package."""
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    files = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "tests").rglob("*.py"),
             *(PACKAGE.parent / "benchmarks").rglob("*.py"), *(PACKAGE.parent / "tools").rglob("*.py")]
    missing = []
    for path in files:
        for imported in _imports(path):
            if imported not in modules:
                missing.append(f"{path.relative_to(PACKAGE.parent)} imports {imported}, which does not exist")
    assert not missing, "\n".join(sorted(missing))


def test_every_package_has_a_floor():
    graph = _graph()
    unknown = sorted({_package(m) for m in graph if _package(m) and _package(m) not in FLOORS})
    assert not unknown, f"packages without a floor in ARCHITECTURE.md / this test: {unknown}"


def test_no_import_goes_up_or_sideways():
    bad = []
    for module, targets in _graph().items():
        a = _package(module)
        for target in targets:
            b = _package(target)
            if a is None or b is None or a == b:
                continue
            top = FLOORS[a] == FLOORS[b] == TOP  # entry points may call each other
            if FLOORS[b] > FLOORS[a] or (FLOORS[b] == FLOORS[a] and (a, b) not in SAME_FLOOR and not top):
                bad.append(f"{module} -> {target} (floor {FLOORS[a]} -> {FLOORS[b]})")
    assert not bad, "imports against the floors of ARCHITECTURE.md:\n" + "\n".join(sorted(bad))


def test_no_file_imports_in_a_circle():
    assert not _cycles(_graph()), "import circles between files (lazy imports count)"


def test_no_package_imports_in_a_circle():
    packages = defaultdict(set)
    for module, targets in _graph().items():
        a = _package(module)
        for target in targets:
            b = _package(target)
            if a and b and a != b:
                packages[a].add(b)
    assert not _cycles(dict(packages))


def _folder(module: str) -> str:
    """The folder (package or sub-package) a module sits in: itself for an `__init__`."""
    path = PACKAGE.parent / module.replace(".", "/")
    return module if (path / "__init__.py").is_file() else module.rpartition(".")[0]


def _folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    folders = defaultdict(set)
    for module, targets in graph.items():
        for target in targets:
            if _folder(module) != _folder(target):
                folders[_folder(module)].add(_folder(target))
    return dict(folders)


def test_no_folder_imports_in_a_circle():
    """Sub-packages too (`finetune/tasks` and `finetune/kinds`, a package and its sub-packages):
    two folders that import each other, even through different files, are one concept split in
    two, and the file-level check cannot see it."""
    circles = _cycles(_folder_graph(_graph()))
    assert not circles, f"folders importing each other (lazy imports count): {circles}"


def test_a_folder_circle_through_different_files_is_found():
    graph = {"megatron_biglm.finetune.kinds.span": {"megatron_biglm.finetune.tasks.squad_windows"},
             "megatron_biglm.finetune.tasks.task": {"megatron_biglm.finetune.kinds"},
             "megatron_biglm.finetune.tasks.squad_windows": set(), "megatron_biglm.finetune.kinds": set()}
    assert not _cycles(graph)  # no file circle
    assert _cycles(_folder_graph(graph)) == [["megatron_biglm.finetune.kinds", "megatron_biglm.finetune.tasks"]]


@pytest.mark.parametrize("source, expected", [
    ("from megatron_biglm.model import presets\n", {"megatron_biglm.model.presets"}),
    ("from megatron_biglm.model import load_preset\n", {"megatron_biglm.model"}),
    ("def f():\n    from ..data import tokenizer\n", {"megatron_biglm.data.tokenizer"}),
    ("import megatron_biglm.objective.apply as a\n", {"megatron_biglm.objective.apply"}),
])
def test_the_import_reader_sees_lazy_and_relative_imports(tmp_path, source, expected, monkeypatch):
    """The checks above are only as good as the reader: it must see imports inside functions
    and resolve relative ones."""
    target = PACKAGE / "training" / "_architecture_probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source)
    assert expected <= _imports(target)


def test_a_circle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_command_lives_in_cli_with_a_console_script():
    """The entry points sit in one folder: each `cli/` module has `main` and a `biglm-*`
    console script in setup.py, each console script names a `cli/` module's `main`, and no
    package below `cli/` has a `__main__` or a `cli*` module of its own."""
    import importlib
    import re

    setup = (PACKAGE.parent / "setup.py").read_text(encoding="utf-8")
    scripts = dict(re.findall(r'"(biglm-[\w-]+)=(megatron_biglm\.[\w.]+:main)"', setup))
    commands = {p.stem for p in (PACKAGE / "cli").glob("*.py") if p.stem != "__init__"}
    targets = {target.split(":")[0].rpartition(".")[2] for target in scripts.values()}
    assert all(t.startswith("megatron_biglm.cli.") for t in scripts.values()), scripts
    assert targets == commands, f"cli modules without a console script: {sorted(commands - targets)}; " \
                                f"scripts without a cli module: {sorted(targets - commands)}"
    assert len(commands) >= 19
    # the one naming rule: cli.NAME is biglm-NAME, underscores as hyphens; any other name is an alias
    for name in commands:
        script = "biglm-" + name.replace("_", "-")
        assert scripts.get(script) == f"megatron_biglm.cli.{name}:main", f"cli/{name}.py needs the script {script}"
    documented = (PACKAGE / "cli" / "__init__.py").read_text(encoding="utf-8")
    for alias in set(scripts) - {"biglm-" + name.replace("_", "-") for name in commands}:
        assert re.search(rf"\balias {alias}\b", documented), f"alias {alias} is not listed in cli/__init__.py"
    for name in sorted(commands):
        assert callable(importlib.import_module(f"megatron_biglm.cli.{name}").main), name
        # `python -m megatron_biglm.cli.NAME` runs main (without the block it exits 0, doing nothing)
        tree = ast.parse((PACKAGE / "cli" / f"{name}.py").read_text(encoding="utf-8"))
        guards = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
        assert guards and "main(" in ast.unparse(guards[-1]), f"cli/{name}.py has no `if __name__ == \"__main__\"` block"
    stray = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                   if p.parent.name != "cli" and (p.stem == "__main__" or p.stem.startswith("cli")))
    assert not stray, f"entry points outside cli/: {stray}"
    for script, target in scripts.items():
        assert re.search(rf"\b{target.split(':')[0].rpartition('.')[2]}\s.*\b{script}\b", documented), script


def test_tools_scripts_only_run_cli_commands():
    """tools/ holds Megatron-LM's script names for a checkout; each one imports a `cli/` module
    and nothing else of ours (cli/ stays the one home of every command), and runs its main."""
    scripts = sorted((PACKAGE.parent / "tools").glob("*.py"))
    assert {p.stem for p in scripts} >= {"preprocess_data", "convert_checkpoint", "merge_datasets"}
    for script in scripts:
        tree = ast.parse(script.read_text(encoding="utf-8"))
        ours = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").startswith("megatron_biglm")]
        ours += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names if alias.name.startswith("megatron_biglm")]
        assert len(ours) == 1 and ours[0].startswith("megatron_biglm.cli.") \
            and (PACKAGE / "cli" / f"{ours[0].rpartition('.')[2]}.py").exists(), (script.name, ours)
        guards = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
        assert guards and "main(" in ast.unparse(guards[-1]), f"tools/{script.name} never runs main"
