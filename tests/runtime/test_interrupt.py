"""Ctrl-C during a sync ``eval`` inside ``asyncio.run(...)`` (a subprocess, ``python -X dev -W error``)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.fixtures.subprocesses import ROOT, python_env, sigint_default


def test_ctrl_c_in_a_sync_eval_inside_asyncio_run_cancels_at_once_and_keeps_what_finished(tmp_path: Path) -> None:
    script = ROOT / "tests" / "fixtures" / "sigint_in_loop.py"
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
