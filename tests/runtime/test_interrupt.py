"""Ctrl-C (and SIGTERM) during a sync ``eval``, in subprocesses.

Ctrl-C inside ``asyncio.run(...)`` under ``python -X dev -W error``; and a
Python step that never returns (``tests/fixtures/hung_step.py``), in the
thread pool or on the schedule's event loop: Ctrl-C or SIGTERM still ends the
process within seconds (SIGTERM after ``termination.GRACE_SECONDS`` when the
step holds the loop), once the cache writer has committed the draws that
finished.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from outlines.cache import Cache
from tests.fixtures.subprocesses import ROOT, python_env, sigint_default

FIXTURES = ROOT / "tests" / "fixtures"


def test_ctrl_c_in_a_sync_eval_inside_asyncio_run_cancels_at_once_and_keeps_what_finished(tmp_path: Path) -> None:
    script = FIXTURES / "sigint_in_loop.py"
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "default"))
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", str(script), str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, preexec_fn=sigint_default,
    )
    # The script fails when the interrupt waits for the 30 s call to finish.
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("OK hits=20"), result.stdout
    for bad in ("Task was destroyed", "never awaited", "Unclosed", "Exception ignored", "Warning"):
        assert bad not in result.stderr, result.stderr[-3000:]


def _stop_hung_step(mode: str, where: str, signum: int, tmp_path: Path) -> tuple[int, str, str, float]:
    """Run ``hung_step.py``, send ``signum`` once its step hangs; status, stdout, stderr and seconds to exit."""
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "default"))
    process = subprocess.Popen(
        [sys.executable, "-X", "dev", str(FIXTURES / "hung_step.py"), mode, where, str(tmp_path / "cache")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, preexec_fn=sigint_default,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == "HUNG\n", line + (process.stderr.read() if process.stderr else "")
        sent = time.monotonic()
        process.send_signal(signum)
        try:
            out, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the process was still alive 30 s after {signal.Signals(signum).name}: the hung step kept it")
        return process.returncode, line + out, err, time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(("mode", "where", "signum", "status"), [
    ("plain", "pool", signal.SIGINT, 0),
    ("in-loop", "pool", signal.SIGINT, 0),
    ("in-loop", "loop", signal.SIGINT, 0),
    ("plain", "pool", signal.SIGTERM, -signal.SIGTERM),
    ("in-loop", "pool", signal.SIGTERM, -signal.SIGTERM),
    ("own-handler", "pool", signal.SIGTERM, 7),
    ("plain", "loop", signal.SIGTERM, -signal.SIGTERM),  # the step holds the loop: ended after the grace
    ("in-loop", "loop", signal.SIGTERM, -signal.SIGTERM),
], ids=["ctrl-c", "ctrl-c-in-loop", "ctrl-c-in-loop-step-on-the-loop", "sigterm", "sigterm-in-loop",
        "sigterm-own-handler", "sigterm-step-on-the-loop", "sigterm-in-loop-step-on-the-loop"])
def test_a_hung_blocking_step_never_keeps_the_process_alive_and_finished_draws_are_stored(
    tmp_path: Path, mode: str, where: str, signum: int, status: int,
) -> None:
    code, out, err, seconds = _stop_hung_step(mode, where, signum, tmp_path)
    assert code == status, (code, out, err[-3000:])
    assert ("INTERRUPTED" in out) == (signum == signal.SIGINT) and "FINISHED" not in out
    # The draws waited on a slow disk (0.5 s a commit): the exit waited for them, not for the step.
    assert seconds < 20, seconds
    assert Cache(tmp_path / "cache").stats()["entries"] == 10
    for bad in ("Task was destroyed", "never retrieved", "Unclosed", "Exception ignored"):
        assert bad not in err, err[-3000:]
