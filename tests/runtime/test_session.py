"""One evaluation's state (``outlines.runtime.session``): ``Options`` checked once, the ``Evaluation`` handed down."""
from __future__ import annotations

import asyncio
import warnings
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


def test_a_misspelled_option_is_refused_naming_the_closest_one() -> None:
    with pytest.raises(TypeError, match=r"unknown evaluation option 'job'; did you mean jobs\?"):
        Options.check({"job": True})
    with pytest.raises(TypeError, match=r"unknown evaluation option 'max_concurency'; did you mean max_concurrency\?"):
        outlines.eval(outlines.constant("a") + "b", max_concurency=2)


# -- provider jobs: jobs= (batch= is its deprecated alias, for one release) --------------
def _echo() -> Any:
    return outlines.models.from_function(lambda prompt: prompt.upper(), name="upper")


def test_jobs_is_the_option_for_provider_jobs() -> None:
    settings = outlines.Jobs(run="labels")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name warns about nothing
        assert Options.check({"jobs": settings}).jobs is settings
        assert Evaluation.open(Options.check({"jobs": True, "cache": False})).jobs == outlines.Jobs()
        assert Evaluation.open(Options(cache=False)).jobs is None
        # A backend without provider jobs stays live under jobs=True.
        assert outlines.eval(_echo()(outlines.constant("hi")), jobs=True, cache=False) == "HI"
    with pytest.raises(TypeError, match=r"jobs= must be True, False or outlines.Jobs"):
        Options.check({"jobs": "yes"})


def test_batch_still_works_but_warns_at_the_callers_line_naming_jobs() -> None:
    settings = outlines.Jobs(run="labels")
    with pytest.warns(DeprecationWarning, match=r"batch= is deprecated .* use jobs=") as caught:
        assert Options.check({"batch": settings}).jobs is settings
    with pytest.warns(DeprecationWarning, match="use jobs=") as caught:
        assert outlines.eval(_echo()(outlines.constant("hi")), batch=True, cache=False) == "HI"
    assert [w.filename for w in caught] == [__file__]  # the user's line, not the package's
    program = outlines.compile(lambda q: _echo()(q), cache=False)
    with pytest.warns(DeprecationWarning, match="use jobs=") as caught:
        assert program.with_options(batch=settings).options.jobs is settings
    assert [w.filename for w in caught] == [__file__]


def test_jobs_and_batch_together_are_refused_naming_both() -> None:
    with pytest.raises(TypeError, match=r"give jobs= or batch= \(its deprecated alias\), not both"):
        Options.check({"jobs": True, "batch": True})
    with pytest.raises(TypeError, match=r"give jobs= or batch="):
        outlines.eval(outlines.constant("a"), jobs=True, batch=True)


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
