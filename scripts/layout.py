"""Write docs/reference/layout.md's module block from the tree: each module with its docstring's first line.

``python scripts/layout.py`` prints the block, ``--write`` puts it into
docs/reference/layout.md, ``--check`` exits 1 when the page's block differs
(tests/test_readme.py runs that check).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference" / "layout.md"
BEGIN, END = "<!-- layout: begin (scripts/layout.py) -->", "<!-- layout: end -->"


def summary(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return (doc or "").strip().split("\n")[0].rstrip(".")


def block() -> str:
    rows = []
    for path in sorted((ROOT / "outlines").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" and path.parent.name != "outlines" and not summary(path):
            continue
        rows.append((relative, summary(path)))
    width = max(len(name) for name, _ in rows) + 2
    lines = [f"{name:<{width}}{text}" for name, text in rows]
    return "\n".join(["```", *lines, "```"])


def main() -> int:
    text = block()
    page = PAGE.read_text()
    if BEGIN not in page or END not in page:
        print(f"{PAGE} has no {BEGIN} ... {END} block", file=sys.stderr)
        return 1
    head, rest = page.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    if "--write" in sys.argv:
        PAGE.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
        return 0
    if "--check" not in sys.argv:
        print(text)
        return 0
    if current.strip() != text:
        print("docs/reference/layout.md's module block is stale: run `python scripts/layout.py --write`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
