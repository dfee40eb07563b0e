"""Properties: random DAGs scheduled equal a naive recursive evaluation, batched equals unbatched."""
from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

import outlines
from outlines import models


@outlines.fn(pure=True)
def mix(*parts):
    return "(" + "|".join(parts) + ")"


@outlines.fn
async def amix(a, b):
    return f"<{a}&{b}>"


def _fake(prompt):
    return f"[{prompt[-12:]}]"


def _fake_batch(prompts):
    return [_fake(p) for p in prompts]


@st.composite
def dags(draw):
    """A random DAG description: each node picks an op and 1-3 earlier nodes."""
    count = draw(st.integers(1, 25))
    nodes = []
    for i in range(count):
        kind = draw(st.sampled_from(["mix", "amix", "concat", "llm"]))
        arity = {"mix": draw(st.integers(1, 3)), "amix": 2, "concat": 2, "llm": 1}[kind]
        parents = [draw(st.integers(-2, i - 1)) for _ in range(arity)]  # -1, -2: the inputs
        nodes.append((kind, parents))
    return nodes


def _build(description, model, inputs):
    built = []
    for kind, parents in description:
        args = [inputs[-p - 1] if p < 0 else built[p] for p in parents]
        if kind == "mix":
            built.append(mix(*args))
        elif kind == "amix":
            built.append(amix(*args))
        elif kind == "concat":
            built.append(args[0] + args[1])
        else:
            built.append(model(args[0]))
    return built


def _naive(description, values):
    """A recursive evaluator over the description, independent of the scheduler."""
    memo = {}

    def value(index):
        if index < 0:
            return values[-index - 1]
        if index not in memo:
            kind, parents = description[index]
            args = [value(p) for p in parents]
            memo[index] = {
                "mix": lambda: "(" + "|".join(args) + ")",
                "amix": lambda: f"<{args[0]}&{args[1]}>",
                "concat": lambda: args[0] + args[1],
                "llm": lambda: _fake(args[0]),
            }[kind]()
        return memo[index]

    return [value(i) for i in range(len(description))]


@pytest.mark.filterwarnings("ignore:givens name input")  # random DAGs may not use every input
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.sampled_from([None, 1, 2, 5]))
def test_scheduled_random_dags_equal_naive_evaluation(description, max_batch):
    model = models.from_function(_fake_batch, batched=True, max_batch=max_batch, temperature=0)
    inputs = [outlines.string("x"), outlines.string("y")]
    outputs = _build(description, model, inputs)
    values = {"x": "X", "y": "Y"}
    scheduled = outlines.eval(*outputs, givens=values, cache=False)
    scheduled = scheduled if isinstance(scheduled, tuple) else (scheduled,)
    assert list(scheduled) == _naive(description, ["X", "Y"])


@pytest.mark.filterwarnings("ignore:givens name input")  # random DAGs may not use every input
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), st.integers(1, 4))
def test_batched_equals_unbatched_elementwise(description, width):
    batched = models.from_function(_fake_batch, batched=True, max_batch=3, temperature=0, name="m")
    single = models.from_function(_fake, temperature=0, name="m1")
    xs = [f"x{i}" for i in range(width)]
    inputs = [outlines.string("x"), outlines.string("y")]
    together = outlines.eval(*_build(description, batched, inputs), givens={"x": xs, "y": "Y"}, cache=False)
    apart = outlines.eval(*_build(description, single, inputs), givens={"x": xs, "y": "Y"}, cache=False)
    together = together if isinstance(together, tuple) else (together,)
    apart = apart if isinstance(apart, tuple) else (apart,)
    for a, b in zip(together, apart):
        assert list(getattr(a, "flat", [a])) == list(getattr(b, "flat", [b]))
