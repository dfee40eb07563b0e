"""Every entry point plans as ``outlines.eval`` does (``Plan``), and stacked equals flat through each.

The entry points: ``eval``, a ``Program`` (``outlines.compile``) called and
streamed, ``as_completed``, a ``while_loop`` or ``cond`` body, ``explain``
(whose prediction is read from the very plan the run uses) and the draw
numbers a picture shows (``Plan.draw_numbers``). The property builds small
random DAGs of every op kind (model calls, on text, on a chat conversation
and parsed into a structured value; pure and impure ``outlines.fn`` steps;
templates; ``+``; stack and index; ``where``; ``while_loop``; ``cond``) and
runs each through every entry point with stacking forced on
(``stack_min=1``) and off: the same values, the same number of calls of each
user function, the same draw numbers, and explain's batches (backend calls,
their sizes) equal to those the run sends.
"""
from __future__ import annotations

import json
from collections import Counter
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.graph.traversal import toposort
from outlines.runtime.control import _plan as sub_plan
from outlines.runtime.plan import Plan
from outlines.runtime.session import Evaluation, Options
from tests.fixtures.recording import RecordingBackend

STACK_MIN = outlines.common.config.Tuning.stack_min  # the default; tests set the tuning, not this
N = STACK_MIN + 5


def _answer(prompt: str) -> str:
    return f"<{prompt[-10:]}>"


# -- the entry points plan as eval does ---------------------------------------------------------

def test_explain_predicts_the_requests_a_run_of_stacked_chains_sends() -> None:
    """N chains stack into one node per step; a call reading a member's output is scattered its element."""
    recording = RecordingBackend(_answer, max_batch=16)
    llm = recording.model(temperature=0.7)
    outs = []
    for i in range(N):
        x: Any = outlines.constant(f"Q{i}:")
        for _ in range(3):
            x = llm(x)
        outs.append(x)
    tap = llm(outs[5].owner.inputs[0] + "!")  # left out of the families: it reads its element of a stacked node
    explained = outlines.explain(*outs, tap, cache=False)
    assert recording.batches == []  # a dry run sends nothing
    assert explained.batching_exact and explained.nodes_by_kind["generate"] == 4  # the run's plan: 3 stacked + 1
    with outlines.trace() as trace:
        outlines.eval(*outs, tap, cache=False)
    assert explained.requests == len(recording.batches) == len(trace.batches)
    assert sorted(b.size for b in explained.batches) == sorted(len(b) for b in recording.batches)
    assert explained.draws == trace.cache_misses == 3 * N + 1
    assert explained.nodes_by_kind["generate"] == sum(1 for n in trace.nodes.values() if n.kind == "generate")
    calls = [o.owner for o in outs] + [tap.owner]
    assert all(explained.draw_numbers[call.label] == (0, 0) for call in calls)  # each stacked call named
    assert len(explained.draw_numbers) == 3 * N + 1 and sum(len(b.nodes) for b in explained.batches[:1]) == N


def test_a_program_plans_once_stacked_and_picks_each_output() -> None:
    llm = RecordingBackend(_answer).model()
    q = outlines.string("q")
    calls = [llm(llm(outlines.constant(f"c{i}"))) for i in range(N)]
    outs = [*calls, calls[7] + q]  # a free input stacks nothing: the + reads its element of the stacked call
    program = outlines.compile([q], outs)
    assert len(program.plan.nodes) == 3 and len(program.plan.picks) == N  # two stacked calls and the +
    values = program("?")
    assert list(values) == list(outlines.eval(*outs, givens={q: "?"}))
    assert values[7] == "<<c7>>" and values[-1] == "<<c7>>?"
    assert len(program.plan.nodes) == 3  # the same plan, reused by each call
    assert sorted(outlines.as_completed(*outs, givens={q: "!"})) == [*enumerate(values[:-1]), (N, "<<c7>>!")]


def test_a_loop_body_is_planned_stacked(fresh_state: Any) -> None:
    outlines.common.config.set_tuning(stack_min=1)
    tail = outlines.fn(lambda s: s[-1:], pure=True, name="tail")
    short = outlines.fn(lambda s: len(s) < 6, pure=True, name="short")
    loop = outlines.while_loop(short, lambda s: s + tail(outlines.constant("xy")), init=outlines.constant("a"),
                               max_iter=9)
    evaluation = Evaluation.open(Options.check({}))  # the body's plan as the run gets it (built once, kept)
    body = sub_plan(evaluation, loop.owner.op, loop.owner.op.body.outputs)
    assert body.members and body.scatter  # tail("xy") is a stacked node of one, the + reads its element
    assert loop.eval() == "ayyyyy"


# -- the property: stacked equals flat through every entry point --------------------------------

CALLS: Counter[str] = Counter()  # calls of each user function, per run


def _model(prompt: str) -> str:
    CALLS["model"] += 1
    return f"[{prompt[-9:]}]"


def _pure(text: str) -> str:
    CALLS["pure"] += 1
    return text[::-1][:12]


def _impure(text: str) -> str:
    CALLS["impure"] += 1
    return text.upper()[-12:]


def _short(text: str) -> bool:
    CALLS["short"] += 1
    return len(text) < 14


def _even(text: str) -> bool:
    CALLS["even"] += 1
    return len(text) % 2 == 0


def _json_model(prompt: str) -> str:
    CALLS["json"] += 1
    return json.dumps({"a": prompt[-9:]})


def _field(value: dict[str, str]) -> str:
    CALLS["field"] += 1
    return value["a"]


LLM = models.from_function(_model, name="entry-points")
JSON_LLM = models.from_function(_json_model, name="entry-points-json")
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
FIELD = outlines.fn(_field, pure=True, name="field")
PURE = outlines.fn(_pure, pure=True, name="pure")
IMPURE = outlines.fn(_impure, name="impure")  # not declared pure: the default
SHORT = outlines.fn(_short, pure=True, name="short")
EVEN = outlines.fn(_even, pure=True, name="even")


@outlines.prompt
def _template(a, b):
    """{{ a }} then {{ b }}"""


#: Each kind of step: how it builds on its two parents (the second unused by unary steps).
KINDS: dict[str, Callable[[Any, Any], Any]] = {
    "llm": lambda a, b: LLM(a),
    "chat": lambda a, b: LLM(outlines.chat.system(b) + outlines.chat.user(a)),
    "parse": lambda a, b: FIELD(JSON_LLM(a, json_schema=SCHEMA)),  # a structured output: the call, then Parse
    "where": lambda a, b: outlines.where(EVEN(a), a, b + "w"),
    "template": lambda a, b: _template(a, b),
    "concat": lambda a, b: a + b,
    "index": lambda a, b: outlines.stack([a, b + "i"], axis=-1)[..., 1],  # elementwise in a body too
    "pure": lambda a, b: PURE(a),
    "impure": lambda a, b: IMPURE(a),
    "loop": lambda a, b: outlines.while_loop(SHORT, lambda s: PURE(LLM(s)) + "~", init=a, max_iter=2),
    "cond": lambda a, b: outlines.cond(EVEN(a), lambda s: LLM(s + "e"), lambda s: s + "o", a),
}


@st.composite
def dags(draw: Any) -> tuple[list[tuple[str, int, int]], int]:
    """Steps (kind, parent, parent), a parent < 0 being a base value; and how many replicas of the DAG."""
    steps = []
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(sorted(KINDS)))
        steps.append((kind, draw(st.integers(-3, i - 1)), draw(st.integers(-3, i - 1))))
    return steps, draw(st.integers(1, 3))


def _build(steps: list[tuple[str, int, int]], bases: list[Any]) -> list[Any]:
    built: list[Any] = []
    for kind, first, second in steps:
        a, b = (bases[-p - 1] if p < 0 else built[p] for p in (first, second))
        built.append(KINDS[kind](a, b))
    return built


def _replicas(steps: list[tuple[str, int, int]], copies: int, q: Any) -> list[Any]:
    """The DAG built ``copies`` times over its own constants (siblings that stack), and once over ``q``."""
    outs = []
    for r in range(copies):
        outs.extend(_build(steps, [outlines.constant(f"k{r}"), outlines.constant(f"m{r}"), outlines.constant("s")]))
    return outs + _build(steps, [q, outlines.constant("m"), outlines.constant("s")])


def _fold(outs: list[Any]) -> Any:
    total = outs[0]
    for out in outs[1:]:
        total = total + "|" + out
    return total


def _entry_points(steps: list[tuple[str, int, int]], copies: int) -> dict[str, Any]:
    """What each entry point gives for a fresh graph (plans are cached on the graph: never shared across modes)."""
    seen: dict[str, Any] = {}
    runs: dict[str, Callable[[], Any]] = {}
    q = outlines.string("q")
    outs = _replicas(steps, copies, q)
    runs["eval"] = lambda: list(outlines.eval(*outs, givens={q: "Q"}, cache=False))
    runs["program"] = lambda: list(outlines.compile([q], outs, cache=False)("Q"))
    runs["as_completed"] = lambda: sorted(outlines.as_completed(*outs, givens={q: "Q"}, cache=False))
    pair = PURE(outlines.constant(np.array(["x", "yy"], dtype=object)))  # as long as q: stacked, then picked
    streamed = outlines.compile([q], [_fold([q, *outs]), pair], cache=False)  # each output with each element of q
    runs["stream"] = lambda: sorted(streamed.stream(["Q", "RR"], chunk_size=2))
    looped = outlines.while_loop(SHORT, lambda s: _fold([s, *_replicas(steps, copies, s)]),
                                 init=outlines.constant("Q"), max_iter=2)
    runs["loop body"] = lambda: outlines.eval(looped, cache=False)
    branched = outlines.cond(EVEN(q), lambda s: _fold([s, *_replicas(steps, copies, s)]), lambda s: s + "!", q)
    runs["cond body"] = lambda: list(outlines.eval(branched, givens={q: ["QQ", "Q"]}, cache=False))
    for name, run in runs.items():
        CALLS.clear()
        seen[name] = (run(), dict(CALLS))
    CALLS.clear()
    explained = outlines.explain(*outs, givens={q: "Q"}, cache=False)
    with outlines.trace() as trace:
        outlines.eval(*outs, givens={q: "Q"}, cache=False)
    if not explained.control and explained.batching_exact:  # loops are ranges; a slow step may split a batch
        event("explain's batches compared with the run's")
        predicted, sent = sorted(b.size for b in explained.batches), sorted(b.size for b in trace.batches)
        # Prompts computed from unknown values are counted by shape: the run may find some of them equal.
        assert predicted == sent if not explained.unknown_draws else len(predicted) == len(sent)
    seen["explain"] = explained.draws, _by_place(explained.draw_numbers, outs, "label")  # loops aside (a range)
    seen["draw_numbers"] = _by_place(Plan(outs).draw_numbers(), outs, "order")
    return seen


def _by_place(spans: dict[Any, tuple[int, int]], outs: list[Any], key: str) -> dict[int, tuple[int, int]]:
    """Draw spans keyed by their call's place in the graph (not its label or order: each graph is built anew)."""
    place = {getattr(node, key): number for number, node in enumerate(toposort(outs))}
    return {place[call]: span for call, span in spans.items()}


@pytest.mark.filterwarnings("ignore:givens name input")  # a DAG may not read q
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(dag=dags())
@example(dag=([("cond", -1, -1), ("llm", 0, 0)], 1))  # a stacked cond's outputs: its members' along a new axis
@example(dag=([("parse", -1, -2), ("where", 0, -3), ("chat", 1, 0)], 2))  # the kinds added last, every run
def test_stacked_equals_flat_through_every_entry_point(dag: Any) -> None:
    steps, copies = dag
    with outlines.common.config.tuning(stack_min=10**9):
        flat = _entry_points(steps, copies)
    with outlines.common.config.tuning(stack_min=1):
        stacked = _entry_points(steps, copies)
    for name in flat:
        assert stacked[name] == flat[name], name
