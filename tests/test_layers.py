"""The layers of the package, checked on the source with ``ast``.

``outlines/graph/`` (the symbolic core and its pictures) imports nothing from
``outlines.runtime``, ``outlines.cache`` or ``outlines.backends`` when it is
imported; the two documented upward calls (``Variable.eval``/``aeval`` and the
Jupyter repr) import lazily, inside those functions only. ``outlines/backends/``
imports nothing from ``outlines.runtime``, at any level.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "outlines"
ABOVE_GRAPH = ("outlines.runtime", "outlines.cache", "outlines.backends")
#: (file under outlines/graph, function name) allowed to import upward, lazily.
LAZY_UPWARD_CALLS = {("basic.py", "eval"), ("basic.py", "aeval"), ("viz/jupyter.py", "_repr_html_"),
                     ("viz/jupyter.py", "_repr_mimebundle_")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Full names of what one import statement imports (``from a import b`` gives ``a.b`` too)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def imports(source: str, module: str, is_package: bool = False) -> list[tuple[str, str | None]]:
    """Every import as ``(name, enclosing function or None)``; ``if TYPE_CHECKING:`` blocks skipped."""
    found: list[tuple[str, str | None]] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child, function)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend((name, function) for name in _imported(node, module, is_package))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            function = getattr(node, "name", "<lambda>") if function is None else function
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source), None)
    return found


def _upward(name: str, layers: tuple[str, ...]) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


def _files(folder: str) -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


@pytest.mark.parametrize("path", _files("graph"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_graph_imports_nothing_above_it_at_module_level(path: Path) -> None:
    found = imports(path.read_text(), _module_name(path), path.name == "__init__.py")
    relative = path.relative_to(PACKAGE / "graph").as_posix()
    eager = [name for name, function in found if function is None and _upward(name, ABOVE_GRAPH)]
    assert eager == [], f"outlines/graph/{relative} imports {eager} at module level"
    lazy = [(name, function) for name, function in found if function is not None and _upward(name, ABOVE_GRAPH)]
    assert all((relative, function) in LAZY_UPWARD_CALLS for _, function in lazy), (
        f"outlines/graph/{relative} imports upward outside the documented lazy calls: {lazy}"
    )


@pytest.mark.parametrize("path", _files("backends"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_backends_import_nothing_from_the_runtime(path: Path) -> None:
    found = imports(path.read_text(), _module_name(path), path.name == "__init__.py")
    upward = [name for name, _ in found if _upward(name, ("outlines.runtime",))]
    assert upward == [], f"{path.relative_to(PACKAGE.parent)} imports {upward}"


def test_the_checker_sees_every_form_of_import() -> None:
    source = (
        "import outlines.runtime.evaluate\n"
        "from outlines import cache\n"
        "from ..backends.base import Draw\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from outlines.runtime.plan import Plan\n"
        "class A:\n    def eval(self):\n        from outlines.runtime.evaluate import eval\n"
    )
    found = imports(source, "outlines.graph.basic")
    eager = [name for name, function in found if function is None and _upward(name, ABOVE_GRAPH)]
    assert "outlines.runtime.evaluate" in eager and "outlines.cache" in eager
    assert "outlines.backends.base" in eager and "outlines.runtime.plan" not in eager
    assert ("outlines.runtime.evaluate", "eval") in found
