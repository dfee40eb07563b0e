"""The shape of the package's code, checked on the source with ``ast``: no function over 100 lines.

A function (or method, nested ones included) is measured from its ``def``
line (decorators left out) to its last line, docstring included: what a
reader has to hold at once. Nothing is exempt; a long function is split into
helpers whose names say what they do.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "outlines"
#: The most lines one function may take, ``def`` line to last line.
MAX_LINES = 100


def long_functions(source: str, path: str, limit: int = MAX_LINES) -> list[str]:
    """``path:line name (n lines)`` for every function of ``source`` longer than ``limit`` lines."""
    found = []
    stack: list[tuple[ast.AST, str]] = [(ast.parse(source), "")]
    while stack:
        node, prefix = stack.pop()
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > limit:
                        found.append(f"{path}:{child.lineno} {name} ({lines} lines)")
                name += "."
            stack.append((child, name))
    return sorted(found)


def test_no_function_is_longer_than_100_lines() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    assert not found, (f"functions over {MAX_LINES} lines (split them into helpers named for what they do):\n"
                       + "\n".join(found))


def test_the_checker_measures_methods_and_nested_functions_docstring_included() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(97))
    source = (f'class A:\n    @staticmethod\n    def fits():\n        """Doc."""\n'
              + body.replace("    x", "        x") + "\n"
              + f'def outer():\n    def inner():\n        """Doc."""\n' + body.replace("    x", "        x")
              + "\n        return 1\n    return inner\n")
    # ``A.fits``: def + docstring + 97 lines = 99; ``outer.inner``: 100 with its return; ``outer``: 102
    assert long_functions(source, "m.py") == ["m.py:102 outer (102 lines)"]
    assert long_functions(source, "m.py", limit=99) == ["m.py:102 outer (102 lines)",
                                                        "m.py:103 outer.inner (100 lines)"]
