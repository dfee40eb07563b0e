"""SIGTERM during a sync ``eval``: what finished is stored, then the process ends as SIGTERM ends it.

Each test runs ``tests/fixtures/sigterm_script.py`` in a subprocess on a slow
disk (every cache commit first sleeps) and sends it a real SIGTERM once its
finished draws are queued behind the slow writer.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outlines.cache import Cache
from tests.fixtures.subprocesses import ROOT, python_env

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

SCRIPT = ROOT / "tests" / "fixtures" / "sigterm_script.py"


def _terminate_when_stuck(mode: str, tmp_path: Path) -> tuple[int, str, str]:
    """Run the script, send SIGTERM once it prints STUCK; its status, stdout and stderr."""
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "default"))
    process = subprocess.Popen(
        [sys.executable, "-X", "dev", str(SCRIPT), mode, str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == "STUCK\n", line + (process.stderr.read() if process.stderr else "")
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, line + out, err


@pytest.mark.parametrize("mode", ["plain", "in-loop"])
def test_sigterm_stores_every_finished_draw_then_ends_the_process_as_sigterm(tmp_path: Path, mode: str) -> None:
    start = time.monotonic()
    status, out, err = _terminate_when_stuck(mode, tmp_path)
    assert status == -signal.SIGTERM, (status, out, err[-3000:])  # a shell shows 143
    assert "FINISHED" not in out and time.monotonic() - start < 60
    assert Cache(tmp_path / "cache").stats()["entries"] == 30  # all 30 finished draws, none lost
    for bad in ("Traceback", "Task was destroyed", "never retrieved", "Unclosed"):
        assert bad not in err, err[-3000:]


def test_an_application_handler_for_sigterm_is_left_alone(tmp_path: Path) -> None:
    status, out, err = _terminate_when_stuck("own-handler", tmp_path)
    assert status == 7 and "APP HANDLER" in out, (status, out, err[-3000:])
