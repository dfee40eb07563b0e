"""Per-element draw namespaces: a schedule whose elements each draw in a namespace of their own.

A stacked loop runs the elements of many loops as one schedule on
``Evaluation.child(tags)``, one tag per element: each element must draw what
it draws alone on ``child(tag)``: the same draw numbers, values and cache keys.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import outlines
from outlines.cache import Cache
from outlines.common.errors import NodeError
from outlines.runtime.plan import Plan
from outlines.runtime.scheduler import schedule
from outlines.runtime.session import DRAW_SHIFT, TAG_BITS, Evaluation, Options
from tests.fixtures.recording import RecordingBackend


class Numbered(RecordingBackend):
    """Replies with the prompt and its draw number, and records the draws it is sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.draws: list[tuple[str, int]] = []

    async def generate(self, draws: Any, report: Any) -> list[str]:
        self.batches.append([d.prompt for d in draws])
        self.draws.extend((d.prompt, d.draw) for d in draws)
        if self.fail_on is not None and any(self.fail_on in d.prompt for d in draws):
            raise RuntimeError(f"refused {self.fail_on}")
        return [f"{d.prompt}~{d.draw}" for d in draws]


def _graph(backend: Numbered, k: int | None = None, temperature: float = 0.7) -> tuple[Any, Any]:
    q = outlines.string("q")
    return q, backend.model(temperature=temperature)(q + "!", num_samples=k)


def _run(output: Any, q: Any, prompts: Sequence[str], evaluation: Evaluation) -> Any:
    plan = Plan([output])
    values = {id(c): c.value for c in plan.constants}
    values[id(q)] = np.array(list(prompts), dtype=object)
    (value,), _ = asyncio.run(schedule(plan, values, evaluation))
    return value


def _one_by_one(output: Any, q: Any, prompts: Sequence[str], tags: Sequence[int], evaluation: Evaluation) -> list[Any]:
    return _plain([_run(output, q, [p], evaluation.child(t))[0] for p, t in zip(prompts, tags)])


def _plain(value: Any) -> list[Any]:
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in value]


def test_child_of_an_array_of_tags_is_a_namespace_per_element() -> None:
    evaluation = Evaluation.open(Options(cache=False))
    child = evaluation.child(np.array([0, 3]))
    assert child.draw_base.tolist() == [1, 4] and child.draw_shift.tolist() == [1 << DRAW_SHIFT, 4 << DRAW_SHIFT]
    assert child.child(2).draw_base.tolist() == [(1 << TAG_BITS) + 3, (4 << TAG_BITS) + 3]
    assert evaluation.child(5).child(np.array([1])).draw_base.tolist() == [(6 << TAG_BITS) + 2]
    deep = child
    for _ in range(6):  # beyond 64 bits: Python ints, never wrapped
        deep = deep.child(np.array([9, 9]))
    assert deep.draw_base[0] > 2**64 and deep.draw_base.dtype == object
    with pytest.raises(ValueError, match="3 namespace tags for 2 elements"):
        child.child(np.array([1, 2, 3]))
    assert evaluation.child(2).draw_base == 3  # one namespace: an int, as before


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("temperature", [0.7, 0.0], ids=["random", "greedy"])
def test_each_element_draws_what_it_draws_alone(k: int, temperature: float) -> None:
    backend = Numbered(name="alone")
    q, out = _graph(backend, k, temperature)
    prompts, tags = ["a", "b", "c", "d"], [4, 0, 4, 9]
    evaluation = Evaluation.open(Options(cache=False))
    together = _run(out, q, prompts, evaluation.child(np.array(tags)))
    assert together.shape == (4, k)  # an explicit num_samples, 1 included, adds the sample axis
    assert _plain(together) == _one_by_one(out, q, prompts, tags, evaluation)
    numbers = {int(v.rsplit("~", 1)[1]) for v in np.asarray(together).reshape(-1)}
    assert numbers == ({0} if not temperature else
                       {((t + 1) << DRAW_SHIFT) + j for t in tags for j in range(k)})


def test_the_cache_keys_are_those_of_the_elements_run_alone(tmp_path: Path) -> None:
    backend = Numbered(name="keys")
    q, out = _graph(backend, 2)
    prompts, tags = [f"p{i}" for i in range(6)], [3, 1, 4, 1, 5, 9]
    cache = Cache(tmp_path / "cache")
    alone = _one_by_one(out, q, prompts, tags, Evaluation.open(Options(cache=cache)))
    sent = len(backend.draws)
    with outlines.trace() as trace:  # (an evaluation reports to the traces active when it opens)
        together = _run(out, q, prompts, Evaluation.open(Options(cache=cache)).child(np.array(tags)))
    assert _plain(together) == alone
    assert (len(backend.draws), trace.cache_hits, trace.cache_misses) == (sent, 12, 0)  # all from the cache


def test_elements_of_one_namespace_share_their_draws() -> None:
    backend = Numbered(name="shared")
    q, out = _graph(backend)
    together = _run(out, q, ["x", "x", "x", "y"], Evaluation.open(Options(cache=False)).child(np.array([2, 2, 5, 2])))
    assert together[0] == together[1] != together[2]  # one draw in namespace 2, another in 5
    assert sorted(backend.draws) == sorted([("x!", 3 << DRAW_SHIFT), ("x!", 6 << DRAW_SHIFT), ("y!", 3 << DRAW_SHIFT)])
    assert len(backend.batches) == 1  # every namespace in one batch


def test_a_failing_batch_fails_each_element_and_keeps_the_others_with_errors_return() -> None:
    backend = Numbered(name="fails", fail_on="bad", max_batch=1)
    q, out = _graph(backend)
    evaluation = Evaluation.open(Options(cache=False, errors="return"))
    together = _run(out, q, ["ok", "bad", "fine"], evaluation.child(np.array([0, 1, 2])))
    assert [bool(v) for v in together] == [True, False, True]
    assert together[1].error_type == "RuntimeError" and together[0] == f"ok!~{1 << DRAW_SHIFT}"


def test_a_prompt_without_a_row_per_element_is_refused_naming_the_node() -> None:
    backend = Numbered(name="rows")
    llm = backend.model(temperature=0.7)
    out = llm(outlines.constant("one prompt"))
    plan = Plan([out])
    evaluation = Evaluation.open(Options(cache=False)).child(np.array([0, 1]))
    with pytest.raises(NodeError, match=r"Generate.*2 element\(s\) each draw in a namespace of their own.*one value"):
        asyncio.run(schedule(plan, {id(c): c.value for c in plan.constants}, evaluation))
    assert backend.draws == []


@settings(max_examples=25, deadline=None)
@given(
    data=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 4)), min_size=1, max_size=12),
    k=st.integers(1, 3),
    outer=st.sampled_from([None, 0, 7]),
)
def test_per_element_namespaces_equal_element_by_element(data: list[tuple[str, int]], k: int, outer: int | None) -> None:
    backend = Numbered(name="property")
    q, out = _graph(backend, k)
    prompts, tags = [p for p, _ in data], [t for _, t in data]
    evaluation = Evaluation.open(Options(cache=False))
    if outer is not None:
        evaluation = evaluation.child(outer)
    together = _run(out, q, prompts, evaluation.child(np.array(tags)))
    assert _plain(together) == _one_by_one(out, q, prompts, tags, evaluation)
