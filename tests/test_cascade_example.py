"""examples/cascade.py: a two-stage cascade on the main job's word problems (issue 41).

The fast test runs the script on its fake (the plumbing: only the problems
whose samples disagree reach the agent, each stage is batched, a re-run
replays); the slow one runs it on SmolLM2 and checks the same bookkeeping,
not a score.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.subprocesses import ROOT, python_env

SCRIPT = Path(ROOT) / "examples" / "cascade.py"
STAGE = re.compile(r"^ +(?P<stage>[12]) (?P<method>sampled reasoning|calculator agent) +(?P<reached>\d+) +"
                   r"(?P<accepted>\d+) +(?P<escalated>\d+) +(?P<right>\d+) +(?P<draws>\d+) +(?P<calls>\d+) +[\d.]+$", re.MULTILINE)


def run_script(*args: str, cache: Path, timeout: int = 120) -> str:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=python_env(OUTLINES_CACHE_DIR=str(cache)), timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout


def stages(out: str) -> list[dict[str, int]]:
    return [{k: int(v) for k, v in m.groupdict().items() if k != "method"} for m in STAGE.finditer(out)]


def test_only_the_problems_whose_samples_disagree_reach_the_agent(tmp_path: Path) -> None:
    out = run_script("--model", "function", cache=tmp_path)
    first, second = stages(out)
    # the fake's samples disagree on the problems whose first number is odd: those 8 go to the agent
    assert first == {"stage": 1, "reached": 20, "accepted": 12, "escalated": 8, "right": 10, "draws": 60, "calls": 1}
    assert second == {"stage": 2, "reached": 8, "accepted": 8, "escalated": 0, "right": 4, "draws": 16, "calls": 2}
    assert re.search(r"^cascade +14/20 +76 +3 ", out, re.MULTILINE)
    assert "(the agent's iterations, problems still working: [8, 8])" in out
    assert "re-run: 0 backend call(s)" in out
    assert "cascade stage 0 (sampled reasoning): reached 20, accepted 12, escalated 8" in out  # the trace summary
    again = run_script("--model", "function", cache=tmp_path)
    assert re.search(r"^cascade +14/20 +0 +0 ", again, re.MULTILINE)  # every draw replays from the cache


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(900)
def test_the_cascade_runs_end_to_end_on_smollm2(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("xgrammar", reason="pip install -e '.[structured]'")  # the agent's regex-held steps
    from outlines.testing import ModelNotInstalledError, smollm2_gguf

    try:
        smollm2_gguf()
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))
    out = run_script("--problems", "6", cache=tmp_path, timeout=900)
    first, second = stages(out)
    assert first["reached"] == 6 and first["accepted"] + first["escalated"] == 6
    assert first["draws"] == 18 and first["calls"] >= 1
    assert second["reached"] == first["escalated"] and second["escalated"] == 0
    iterations = [int(n) for n in re.search(r"problems still working: \[(.*)\]", out)[1].split(",") if n.strip()]  # type: ignore[index]
    assert second["draws"] == sum(iterations) and second["calls"] == len(iterations)
    assert all(n <= first["escalated"] for n in iterations)  # only the escalated problems reach the agent
    assert "re-run: 0 backend call(s)" in out
