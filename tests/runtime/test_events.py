"""The ``Recorder`` protocol, its no-op ``Listener`` and the one ``FanOut`` (``outlines.runtime.events``)."""
from __future__ import annotations

import asyncio
import inspect
from typing import Any

import outlines
from outlines import models
from outlines.runtime.events import NULL, FanOut, Listener, Recorder, compose, listening
from outlines.runtime.plan import Plan, bind_givens
from outlines.runtime.scheduler import schedule
from outlines.runtime.session import Evaluation, Options
from tests.fixtures.recording import RecordingBackend

EVENTS = sorted(name for name, value in vars(Recorder).items() if callable(value) and not name.startswith("_"))


def test_listener_and_fan_out_implement_every_event_with_its_signature() -> None:
    assert len(EVENTS) == 15  # loop_limited: issue 42; branch_counted: issue 41
    for name in EVENTS:
        protocol = inspect.signature(getattr(Recorder, name))
        for implementation in (Listener, FanOut):
            assert name in vars(implementation), f"{implementation.__name__} lacks {name}"
            assert inspect.signature(getattr(implementation, name)) == protocol, (implementation.__name__, name)


class Log(Listener):
    """Records every event it gets, by name."""

    def __init__(self, log: list[tuple[str, str]], tag: str) -> None:
        self.log, self.tag = log, tag

    def __getattribute__(self, name: str) -> Any:
        if name in EVENTS:
            return lambda *args, **kwargs: self.log.append((self.tag, name))
        return super().__getattribute__(name)


def test_the_fan_out_passes_each_event_to_each_listener_in_order() -> None:
    log: list[tuple[str, str]] = []
    fan_out = compose(Log(log, "a"), None, Log(log, "b"))
    assert isinstance(fan_out, FanOut)
    for name in EVENTS:
        arguments = [None] * (len(inspect.signature(getattr(Recorder, name)).parameters) - 1)
        getattr(fan_out, name)(*arguments)
    assert log == [(tag, name) for name in EVENTS for tag in "ab"]


def test_compose_gives_null_the_only_listener_or_a_fan_out() -> None:
    only = Listener()
    assert compose() is NULL and compose(None, NULL) is NULL
    assert compose(only, None) is only and compose(NULL, only) is only
    assert compose(only, Listener()).listeners[0] is only  # type: ignore[attr-defined]


def test_an_evaluation_reports_to_the_trace_and_to_its_own_listeners_through_one_recorder() -> None:
    """A trace and a stream's watcher each see the whole evaluation, once."""
    llm = models.Model(RecordingBackend())
    q = outlines.string("q")
    with outlines.trace() as trace:
        seen = sorted(outlines.as_completed(llm(q), llm(q + "!"), givens={"q": ["a", "b"]}, cache=False))
    assert [position for position, _ in seen] == [0, 1]
    assert len(trace.evals) == 1 and trace.evals[0].end is not None
    assert len(trace.batches) == 1 and trace.batches[0].size == 4


class Starts(Listener):
    """Acts on node starts only: every other event is ``Listener``'s no-op."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def node_started(self, node: Any, t: float) -> None:
        self.started.append(node.label)


def test_listening_gives_the_event_of_a_listener_that_acts_on_it_and_none_for_a_no_op() -> None:
    starts, log = Starts(), Log([], "a")
    assert listening(NULL, "node_started") is None and listening(Listener(), "node_finished") is None
    assert listening(starts, "node_finished") is None
    method = listening(starts, "node_started")
    assert method is not None and method.__self__ is starts  # type: ignore[attr-defined]
    assert listening(log, "node_finished") is not None  # an override made at run time is heard too
    assert listening(compose(starts, log), "node_finished") is not None  # a fan-out passes every event on


def test_a_schedule_reports_node_events_to_a_listener_that_overrides_only_some() -> None:
    """The scheduler skips the no-op events (``listening``), never an overridden one."""
    step = outlines.fn(lambda x: x + "+", name="step")
    outputs = [step(step(f"s{i}")) for i in range(3)]
    plan = Plan(outputs)
    starts, log = Starts(), Log([], "log")
    for listener in (starts, compose(starts, log)):
        starts.started.clear()
        evaluation = Evaluation.open(Options(cache=False), listener)
        values = asyncio.run(schedule(plan, bind_givens(plan, None), evaluation))[0]
        assert values == ["s0++", "s1++", "s2++"]
        assert sorted(starts.started) == sorted(node.label for node in plan.nodes)
    assert [name for _, name in log.log].count("node_finished") == len(plan.nodes)
