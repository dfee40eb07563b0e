"""README.md leads with the two commands and its snippets print what they say; docs/reference/layout.md lists the tree as it is."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


def section_code(title: str) -> str:
    """The first python block of README's section ``title``."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index(f"## {title}\n")
    section = readme[start:readme.index("\n## ", start + 1)]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def run_section(code: str, tmp_path: Path, timeout: float) -> str:
    """Run a snippet as a script in a fresh cache; its stdout."""
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT), OUTLINES_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def printed_comments(code: str) -> list[str]:
    """What each ``print(...)  # text`` line of a snippet says it prints."""
    return [match.group(1) for match in re.finditer(r"^print\(.*\)\s{2,}# (.*)$", code, re.MULTILINE)]


def test_printed_comments_are_read_from_print_lines_only():
    code = "x = 1  # not printed\nprint(x)   # 1\nprint(repr('a # b'))  # 'a # b'\n"
    assert printed_comments(code) == ["1", "'a # b'"]


@pytest.mark.slow
def test_the_chat_section_prints_what_its_comments_say(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from outlines.testing import ModelNotInstalledError, smollm2_gguf

    try:
        smollm2_gguf()
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))
    code = section_code("Local and chat models")
    expected = printed_comments(code)
    assert len(expected) == 3 and "temperature=0" in code
    assert run_section(code, tmp_path, timeout=280).splitlines() == expected
