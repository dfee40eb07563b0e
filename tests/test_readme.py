"""README.md tells the truth about the tree: its Layout block is generated from it."""
from __future__ import annotations

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
