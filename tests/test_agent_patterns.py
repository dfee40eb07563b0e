"""examples/agent_patterns.py: the patterns the agents and structured-outputs guides teach.

The fast test runs the script on its deterministic fake (the plumbing: every
pattern builds, evaluates and prints its row); the slow ones run the patterns
on SmolLM2 and check what each pattern guarantees, not a score.
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.fixtures.subprocesses import ROOT, python_env

SCRIPT = Path(ROOT) / "examples" / "agent_patterns.py"


def load_example() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:  # the script imports its sibling, the main job, as a script would
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("agent_patterns", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_pattern_prints_its_row_on_the_fake(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--model", "function", "--problems", "4"],
                          capture_output=True, text=True, env=python_env(OUTLINES_CACHE_DIR=str(tmp_path)), timeout=120)
    assert done.returncode == 0, done.stderr
    rows = dict(re.findall(r"^(\S.*?)\s+(\d+/4)\s", done.stdout, re.MULTILINE))
    # The fake does the sum the wording suggests (right on the first 4 problems) whatever the route to the
    # number, and ends each answer with a mark: the patterns that allow one get every problem right.
    for pattern in ("reason, last number", "reason then answer, ended", "tool first, ended",
                    "few-shot, tool first, ended"):
        assert rows[pattern] == "4/4", (pattern, done.stdout)
    assert "while_loop" in done.stdout  # the trace summary follows the table


@pytest.fixture(scope="module")
def smollm2():  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    pytest.importorskip("xgrammar", reason="pip install -e '.[structured]'")
    from outlines import models
    from outlines.testing import ModelNotInstalledError, smollm2_gguf

    try:
        path = smollm2_gguf()
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))
    return models.transformers(path, chat=False, max_tokens=48, dtype="float32")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_reason_then_answer_answers_the_number_its_reasoning_computed(smollm2) -> None:  # type: ignore[no-untyped-def]
    import outlines

    patterns = load_example()
    question = outlines.string("question")
    solve = outlines.fn(patterns.chatml, name="prompt")(patterns.SOLVE, question)
    reasoning, answer = patterns.reason_then_answer(smollm2, solve)
    problems = [p["question"] for p in patterns.PROBLEMS[:9]]
    texts, answers = outlines.eval(reasoning, answer, givens={question: problems})
    # Where the reasoning ends on a computed result ("3 + 4 = 7 apples."), the constrained answer is that
    # result: the answer step reads the reasoning instead of cutting it short as a number alone does.
    computed = [(re.search(r"= (\d+)\D*$", t), a) for t, a in zip(texts, answers)]
    checked = [(found[1], a) for found, a in computed if found]
    assert checked, texts
    assert all(number == a for number, a in checked), (texts, answers)
    assert all(re.fullmatch(r"-?\d+", a) for a in answers), answers  # the mark that ended each number is gone


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_tool_first_agent_calls_the_tool_and_the_trace_counts_who_ran_out_of_turns(  # type: ignore[no-untyped-def]
        smollm2) -> None:
    import outlines

    patterns = load_example()
    question = outlines.string("question")
    tool = outlines.fn(patterns.chatml, name="prompt")(patterns.TOOL, question)
    transcript = patterns.agent(smollm2, tool, tool_first=True)
    with outlines.trace() as trace:
        transcripts, answers = outlines.eval(transcript, patterns.final_answer(transcript),
                                             givens={question: [p["question"] for p in patterns.PROBLEMS[:6]]})
    assert all(t.startswith("calculator[") and "\nObservation: " in t for t in transcripts), transcripts
    (counts,) = trace.loops_limited.values()
    assert counts["elements"] == 6 and counts["max_iter"] == 4
    assert counts["stopped"] == list(answers).count(None)  # an agent out of turns has no final answer
