"""Properties: random DAGs scheduled equal a naive recursive evaluation, batched equals unbatched."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
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


@outlines.fn(signature="(n)->()")
def _vote(items):
    return max(sorted(items), key=list(items).count)


@outlines.prompt
def _judge(task, candidates):
    """{{ task }}:{{ candidates | join(",") }}"""


@st.composite
def sampling_programs(draw):
    """Steps over values of known per-input rank: sample (+1), pair, judge or vote (-1)."""
    steps = []
    ranks = [0]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["sample", "pair", "judge", "vote"]))
        i = draw(st.integers(0, len(ranks) - 1))
        j = draw(st.integers(0, len(ranks) - 1))
        if kind == "sample" and ranks[i] < 2:
            steps.append(("sample", i, draw(st.integers(1, 3))))
            ranks.append(ranks[i] + 1)  # an explicit num_samples adds its axis, 1 included
        elif kind in ("judge", "vote") and ranks[i] >= 1:
            steps.append((kind, i, j))
            ranks.append(ranks[i] - 1 if kind == "vote" else max(ranks[i] - 1, ranks[j]))
        elif kind == "pair":
            steps.append(("pair", i, j))
            ranks.append(max(ranks[i], ranks[j]))
    return steps


def _program(steps, model):
    def program(x):
        values = [x]
        for kind, i, j in steps:
            if kind == "sample":
                values.append(model(values[i], num_samples=j))
            elif kind == "pair":
                values.append(values[i] + "&" + values[j])
            elif kind == "vote":
                values.append(_vote(values[i]))
            else:
                values.append(_judge(values[j], values[i]))
        return values[-1]

    return outlines.compile(program)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=sampling_programs(), inputs=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3))
def test_a_program_over_t_inputs_equals_the_program_per_input(steps, inputs):
    # the sample axis is appended last, and operands pair on leading axes, so
    # adding the input axis in front never changes which values meet
    model = models.from_function(_fake_batch, batched=True, name="fake")
    program = _program(steps, model)
    try:
        alone_first = program(inputs[0])
    except outlines.GraphBuildError:  # samples of different counts cannot pair: refused both ways
        with pytest.raises(outlines.GraphBuildError):
            program(inputs)
        return
    together = program(inputs)
    assert np.asarray(together[0], dtype=object).tolist() == np.asarray(alone_first, dtype=object).tolist()
    for i, x in enumerate(inputs):
        alone = program(x)
        row = together[i]
        assert np.asarray(row, dtype=object).tolist() == np.asarray(alone, dtype=object).tolist()
