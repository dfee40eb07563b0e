"""README.md leads with the two commands; docs/reference/layout.md lists the tree as it is.

README's python blocks run, and print what their comments say, in tests/test_docs.py
(``test_page_examples_run[README.md]``), with the pages of the site.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_layout_block_lists_every_module_as_it_is():
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layout.py"), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_readme_leads_with_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.split("---", 1)[0].splitlines() if line.startswith("./scripts/")]
    assert commands == ["./scripts/example.sh", "./scripts/test.sh"]
    assert "./scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_the_first_program_and_observing_run_offline_and_print_what_they_say(tmp_path, monkeypatch):
    from tests.test_docs import blocks, printed_comments, run_page

    readme = ROOT / "README.md"
    first, *_, observing = blocks(readme)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # offline: no key, no server
    assert not first.needs and not observing.needs
    out = run_page(readme, [first, observing], tmp_path, timeout=120)
    assert printed_comments(first.code) == ["17 * 3 = 51", "['2 * 3 = 6' '6 * 7 = 42' '9 * 9 = 81']"]
    assert out.splitlines()[:2] == printed_comments(first.code)
    assert (tmp_path / "cwd" / "chain.md").exists() and (tmp_path / "cwd" / "run.html").exists()
