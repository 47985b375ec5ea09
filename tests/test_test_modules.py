"""Every test module runs alone: none imports another test module.

Why: pytest puts a test module's folder on `sys.path` only once it collects that module, so
`from test_other import X` works in a full run and fails with `ModuleNotFoundError` when the
test is run alone (`pytest path::name`) or the other module is collected later. What tests
share lives in helper modules at `tests/` root (on pytest's `pythonpath`) or in fixtures.
Every import counts, including the lazy ones inside functions.
"""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _test_module_names() -> set[str]:
    return {p.stem for p in TESTS.rglob("test_*.py")}


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import in `tree`; a relative import keeps its last component."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                out.append((node.lineno, node.module))
            if node.level:  # `from . import test_x`
                out += [(node.lineno, alias.name) for alias in node.names]
    return out


def test_no_test_module_imports_another_test_module():
    tests = _test_module_names()
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for line, module in _imported(tree):
            name = module.split(".")[-1] if module.startswith(".") else module.split(".")[0]
            if name in tests or module.split(".")[-1] in tests:
                offenders.append(f"{path.relative_to(TESTS.parent)}:{line}: imports {module}")
    assert not offenders, ("a test module imports another test module; move what they share into a "
                           "helper module at tests/ root (or a fixture):\n" + "\n".join(offenders))


def test_the_check_finds_a_bare_import_of_a_test_module():
    tree = ast.parse("def f():\n    from test_curves_plot import C1\nimport test_serve\n")
    assert {m for _, m in _imported(tree)} == {"test_curves_plot", "test_serve"}
    assert {"test_curves_plot", "test_serve"} <= _test_module_names()
