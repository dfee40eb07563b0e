"""The documentation site: it builds with warnings as errors, and its Python examples run.

Every ```` ```python ```` block of a page under docs/ runs, in order, as one
script per page (offline, in a fresh cache). A block can be left out only by a
``<!-- docs-test: skip (reason) -->`` line right above it, and must give a reason.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
BLOCK = re.compile(r"(?P<skip><!-- docs-test: skip(?P<reason>[^>]*)-->\n)?```python\n(?P<code>.*?)```", re.DOTALL)


def blocks(page: Path) -> tuple[list[str], list[str]]:
    """(code of the blocks to run, reasons of the skipped ones)."""
    run, skipped = [], []
    for match in BLOCK.finditer(page.read_text(encoding="utf-8")):
        if match.group("skip"):
            reason = match.group("reason").strip(" ()")
            assert reason, f"{page.relative_to(ROOT)}: a skipped block must say why"
            skipped.append(reason)
        else:
            run.append(match.group("code"))
    return run, skipped


def test_every_guide_has_examples_that_run():
    pages = {p.relative_to(DOCS).as_posix(): blocks(p)[0] for p in PAGES if not p.is_relative_to(DOCS / "reference")}
    assert {"index.md", "getting-started.md", "guides/self-consistency.md", "guides/adaptive-voting.md", "guides/agents.md", "guides/observing.md",
            "guides/jupyter.md", "distributed.md"} <= set(pages)
    assert all(pages.values()), [name for name, code in pages.items() if not code]


def test_block_extraction_honours_skips(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("```python\nx = 1\n```\n<!-- docs-test: skip (needs a server) -->\n```python\nboom()\n```\n"
                    "```bash\nls\n```\n")
    assert blocks(page) == (["x = 1\n"], ["needs a server"])


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)[0]], ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_examples_run(page: Path, tmp_path: Path):
    code, _ = blocks(page)
    if "from distributed" in "".join(code):
        pytest.importorskip("distributed")
    if "build_tiny_model" in "".join(code):
        pytest.importorskip("transformers")
    script = tmp_path / "page.py"
    script.write_text("\n".join(code), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OUTLINES_CACHE_DIR=str(tmp_path / "cache"), MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, f"{page.relative_to(ROOT)} failed:\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path: Path):
    pytest.importorskip("mkdocs", reason="pip install -e '.[docs]' (scripts/setup.sh installs it)")
    pytest.importorskip("mkdocstrings")
    mkdocs = [sys.executable, "-m", "mkdocs"]
    done = subprocess.run([*mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1"))
    assert done.returncode == 0, done.stderr[-4000:]
    reference = (tmp_path / "site" / "reference" / "tracing" / "index.html").read_text(encoding="utf-8")
    assert "Record every evaluation run inside the block" in reference  # generated from the docstring
    assert (tmp_path / "site" / "guides" / "observing" / "index.html").exists()
    shutil.rmtree(tmp_path / "site")
