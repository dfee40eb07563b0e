"""The layers of the package, checked on the source with ``ast``: every import, lazy ones included.

Layers, lowest first (DESIGN section 5)::

    bottom    outlines/common/ (errors, keys, labels, threads, config, conversation), outlines/draws/
    graph     outlines/graph/ (with graph/viz/)
    cache     outlines/cache/       } side by side: neither imports the other
    backends  outlines/backends/    }
    runtime   outlines/runtime/
    api       every other module at the top (text, fn, chat, models, ...), outlines/testing/ and outlines/__init__.py

A module imports its own layer and the layers below it, never a layer above or
beside it. Modules are classified by their path, so a new module is checked as
soon as it exists: a top-level module is ``api`` (nothing below may import
it; the top holds at most ``MAX_TOP`` of them), and a new subpackage fails the test
until it is given a layer. Imports under ``if TYPE_CHECKING:`` count too: a type a
module names is a dependency its reader sees. The imports against this order
live in ONE table, ``EXCEPTIONS``, each with its reason; each must still be
needed.

Besides the order, the package has no import cycle: counting every import that
runs (module level or inside a function; not ``if TYPE_CHECKING:`` blocks) and
leaving out the table's imports, the modules form a DAG. Importing a submodule
runs its package's ``__init__`` first; that implicit import is not counted (an
``__init__`` only gathers names), an explicit ``from outlines.graph import x``
of a name that is not a module is.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "outlines"

#: The layers, lowest first; layers at the same rank sit side by side and may not import each other.
RANKS = {"bottom": 0, "graph": 1, "cache": 2, "backends": 2, "runtime": 3, "api": 4}
#: Subpackage -> its layer (a module inside a subpackage has the subpackage's layer).
PACKAGES = {"common": "bottom", "draws": "bottom", "graph": "graph", "cache": "cache", "backends": "backends", "runtime": "runtime",
            "testing": "api"}
#: The most modules the top of ``outlines/`` holds: the API layer only (the bottom layer is ``outlines/common/``).
MAX_TOP = 10


class Exception_(NamedTuple):
    """One import allowed against the layer order (and left out of the cycle check)."""

    importer: str  # a module, or a package and every module in it
    where: str | None  # the function (``Class.method``) it sits in; ``"*"``: any function; None: anywhere
    imported: str  # the module imported
    reason: str


#: THE table of exceptions. Everything else obeys the order and forms no cycle.
EXCEPTIONS = (
    Exception_("outlines.graph.basic", "Variable.eval", "outlines.runtime.evaluate",
               "Variable.eval is outlines.eval: a symbolic value offers its own evaluation (DESIGN 5)"),
    Exception_("outlines.graph.basic", "Variable.aeval", "outlines.runtime.evaluate",
               "Variable.aeval is outlines.aeval, as Variable.eval is outlines.eval (DESIGN 5)"),
    Exception_("outlines.graph.basic", "Variable._repr_mimebundle_", "outlines.graph.viz.jupyter",
               "the Jupyter repr: a Variable shows its picture, and pictures are drawn from Variables"),
    Exception_("outlines.graph.basic", "*", "outlines.graph.ops",
               "Variable's own syntax (v[i], v.reshape, v.expand_dims, v + w) and as_variable([v, w]) "
               "build the structural ops, which are Ops on Variables: the nouns and their syntax call "
               "each other, lazily, inside those functions"),
)


class Import(NamedTuple):
    name: str  # the full dotted name (``from a import b`` gives ``a.b``)
    where: str | None  # enclosing function as ``Class.method``; None at module level
    typing_only: bool  # inside ``if TYPE_CHECKING:``


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source``, wherever it sits: module level, functions, classes, ``TYPE_CHECKING``.

    ``importlib.import_module("...")`` and ``__import__("...")`` with a literal
    name count as imports too.
    """
    found: list[Import] = []

    def absolute(node: ast.ImportFrom) -> str:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([base] if base else []))
        return base

    def visit(node: ast.AST, scope: list[str], in_function: bool, typing_only: bool) -> None:
        where = ".".join(scope) if in_function else None
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                visit(child, scope, in_function, True)
            for child in node.orelse:
                visit(child, scope, in_function, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, where, typing_only) for alias in node.names)
            return
        if isinstance(node, ast.ImportFrom):
            base = absolute(node)
            found.extend(Import(f"{base}.{alias.name}" if alias.name != "*" else base, where, typing_only)
                         for alias in node.names)
            return
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            called = ast.unparse(node.func)
            if called in ("importlib.import_module", "import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append(Import(node.args[0].value, where, typing_only))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            name = getattr(node, "name", "<lambda>")
            for child in ast.iter_child_nodes(node):
                visit(child, scope + [name], True, typing_only)
            return
        if isinstance(node, ast.ClassDef):
            for child in ast.iter_child_nodes(node):
                visit(child, scope + [node.name], in_function, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, scope, in_function, typing_only)

    visit(ast.parse(source), [], False, False)
    return found


def layer(module: str) -> str:
    """The layer of a module of the package, from its path alone."""
    parts = module.split(".")
    if len(parts) == 1:
        return "api"  # outlines/__init__.py: the public names
    if parts[1] in PACKAGES:
        return PACKAGES[parts[1]]
    if len(parts) > 2 or (PACKAGE / parts[1]).is_dir():
        raise AssertionError(f"{module}: a new subpackage; give outlines/{parts[1]}/ a layer in PACKAGES")
    return "api"


def _files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


MODULES = {module_name(path): path for path in _files()}


def resolve(name: str) -> str | None:
    """The module of the package that ``name`` is or lives in; None outside the package."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _excepted(importer: str, found: Import, imported: str) -> Exception_ | None:
    for entry in EXCEPTIONS:
        inside = importer == entry.importer or importer.startswith(entry.importer + ".")
        placed = entry.where is None or (found.where is not None and entry.where in ("*", found.where))
        if inside and placed and imported == entry.imported:
            return entry
    return None


def edges_of(module: str) -> list[tuple[str, Import, str]]:
    """``(module, the import, imported module)`` for each import of another module of the package."""
    path = MODULES[module]
    out = []
    for found in imports(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
        target = resolve(found.name)
        if target is not None and target != module:
            out.append((module, found, target))
    return out


@functools.lru_cache(maxsize=1)
def edges() -> list[tuple[str, Import, str]]:
    """Every import of a package module by another, over the whole package."""
    return [edge for module in sorted(MODULES) for edge in edges_of(module)]


def allowed(importer: str, imported: str) -> bool:
    """Whether the order lets ``importer`` import ``imported``: its own layer, or one of lower rank."""
    mine, theirs = layer(importer), layer(imported)
    return mine == theirs or RANKS[theirs] < RANKS[mine]


def cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None for a DAG (an iterative depth-first walk)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(graph.get(child, ()))))
    return None


def _runtime_graph(found_edges: list[tuple[str, Import, str]]) -> dict[str, list[str]]:
    graph: dict[str, list[str]] = {module: [] for module in MODULES}
    for importer, found, imported in found_edges:
        if not found.typing_only and _excepted(importer, found, imported) is None:
            graph[importer].append(imported)
    return graph


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_import_follows_the_layer_order(module: str) -> None:
    wrong = [(found.name, found.where or "module level", layer(imported))
             for importer, found, imported in edges_of(module)
             if not allowed(importer, imported) and _excepted(importer, found, imported) is None]
    assert wrong == [], f"{module} ({layer(module)}) imports against the layer order: {wrong}"


def test_the_package_has_no_import_cycle() -> None:
    found = cycle(_runtime_graph(edges()))
    assert found is None, "import cycle (lazy imports counted): " + " -> ".join(found or [])


def test_every_exception_is_still_needed_and_stays_in_a_function() -> None:
    found_edges = edges()
    for entry in EXCEPTIONS:
        uses = [(importer, found) for importer, found, imported in found_edges
                if _excepted(importer, found, imported) is entry]
        assert uses, f"no import needs this exception any more; remove it: {entry}"
        if entry.where is not None:  # a lazy call up must stay lazy: at module level it would be a real cycle
            assert all(found.where is not None for _, found in uses), (entry, uses)
        assert entry.reason, entry


def test_backends_import_nothing_from_the_cache_and_the_cache_nothing_from_backends() -> None:
    # Side by side (DESIGN 5): what both need (the key normaliser, CacheWarning, the draws) lives below them.
    crossing = [(importer, found.name) for importer, found, imported in edges()
                if {layer(importer), layer(imported)} == {"cache", "backends"}]
    assert crossing == []


def test_every_module_has_a_layer() -> None:
    layers = {module: layer(module) for module in MODULES}
    assert {"outlines.common.keys", "outlines.common.threads", "outlines.common.errors", "outlines.draws.draw", "outlines.draws.packing"} \
        <= {m for m, lay in layers.items() if lay == "bottom"}
    assert layers["outlines.graph.viz.drawing"] == "graph" and layers["outlines.text"] == "api"
    assert all(lay in RANKS for lay in layers.values())


# -- the checker itself -----------------------------------------------------------------
def test_the_checker_sees_every_form_of_import() -> None:
    source = (
        "import outlines.runtime.evaluate\n"
        "from outlines import cache\n"
        "from ..backends.base import Draw\n"
        "from . import ops\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from outlines.runtime.plan import Plan\n"
        "class A:\n    def eval(self):\n        from outlines.runtime.evaluate import eval\n"
        "    class B:\n        x = [i for i in range(3)]\n        import outlines.fn\n"
        "def lazy():\n    import importlib\n    importlib.import_module('outlines.models')\n"
        "    return __import__('outlines.chat')\n"
        "f = lambda: __import__('outlines.otel')\n"
        "async def later():\n    from outlines.tracing import trace\n"
        "try:\n    from outlines.text import prompt\nexcept ImportError:\n    pass\n"
    )
    found = {(i.name, i.where, i.typing_only) for i in imports(source, "outlines.graph.basic")}
    assert ("outlines.runtime.evaluate", None, False) in found
    assert ("outlines.cache", None, False) in found
    assert ("outlines.backends.base.Draw", None, False) in found
    assert ("outlines.graph.ops", None, False) in found
    assert ("outlines.runtime.plan.Plan", None, True) in found  # seen, marked typing-only
    assert ("outlines.runtime.evaluate.eval", "A.eval", False) in found
    assert ("outlines.fn", None, False) in found  # a class body runs at import: module level
    assert ("outlines.models", "lazy", False) in found and ("outlines.chat", "lazy", False) in found
    assert ("outlines.otel", "<lambda>", False) in found
    assert ("outlines.tracing.trace", "later", False) in found
    assert ("outlines.text.prompt", None, False) in found
    assert resolve("outlines.backends.base.Draw") == "outlines.backends.base"
    assert resolve("outlines.cache") == "outlines.cache" and resolve("outlines.Variable") == "outlines"
    assert resolve("numpy.ndarray") is None


def test_the_checker_finds_cycles_and_upward_imports() -> None:
    assert cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None
    assert not allowed("outlines.graph.basic", "outlines.runtime.evaluate")
    assert not allowed("outlines.backends.base", "outlines.cache.keys")  # side by side
    assert not allowed("outlines.common.keys", "outlines.graph.basic") and not allowed("outlines.runtime.plan", "outlines.text")
    assert allowed("outlines.runtime.plan", "outlines.common.keys") and allowed("outlines.text", "outlines.runtime.evaluate")
    assert layer("outlines.something_new") == "api"  # a new top-level module is checked as the top
    eval_import = Import("outlines.runtime.evaluate.eval", "Variable.eval", False)
    assert _excepted("outlines.graph.basic", eval_import, "outlines.runtime.evaluate") is EXCEPTIONS[0]
    eager = Import("outlines.runtime.evaluate", None, False)
    assert _excepted("outlines.graph.basic", eager, "outlines.runtime.evaluate") is None  # only lazily


def test_the_top_of_the_package_holds_the_api_layer_only():
    """The bottom-layer modules live in ``outlines/common/``; the top holds at most ``MAX_TOP`` API modules."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP, f"outlines/ holds {len(top)} modules at the top (at most {MAX_TOP}): {top}"
    common = {p.stem for p in (PACKAGE / "common").glob("*.py")} - {"__init__"}
    assert {"errors", "keys", "labels", "threads", "config", "conversation"} <= common
    faces = [name for name in top if name in common]  # a public face re-exports its common module, nothing more
    for name in faces:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        assert all(isinstance(n, (ast.ImportFrom, ast.Expr)) for n in tree.body), f"outlines/{name}.py: only re-exports"
