"""The one planning path: the stacked plan computes exactly what the flat plan does, impure steps included.

``Plan`` stacks the families of the build-time table
(``outlines.graph.families``) whatever objects their ops are; an impure
``outlines.fn`` step stacks like any elementwise step, yet runs once per
element, is never merged, and fails element by element.
"""
from __future__ import annotations

import collections
import re
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.common.errors import Failure, NodeError
from outlines.graph.ops import Concat, Index
from outlines.runtime.plan import Plan
from tests.fixtures.recording import RecordingBackend

N = outlines.common.config.Tuning.stack_min + 3


class _Numbered(RecordingBackend):
    """Replies with the prompt and its draw number: a draw numbered apart from the flat plan's shows in the value."""

    async def generate(self, draws: Any, report: Any) -> list[str]:
        self.batches.append([d.prompt for d in draws])
        return [f"{d.prompt[-12:]}~{d.draw}" for d in draws]


@outlines.prompt
def _say(v):  # type: ignore[no-untyped-def]
    """Say {{ v }}"""


_FORK = np.array(["<", ">"], dtype=object)


class _Counted:
    """The Python functions a graph calls, each counting its calls (per function, per argument)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()

        def model(prompt: str) -> str:
            self.calls["model", prompt] += 1
            return prompt[-10:] + "."

        def pure(text: str) -> str:
            self.calls["pure", text] += 1
            return text.upper()

        def impure(text: str) -> str:
            self.calls["impure", text] += 1
            return text + "'"

        self.llm = models.from_function(model, name="counted")
        self.sample = _Numbered(name="numbered").model(temperature=0.7)
        self.pure = outlines.fn(pure, pure=True)
        self.impure = outlines.fn(impure)


#: Each step kind: how it builds a value from the values ``a`` and ``b`` of a chain (``i``: the chain's number).
_KINDS: dict[str, Callable[[_Counted, Any, Any, int], Any]] = {
    "llm": lambda c, a, b, i: c.llm(a),
    "sample": lambda c, a, b, i: c.sample(a),
    "template": lambda c, a, b, i: _say(a),
    "concat": lambda c, a, b, i: a + b,
    "concat-constant": lambda c, a, b, i: Concat()(a, "!"),  # a new op object each time
    "shared": lambda c, a, b, i: c.llm(outlines.constant("one prompt for all")) + a,
    "index": lambda c, a, b, i: (a + outlines.constant(_FORK))[i % 2],
    "pure": lambda c, a, b, i: c.pure(a),
    "impure": lambda c, a, b, i: c.impure(a),
}

_STEP = st.tuples(st.sampled_from(sorted(_KINDS)), st.integers(0, 10**6), st.integers(0, 10**6))


def _build(counted: _Counted, recipes: list[list[tuple[str, int, int]]], n: int, taps: list[tuple[int, int]]
           ) -> list[Any]:
    """``n`` chains, chain ``i`` built by recipe ``i % len(recipes)``; the outputs: each chain's last value, then taps."""
    chains = []
    for i in range(n):
        values: list[Any] = [outlines.constant(f"q{i % 3}" if i % 4 == 3 else f"q{i}")]  # some chains repeat a prompt
        for kind, a, b in recipes[i % len(recipes)]:
            values.append(_KINDS[kind](counted, values[a % len(values)], values[b % len(values)], i))
        chains.append(values)
    outs = [values[-1] for values in chains]
    outs += [chains[c % n][1 + v % (len(chains[c % n]) - 1)] for c, v in taps if len(chains[c % n]) > 1]
    return outs


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.reshape(-1).tolist()]
    return value


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    recipes=st.lists(st.lists(_STEP, min_size=1, max_size=5), min_size=1, max_size=2),
    n=st.integers(1, 7),
    taps=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6)), max_size=3),
)
def test_the_stacked_plan_computes_exactly_what_the_flat_plan_does(
        recipes: list[list[tuple[str, int, int]]], n: int, taps: list[tuple[int, int]]) -> None:
    """Random DAGs of every cheap op kind, stacked from one member up: the same values and the same calls.

    Python steps are called as often, on the same arguments (a pure step's
    equal nodes merged, an impure one's never); the model function sees the
    same prompts (how often a repeated prompt is sent is batch timing);
    sampled draws carry the same numbers.
    """
    seen = []
    for stack_min in (10**9, 1):  # flat, then every family stacked
        counted = _Counted()
        outs = _build(counted, recipes, n, taps)
        plan = Plan(outs, stack_min=stack_min)
        if stack_min == 1:
            event(f"{len(plan.members)} stacked node(s)")
        with outlines.common.config.tuning(stack_min=stack_min):  # what outlines.eval plans with
            values = [_plain(v) for v in outlines.eval(*outs, cache=False)]
        steps = {key: count for key, count in counted.calls.items() if key[0] != "model"}
        prompts = sorted({key[1] for key in counted.calls if key[0] == "model"})
        seen.append((values, steps, prompts))
    assert seen[1] == seen[0]


def _chains(llm: Any, step: Any, n: int = N) -> tuple[list[Any], list[Any]]:
    """``n`` chains ``llm(step(llm(q)))``, and each chain's step used a second time on the same input."""
    firsts = [llm(outlines.constant(f"Q{i}:")) for i in range(n)]
    return [llm(step(x)) for x in firsts], [step(x) + "?" for x in firsts]


def test_an_impure_step_stacks_runs_once_per_element_and_is_never_merged() -> None:
    calls: list[str] = []

    def step(text: str) -> str:
        calls.append(text)
        return text + "!"

    impure = outlines.fn(step)
    recording = RecordingBackend(name="impure-once")
    outs, again = _chains(recording.model(), impure)
    plan = Plan(outs + again)
    steps = [node for node in plan.nodes if node.op.name == "step"]
    assert len(plan.nodes) == 5 and len(steps) == 2  # one node per step of the chains, the second use its own
    assert [m.label for m in plan.members[id(steps[0])]] == [o.owner.inputs[0].owner.label for o in outs]
    values = outlines.eval(*outs, *again, cache=False)
    assert sorted(calls) == sorted(2 * [f"Q{i}:." for i in range(N)])  # each use once per element, never merged
    assert values[0] == "Q0:.!." and values[N] == "Q0:.!?"
    assert recording.sizes == [N, N]  # one batch per model call of the chains


def test_an_impure_steps_failing_element_fails_alone_naming_its_own_node() -> None:
    calls: list[str] = []

    def step(text: str) -> str:
        calls.append(text)
        if text.startswith("Q7:"):
            raise ValueError("no sevens")
        return text + "!"

    impure = outlines.fn(step)
    recording = RecordingBackend(name="impure-fails")
    outs, _ = _chains(recording.model(), impure)
    assert len([node for node in Plan(outs).nodes if node.op.name == "step"]) == 1
    got = outlines.eval(*outs, cache=False, errors="return")
    own = outs[7].owner.inputs[0].owner  # chain 7's step, as built
    failed = [i for i, v in enumerate(got) if isinstance(v, Failure)]
    assert failed == [7] and got[7].root.node == own.label and got[7].root.error_type == "ValueError"
    assert len(calls) == N and recording.sizes == [N - 1, N]  # the others sent on, in one batch
    calls.clear()
    with pytest.raises(NodeError, match=re.escape(own.label)):
        outlines.eval(*outs, cache=False)


def test_equal_ops_built_as_separate_objects_stack_into_one_node() -> None:
    """No op is shared: ``+`` and ``v[k]`` make a new op per use, and their uses still stack as one family."""
    recording = RecordingBackend(name="separate")
    llm = recording.model()
    outs = [llm(Index.create(1)(Concat()(llm(outlines.constant(f"Q{i}")), outlines.constant(_FORK))))
            for i in range(N)]
    assert len({id(o.owner.inputs[0].owner.op) for o in outs}) == N
    plan = Plan(outs)
    assert [node.op.name for node in plan.nodes][1:3] == ["Concat", "Index[:, 1]"] and len(plan.nodes) == 4
    assert outlines.eval(*outs, cache=False)[3] == "Q3.>."
    assert recording.sizes == [N, N]


def test_outputs_of_two_families_interleaved_pick_their_own_stacked_node_and_element() -> None:
    """The table path picks by family then rank: outputs of one family (one stacked node) or of several, mixed."""
    llm = RecordingBackend(name="two").model()
    deep = [llm(llm(outlines.constant(f"D{i}"))) for i in range(N)]
    flat = [llm.backend.model(temperature=0.1)(outlines.constant(f"F{i}")) for i in range(N)]
    one = Plan(deep[::-1])
    assert len(one.nodes) == 2 and set(map(id, one.outputs)) == {id(one.nodes[1].outputs[0])}
    assert [one.picks[i][1] for i in range(N)] == list(range(N))[::-1]
    mixed = [v for pair in zip(deep, flat) for v in pair]
    plan = Plan(mixed)
    assert len(plan.nodes) == 3 and len(plan.picks) == 2 * N
    heads = {id(plan.members[id(node)][0]): node.outputs[0] for node in plan.nodes}
    for at in range(2 * N):
        stacked, element = plan.picks[at]
        assert stacked is plan.outputs[at] is heads[id((deep if at % 2 == 0 else flat)[0].owner)]
        assert element == at // 2
