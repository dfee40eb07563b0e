"""One conformance suite, run against every backend.

A backend's test module provides a fixture ``conformance`` yielding an object
with:

- ``model(**defaults) -> outlines Model`` : a model on that backend;
- ``calls() -> int`` : how many backend requests (or generate calls) were made
  so far;
- ``batches() -> int`` : how many ``generate`` calls (batches) the backend
  received so far (models built on ``tests.fixtures.recording.RecordingBackend``);
- ``distinct_samples: bool`` : whether sampled draws of one prompt are expected
  to differ (false for backends that may legitimately repeat themselves);
- ``failing_model() -> Model`` : a model whose calls fail.

and does ``from tests.conformance.suite import *`` to collect these tests.
"""
from __future__ import annotations

import numpy as np
import pytest

import outlines

__all__ = [
    "test_array_prompt_shape",
    "test_batched_siblings_share_requests",
    "test_draws_are_independent_and_numbered",
    "test_failure_names_the_node",
    "test_greedy_collapses_draws",
    "test_returns_text",
    "test_samples_add_trailing_axis",
    "test_same_results_through_program",
    "test_siblings_go_out_as_one_batch",
]


def test_returns_text(conformance):
    model = conformance.model(max_tokens=8)
    result = model("Hello").eval(cache=False)
    assert isinstance(result, str)


def test_array_prompt_shape(conformance):
    model = conformance.model(max_tokens=4)
    prompts = np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)
    result = model(outlines.constant(prompts)).eval(cache=False)
    assert result.shape == (2, 3)
    assert all(isinstance(x, str) for x in result.flat)


def test_samples_add_trailing_axis(conformance):
    model = conformance.model(max_tokens=4)
    assert model("x", num_samples=3).eval(cache=False).shape == (3,)
    result = model(["x", "y"], num_samples=2).eval(cache=False)
    assert result.shape == (2, 2)


def test_draws_are_independent_and_numbered(conformance):
    model = conformance.model(max_tokens=8, temperature=1.0)
    before = conformance.calls()
    first, second = outlines.eval(model("Once upon"), model("Once upon"), cache=False)
    assert isinstance(first, str) and isinstance(second, str)
    assert conformance.calls() > before
    if conformance.distinct_samples:
        samples = model("Once upon", num_samples=4).eval(cache=False)
        assert len(set(samples)) > 1


def test_greedy_collapses_draws(conformance):
    model = conformance.model(max_tokens=6, temperature=0)
    before = conformance.calls()
    samples = model("Once upon", num_samples=4).eval(cache=False)
    assert len(set(samples)) == 1
    assert conformance.calls() - before == 1


def test_batched_siblings_share_requests(conformance):
    model = conformance.model(max_tokens=4, temperature=0)
    prompts = [f"prompt {i}" for i in range(6)]
    before = conformance.calls()
    results = outlines.eval(*[model(p) for p in prompts], cache=False)
    assert len(results) == 6
    # Siblings that share a backend are merged: never more than one request per prompt.
    assert conformance.calls() - before <= len(prompts)
    # Batched equals unbatched, element by element (greedy decoding is deterministic).
    alone = [model(p).eval(cache=False) for p in prompts[:2]]
    assert list(results[:2]) == alone


def test_siblings_go_out_as_one_batch(conformance):
    model = conformance.model(max_tokens=4, temperature=0)
    before = conformance.batches()
    results = outlines.eval(*[model(f"sibling {i}") for i in range(6)], cache=False)
    assert len(results) == 6 and all(isinstance(r, str) for r in results)
    # One backend call for the whole group: switching batching off makes six.
    assert conformance.batches() - before == 1


def test_same_results_through_program(conformance):
    model = conformance.model(max_tokens=4, temperature=0)
    program = outlines.compile(lambda text: model(text + "!"), cache=False)
    array = program(["a", "b", "c"])
    assert array.shape == (3,)
    assert array[1] == program("b")


def test_failure_names_the_node(conformance):
    model = conformance.failing_model()
    node = model("x")
    with pytest.raises(outlines.NodeError) as info:
        node.eval(cache=False)
    assert node.owner.label in str(info.value)
    values = outlines.eval(model(["x", "y"]), givens=None, cache=False, errors="return")
    assert all(isinstance(v, outlines.Failure) for v in values.flat)
