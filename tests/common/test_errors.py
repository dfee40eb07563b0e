"""Install hints name this distribution, and README's Install lists every extra.

``pip install outlines[...]`` installs an unrelated library from the registry:
no message, docstring or page may say it. Each hint is triggered for real
(the import it needs is blocked) and its message checked; the graphviz one in
tests/graph/viz/test_writers.py.
"""
from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

from outlines.common.errors import install_hint
from tests.fixtures.subprocesses import python_env

ROOT = Path(__file__).resolve().parents[2]
#: ``outlines[`` as a distribution with extras (``outlines-dataflow[`` does not match).
WRONG_DISTRIBUTION = re.compile(r"(?<![\w.-])outlines\[")


def _extras() -> list[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return list(config["options.extras_require"])


def _install_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Install\n")
    return readme[start:readme.index("\n## ", start + 1)]


def test_no_file_tells_users_to_install_the_unrelated_outlines_distribution():
    files = [*sorted((ROOT / "outlines").rglob("*.py")), ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "examples").rglob("*.py")), *sorted((ROOT / "scripts").rglob("*"))]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in files if path.is_file()
             for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if WRONG_DISTRIBUTION.search(line)]
    assert found == []


def test_the_scan_sees_the_wrong_spelling():
    assert WRONG_DISTRIBUTION.search("pip install 'outlines[viz]'")
    assert WRONG_DISTRIBUTION.search("pip install outlines[structured]")
    assert not WRONG_DISTRIBUTION.search("pip install 'outlines-dataflow[viz]'")
    assert not WRONG_DISTRIBUTION.search("pip install -e '.[viz]'")


def test_readme_install_lists_every_extra_one_line_each():
    section = _install_section()
    lines = {}
    for line in section.splitlines():
        match = re.match(r"""(?:.*&& )?pip install -e ["']\.\[([\w,-]+)\]["']""", line)
        if match:
            extras = match.group(1).split(",")
            assert len(extras) == 1, f"one extra per line: {line}"
            lines[extras[0]] = line
    assert sorted(lines) == sorted(_extras())
    assert all("#" in line for line in lines.values()), "each line says what the extra is for"


def test_the_hint_is_the_checkout_install_of_this_distribution():
    assert install_hint("viz") == "pip install -e '.[viz]' in a checkout of outlines-dataflow"
    assert all(extra in _extras() for extra in ("viz", "otel", "structured", "transformers"))


def test_otel_without_opentelemetry_names_the_otel_extra(monkeypatch):
    import outlines
    import outlines.otel

    with outlines.trace() as trace:
        pass
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ImportError) as info:
        outlines.otel.export(trace)
    assert install_hint("otel") in str(info.value)


def test_constrained_decoding_without_xgrammar_names_the_structured_extra(monkeypatch):
    from outlines.backends.constraints import _Compiler

    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ImportError) as info:
        _Compiler(tokenizer=None, vocab_size=10)
    assert install_hint("structured") in str(info.value)


@pytest.mark.slow
def test_a_local_model_without_torch_names_the_transformers_extra(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # as if torch were not installed
        "from outlines import models\n"
        "llm = models.transformers(sys.argv[1], max_tokens=2)\n"
        "print(llm('hi').eval(cache=False, errors='return'))\n"
    )
    folder = tmp_path / "model"
    folder.mkdir()
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", script, str(folder)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "torch" in done.stdout and install_hint("transformers") in done.stdout, done.stdout
