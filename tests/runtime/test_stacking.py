"""Sibling chains stacked into array nodes by ``Plan(stack=True)`` (what ``outlines.eval`` plans).

Stacking must be invisible but for speed: the same values, batches, draw
numbers, cache entries and failure labels as the unstacked plan.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.errors import Failure, NodeError
from outlines.runtime import plan as plan_module
from outlines.runtime.plan import Plan
from tests.fixtures.recording import RecordingBackend

STACK_MIN = plan_module.STACK_MIN  # read once: tests patch the module's
N = STACK_MIN + 22


def chains(llm: Any, n: int = N, depth: int = 3, prefix: str = "Q") -> list[Any]:
    outs = []
    for i in range(n):
        x: Any = outlines.constant(f"{prefix}{i}:")
        for _ in range(depth):
            x = llm(x)
        outs.append(x)
    return outs


def observe(build: Callable[[Any], list[Any]], tmp_path: Path, stack: bool, monkeypatch: pytest.MonkeyPatch,
            **options: Any) -> tuple[Any, ...]:
    """Values (failures without creation numbers), batches and cache counts of two evals, stacked or not."""
    monkeypatch.setattr(plan_module, "STACK_MIN", STACK_MIN if stack else 10**9)
    backend = RecordingBackend(name="stack")
    llm = backend.model(temperature=0.7)
    cache = Cache(tmp_path / ("stacked" if stack else "flat"))
    seen = []
    for _ in range(2):  # cold, then warm
        with outlines.trace() as trace:
            values = outlines.eval(*build(llm), cache=cache, **options)
        seen.append(([_plain(v) for v in values], trace.cache_hits, trace.cache_misses))
        cache.flush()
    return tuple(seen), backend.batches


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, Failure):
        return "failure", value.error_type, re.sub(r"#\d+", "#N", value.message)
    return value


def test_chains_plan_as_one_node_per_step() -> None:
    llm = RecordingBackend(name="plan").model()
    outs = chains(llm)
    plan = Plan(outs, stack=True)
    assert len(plan.nodes) == 3 and plan.indegree == [0, 1, 1]
    assert set(plan.picks) == set(range(N)) and [k for _, k in plan.picks.values()] == list(range(N))
    assert [m.label for m in plan.members[id(plan.nodes[0])]] == [o.owner.inputs[0].owner.inputs[0].owner.label
                                                                  for o in outs]
    assert len(Plan(outs).nodes) == 3 * N  # explain and stream plan without stacking
    tapped = outs + [outlines.fn(str.upper)(outs[5].owner.inputs[0]), outlines.fn(str.lower)(outs[5])]
    names = [n.op.name for n in Plan(tapped, stack=True).nodes]  # a node left out reads its element
    assert len(names) == 7 and names.count("Index[5]") == 2
    assert len(Plan(chains(llm, n=STACK_MIN - 1), stack=True).nodes) == 3 * (STACK_MIN - 1)


@pytest.mark.parametrize("shape", ["chains", "tapped", "ragged", "samples", "repeated", "mixed-ops"])
def test_stacked_and_flat_plans_evaluate_alike(shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def build(llm: Any) -> list[Any]:
        outs = chains(llm)
        if shape == "tapped":  # one middle value feeds a Python step: its families stay flat
            middle = outs[5].owner.inputs[0]
            outs.append(outlines.fn(str.upper)(middle))
        elif shape == "ragged":  # some chains one step longer: not member for member
            outs += [llm(o) for o in outs[::7]]
        elif shape == "samples":  # calls with samples are never stacked
            outs += [llm(outlines.constant(f"S{i}"), num_samples=2) for i in range(N)]
        elif shape == "repeated":  # the same prompt twice draws twice (draw offsets): left flat
            outs += chains(llm, prefix="Q", depth=1)
        elif shape == "mixed-ops":
            other = llm.backend.model(temperature=0.1)
            outs += chains(other, depth=2, prefix="M")
        return outs

    flat = observe(build, tmp_path, False, monkeypatch)
    stacked = observe(build, tmp_path, True, monkeypatch)
    assert stacked == flat
    (cold, _, misses), (warm, hits, _) = flat[0]
    assert warm == cold and hits == misses > 0


def test_a_failing_call_is_named_as_in_the_flat_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def picky(prompt: str) -> str:
        if prompt == "Q7:.":
            raise ValueError("no sevens")
        return prompt + "."

    llm = models.from_function(picky, name="picky")
    outs = chains(llm)
    failing = outs[7].owner.inputs[0].owner  # the second call of chain 7
    for stack in (False, True):
        monkeypatch.setattr(plan_module, "STACK_MIN", STACK_MIN if stack else 10**9)
        values = outlines.eval(*outs, cache=False, errors="return")
        assert isinstance(values[7], Failure) and failing.label in values[7].message
        assert [i for i, v in enumerate(values) if isinstance(v, Failure)] == [7]
        with pytest.raises(NodeError, match=re.escape(failing.label)):
            outlines.eval(*outs, cache=False)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(STACK_MIN, STACK_MIN + 40),
    depth=st.integers(1, 3),
    taps=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2)), max_size=3),
)
def test_stacking_equals_sequential_evaluation(n: int, depth: int, taps: list[tuple[int, int]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    backend = RecordingBackend(name="property")
    llm = backend.model()
    outs = chains(llm, n=n, depth=depth)
    for chain, step in taps:  # a Python step reads some chain's value at some depth
        x = outs[chain % n]
        for _ in range(min(step, depth - 1)):
            x = x.owner.inputs[0]
        outs.append(outlines.fn(str.upper)(x))
    expected = []
    for i in range(n):
        text = f"Q{i}:"
        for _ in range(depth):
            text += "."
        expected.append(text)
    values = outlines.eval(*outs, cache=False)
    assert list(values[:n]) == expected
    for (chain, step), value in zip(taps, values[n:]):
        assert value == (f"Q{chain % n}:" + "." * (depth - min(step, depth - 1))).upper()
    assert len(backend.batches) == depth  # one batch per step, stacked or not
