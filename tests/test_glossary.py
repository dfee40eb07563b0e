"""One word, one meaning: no identifier in ``outlines/`` uses a word the glossary retired.

``docs/reference/glossary.md`` gives each term one meaning; its ``Retired:``
lines list the words the code no longer uses, each with the word to use,
as ``\\`old\\` (use \\`new\\`)``. This test reads those lines and every name
the package defines (functions, classes, parameters, attributes and variables
assigned, imports bound under a new name) with ``ast``, and fails naming
``file:line``, the identifier and the word to use. Matching follows the
glossary's rule: an identifier's words are its snake_case parts and CamelCase
humps; an entry matches when its words appear in a row; an entry with a
capital letter matches exactly as written, one in lower case in any case.
A name on a ``Deprecated aliases:`` line may still be defined (an alias is kept
as ``Old = New``, a property, a deprecated parameter), never imported: a module
importing it uses the old name.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
GLOSSARY = ROOT / "docs" / "reference" / "glossary.md"
PACKAGE = ROOT / "outlines"


class Retired(NamedTuple):
    """One retired word of the glossary: its words, whether case counts, and the word to use."""

    old: str
    words: tuple[str, ...]
    exact: bool
    use: str


def words_of(identifier: str) -> list[str]:
    """The snake_case parts and CamelCase humps of ``identifier``, as written.

    >>> words_of("_message_batch_create"), words_of("DrawBatch"), words_of("BATCH_LINE_FIELDS")
    (['message', 'batch', 'create'], ['Draw', 'Batch'], ['BATCH', 'LINE', 'FIELDS'])
    """
    return re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", identifier)


def glossary_entries(text: str) -> tuple[list[Retired], set[str]]:
    """The retired words and the deprecated aliases of a glossary page (``Retired:`` lines and their continuations)."""
    retired, aliases = [], set()
    for kind, body in re.findall(r"^(Retired|Deprecated aliases):(.*(?:\n(?!\n|[A-Z][\w ]*:|#).*)*)", text, re.M):
        if kind == "Retired":
            pairs = re.findall(r"`([^`]+)`\s*\(use\s+`([^`]+)`", body)
            assert pairs, f"a Retired: line names no `old` (use `new`) pair: {body.strip()[:80]}"
            for old, use in pairs:
                exact = any(c.isupper() for c in old)
                found = words_of(old)
                retired.append(Retired(old, tuple(found if exact else (w.lower() for w in found)), exact, use))
        else:
            aliases.update(re.findall(r"`([^`=]+)=?`", re.sub(r"\(use[^)]*\)", "", body)))
    return retired, aliases


def names_of(tree: ast.AST) -> Iterator[tuple[str, int, bool]]:
    """Every name a module defines or binds: ``(identifier, line, imported)``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node.lineno, False
        elif isinstance(node, ast.arg):
            yield node.arg, node.lineno, False
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            yield node.id, node.lineno, False
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            yield node.attr, node.lineno, False
        elif isinstance(node, ast.alias):  # an import binds the name (``import a.b`` binds ``a``)
            yield node.asname or node.name.split(".")[0], node.lineno, True
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            yield from ((name, node.lineno, False) for name in node.names)
        elif isinstance(node, ast.keyword) and node.arg:  # a parameter named at a call
            yield node.arg, node.lineno, False


def uses(identifier: str, entry: Retired) -> bool:
    """Whether ``identifier`` holds the words of ``entry`` in a row."""
    found = words_of(identifier)
    if not entry.exact:
        found = [w.lower() for w in found]
    n = len(entry.words)
    return any(tuple(found[i:i + n]) == entry.words for i in range(len(found) - n + 1))


def offences(source: str, path: str, retired: list[Retired], aliases: set[str]) -> list[str]:
    """``path:line identifier: ...`` for each identifier of ``source`` using a retired word."""
    found = set()
    for identifier, line, imported in names_of(ast.parse(source)):
        if identifier in aliases and not imported:  # where a deprecated alias is kept; importing it uses it
            continue
        entry = next((entry for entry in retired if uses(identifier, entry)), None)
        if entry is not None:  # the first entry it uses: one line per identifier
            found.add((line, f"{path}:{line} {identifier}: uses the retired {entry.old!r}; use {entry.use!r}"))
    return [message for _, message in sorted(found)]


def test_no_identifier_uses_a_retired_word() -> None:
    retired, aliases = glossary_entries(GLOSSARY.read_text(encoding="utf-8"))
    assert len(retired) >= 10, "the glossary's Retired: lines were not read"
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += offences(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), retired, aliases)
    assert not found, "identifiers using words the glossary retired (docs/reference/glossary.md):\n" + "\n".join(found)


def test_the_checker_reads_the_glossary_and_finds_each_kind_of_name() -> None:
    page = ("### batch\nOne call.\nRetired: `DrawBatch` (use `DrawColumns`), `whole_batches`\n"
            "(use `full_batches`), `Round` (use `_JobRun`).\nDeprecated aliases: `DrawBatch`, the option\n"
            "`batch=` (use `jobs=`).\nNot yet followed: `batch_discount` (use `jobs`).\n")
    retired, aliases = glossary_entries(page)
    assert [(r.old, r.words, r.exact, r.use) for r in retired] == [
        ("DrawBatch", ("Draw", "Batch"), True, "DrawColumns"),
        ("whole_batches", ("whole", "batches"), False, "full_batches"),
        ("Round", ("Round",), True, "_JobRun")]
    assert aliases == {"DrawBatch", "batch"}
    source = ("from x import y as WHOLE_BATCHES_MAX\nfrom z import whole_batches\n"
              "class _Round:\n    def f(self, draw_batch, *, whole_batches=1):\n        self.MyDrawBatch = 1\n"
              "def rounds(DrawBatch): round_ = 1; DrawBatch = 2\nfrom outlines.draws import DrawBatch\n"
              "def g(): return whole_batches(x, key_whole_batches=3)\n")
    assert offences(source, "m.py", retired, aliases) == [
        "m.py:1 WHOLE_BATCHES_MAX: uses the retired 'whole_batches'; use 'full_batches'",
        "m.py:2 whole_batches: uses the retired 'whole_batches'; use 'full_batches'",
        "m.py:3 _Round: uses the retired 'Round'; use '_JobRun'",
        "m.py:4 whole_batches: uses the retired 'whole_batches'; use 'full_batches'",
        "m.py:5 MyDrawBatch: uses the retired 'DrawBatch'; use 'DrawColumns'",
        "m.py:7 DrawBatch: uses the retired 'DrawBatch'; use 'DrawColumns'",
        "m.py:8 key_whole_batches: uses the retired 'whole_batches'; use 'full_batches'"]
