"""One evaluation's state (``outlines.runtime.session``): ``Options`` checked once, the ``Evaluation`` handed down."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

import outlines
from outlines.runtime.events import NULL, Listener
from outlines.runtime.session import DRAW_SHIFT, TAG_BITS, Evaluation, Options
from tests.fixtures.recording import RecordingBackend


def test_options_are_checked_once_with_clear_errors() -> None:
    assert Options.check({}) == Options()
    assert Options.check({"errors": "return", "max_concurrency": 4}).max_concurrency == 4
    with pytest.raises(TypeError, match="unknown evaluation option.*colour"):
        Options.check({"colour": "red"})
    with pytest.raises(ValueError, match="max_concurrency must be a positive integer"):
        Options.check({"max_concurrency": True})
    with pytest.raises(ValueError, match="errors must be 'raise' or 'return', got 'ignore'"):
        Options.check({"errors": "ignore"})
    with pytest.raises(TypeError, match="budget must be an outlines.Budget"):
        Options.check({"budget": 10})
    changed = Options(errors="return").with_changes(cache=False)
    assert (changed.errors, changed.cache) == ("return", False)
    with pytest.raises(ValueError, match="errors must be"):
        Options().with_changes(errors="x")


def test_a_child_shares_the_state_in_the_draw_namespace_of_its_iteration() -> None:
    evaluation = Evaluation.open(Options(cache=False, max_concurrency=2))
    child = evaluation.child(0)
    grandchild = child.child(4)
    assert (child.draw_base, grandchild.draw_base) == (1, (1 << TAG_BITS) + 5)
    assert grandchild.draw_shift == grandchild.draw_base << DRAW_SHIFT and evaluation.draw_shift == 0
    backend = RecordingBackend(max_concurrency=3)
    assert grandchild.limit_for(backend) is evaluation.limit_for(backend)  # one bound per backend
    assert grandchild.request_limit is evaluation.request_limit and grandchild.recorder is evaluation.recorder
    assert [evaluation.batch_id(), child.batch_id(), grandchild.batch_id()] == [1, 2, 3]  # one numbering
    child.uses(backend)
    assert list(evaluation.backends) == [backend]


class Events(Listener):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def eval_started(self, plan: Any, t: float) -> None:
        self.seen.append("started")

    def eval_finished(self, t: float, error: BaseException | None) -> None:
        self.seen.append(f"finished {type(error).__name__ if error else ''}".strip())


class Closing(RecordingBackend):
    closed = 0

    async def aclose(self) -> None:
        Closing.closed += 1


def test_running_reports_the_run_once_and_closes_its_backends_once() -> None:
    events = Events()
    evaluation = Evaluation.open(Options(cache=False), events)
    assert evaluation.recorder is events and evaluation.listening
    assert not Evaluation.open(Options(cache=False)).listening and Evaluation.open(Options()).recorder is NULL
    backend = Closing()
    evaluation.uses(backend)
    evaluation.uses(backend)

    async def run(fail: bool) -> None:
        async with evaluation.running(plan=None):
            if fail:
                raise KeyError("boom")

    asyncio.run(run(False))
    with pytest.raises(KeyError):
        asyncio.run(run(True))
    assert events.seen == ["started", "finished", "started", "finished KeyError"] and Closing.closed == 2


def test_a_loops_iterations_report_to_the_evaluation_with_its_batch_numbering() -> None:
    llm = RecordingBackend().model(temperature=0.5)
    step = outlines.fn(lambda text: text + "-")

    def body(text: Any) -> Any:
        return step(llm(text))

    final = outlines.while_loop(outlines.fn(lambda text: len(text) < 8), body, init=outlines.string("q"), max_iter=3)
    with outlines.trace() as trace:
        outlines.eval(final, llm(final), givens={"q": ["a", "b"]}, cache=False)
    assert len(trace.evals) == 1  # the iterations are schedules of one evaluation
    assert all(batch.end is not None for batch in trace.batches)  # each batch's end found by its evaluation-wide id
    assert [it.batches for it in trace.iterations] == [1, 1, 1] and len(trace.batches) == 4
