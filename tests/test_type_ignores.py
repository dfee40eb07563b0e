"""``type: ignore`` in the package: 20 at most, each naming its error code and saying why on the same line.

A silenced error is a type the code does not state; the few left are
overrides of a writable attribute by a read-only property and the like,
each with its reason (``# type: ignore[code]  # why``).
"""
from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "outlines"
MOST = 20
#: ``# type: ignore[code, ...]`` then, after two spaces, ``# the reason``.
_EXPLAINED = re.compile(r"# type: ignore\[[a-z-]+(, ?[a-z-]+)*\]  # \S")


def _ignores() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "type: ignore" in line:
                found.append((path.relative_to(PACKAGE).as_posix(), number, line.strip()))
    return found


def test_the_package_silences_at_most_twenty_type_errors() -> None:
    found = _ignores()
    assert len(found) <= MOST, "\n".join(f"{path}:{number}" for path, number, _ in found)


def test_each_silenced_type_error_names_its_code_and_its_reason() -> None:
    bare = [f"{path}:{number}: {line}" for path, number, line in _ignores()
            if not _EXPLAINED.search(line)]
    assert not bare, "write # type: ignore[code]  # why:\n" + "\n".join(bare)
