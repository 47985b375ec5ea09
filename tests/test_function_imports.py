"""Where imports sit in the package.

Outside `cli/`, the package's own modules are imported at the top of the module that uses
them: an import hidden in a function hides a dependency from the floors check and usually
papers over an import cycle. A third-party import inside a function is allowed for an
optional dependency or a measured start-up cost only, and says which on its own line:
`import lm_eval  # lazy: optional (eval extra)`.
"""
import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "megatron_biglm"
REASON = re.compile(r"#.*\blazy: \S")


def _nested_imports(source, filename="<source>"):
    """(line, first module name, is own) of every import inside a function or class body."""
    found = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if nested and isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
                found.append((child.lineno, names[0], any(n.split(".")[0] == "megatron_biglm" for n in names)))
            elif nested and isinstance(child, ast.ImportFrom):
                name = child.module or ""
                found.append((child.lineno, name, child.level > 0 or name.split(".")[0] == "megatron_biglm"))
            visit(child, inner)

    visit(ast.parse(source, filename=filename), False)
    return found


def _function_level_imports():
    """(path, line, module, is own, source line) of every nested import outside cli/."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts[1] == "cli":
            continue
        text = path.read_text()
        lines = text.splitlines()
        found += [(rel, line, name, own, lines[line - 1]) for line, name, own in _nested_imports(text, str(path))]
    return found


def test_own_modules_are_imported_at_module_top():
    own = [f"{rel}:{line}: {name}" for rel, line, name, is_own, _ in _function_level_imports() if is_own]
    assert not own, (
        f"{len(own)} imports of megatron_biglm's own modules inside functions (outside cli/); "
        "move each to the top of its module (a cycle that forces one is a design to fix):\n"
        + "\n".join(own))


def test_third_party_imports_in_functions_say_why():
    bare = [f"{rel}:{line}: {src.strip()}" for rel, line, _, is_own, src in _function_level_imports()
            if not is_own and not REASON.search(src)]
    assert not bare, (
        f"{len(bare)} third-party imports inside functions without a reason; move each to the top "
        f"of its module, or, for an optional dependency or a measured start-up cost, end the line "
        "with '# lazy: <why>':\n" + "\n".join(bare))


def test_the_check_sees_nested_imports():
    """Imports in functions, methods and nested functions count; module-level ones do not."""
    source = ("import os\nif True:\n    import sys\n"
              "def f():\n    import json\n    def g():\n        from . import x\n"
              "class C:\n    def m(self):\n        import megatron_biglm.common\n")
    assert _nested_imports(source) == [(5, "json", False), (7, "", True), (10, "megatron_biglm.common", True)]
