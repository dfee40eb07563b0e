"""Print README's Layout block from the tree: each module with its docstring's first line.

``python scripts/layout.py`` prints it; ``--check`` exits 1 when README.md's
block differs (tests/test_readme.py runs that check).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
    if "--check" not in sys.argv:
        print(text)
        return 0
    readme = (ROOT / "README.md").read_text()
    current = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip() if BEGIN in readme else ""
    if current != text:
        print("README.md's Layout block is stale: run `python scripts/layout.py` and paste it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
