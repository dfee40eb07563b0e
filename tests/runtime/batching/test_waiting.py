"""Waiting for draws (``outlines.runtime.batching.waiting``): one rule for every model call, however large."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import outlines
from outlines.cache import Cache
from outlines.common.errors import Failure
from outlines.runtime.batching.waiting import Wait, Waiters
from tests.fixtures.recording import RecordingBackend


def test_a_join_that_shares_nothing_is_a_claim_handed_over_in_one_step() -> None:
    waiters = Waiters()
    wait = Wait(0, (3,), ["a", "b", "a"], [waiters])
    assert waiters.join(wait, dict.fromkeys(wait.prompts)) == {"a": None, "b": None}
    assert waiters.claim is not None and waiters.waits == {}  # no map written
    assert waiters.hand_over(["b"], ["B"], hit=True) == [] and wait.missing == 1  # part of the claim
    assert waiters.hand_over(["a"], ["A"], hit=False) == [wait] and waiters.claim is None
    assert wait.results() == ["A", "B", "A"] and wait.cache_hits() == 1


def test_a_join_that_shares_a_draw_waits_for_it_instead_of_sending_it_again() -> None:
    waiters = Waiters()
    first, second = Wait(0, (2,), ["a", "b"], [waiters]), Wait(1, (2,), ["b", "c"], [waiters])
    waiters.join(first, {"a": None, "b": None})
    assert waiters.join(second, {"b": None, "c": None}) == {"c": None}  # only "c" is new
    assert waiters.claim is None and waiters.first("b") is first
    assert waiters.wanting(["b", "c"]) == [first, second]
    done = waiters.hand_over(["a", "b", "c"], ["A", "B", "C"], hit=False)
    assert done == [first, second] and waiters.waits == {}
    assert first.results() == ["A", "B"] and second.results() == ["B", "C"]


def test_values_reach_each_position_element_major_and_settled_elements_keep_theirs() -> None:
    slots = [Waiters(), Waiters()]  # a 2-sample call: one slot per draw number
    failed = Failure("upstream", "Op", "ValueError", "no")
    wait = Wait(0, (3, 2), ["a", "", "b"], slots, settled={1: failed})
    for slot in slots:
        slot.join(wait, {"a": None, "b": None})
    slots[0].hand_over(["a", "b"], ["a0", "b0"], hit=True)
    assert slots[1].pop("a") == (wait,)
    wait.receive_one(slots[1], "a", "a1", hit=False)
    assert slots[1].hand_over(["b"], ["b1"], hit=False) == [wait]
    assert wait.results() == ["a0", "a1", failed, failed, "b0", "b1"] and wait.cache_hits() == 2
    assert wait.element_of("b") == 2 and wait.count == 6


def test_a_greedy_calls_draws_share_one_slot() -> None:
    slot = Waiters()
    wait = Wait(0, (1, 3), ["a"], [slot, slot, slot])
    slot.join(wait, {"a": None})
    assert slot.hand_over(["a"], ["A"], hit=False) == [wait] and wait.results() == ["A", "A", "A"]


# -- the same values and batches, however the map of who waits is kept -----------------------------
def _plain(value: Any) -> Any:
    """A Failure without its node's label (creation numbers differ between two builds)."""
    if isinstance(value, Failure):
        return "failure", value.error_type, re.sub(r"#\d+", "#N", value.message)
    return value


def _run_graph(build: str, tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Evaluate one of a few graphs three times (cold, partly warm, warm); what a caller can observe."""
    if how == "map-always":  # every join written into the map at once: the claim never holds
        join = Waiters.join

        def written(self: Waiters, wait: Wait, prompts: dict[Any, None]) -> dict[Any, None]:
            new = join(self, wait, prompts)
            self._write()
            return new

        monkeypatch.setattr(Waiters, "join", written)
    peek_min = 8 if how == "peek-small" else 10**9 if how == "map-always" else 64
    recording = RecordingBackend(name=f"wait-{build}", max_batch=48 if build == "split" else None,
                                 fail_on="boom" if build == "failing" else None)
    llm = recording.model(temperature=0.5)
    cache = Cache(tmp_path / f"cache-{how}")
    prompts = [f"p{i % 70}" for i in range(100)]  # 70 distinct prompts, 30 repeated
    if build == "distinct":  # one batch holds each node's draws in order: handed over as they are
        prompts = [f"p{i}" for i in range(100)]
    if build == "failing":
        prompts[7] = "boom"

    def graph(values: list[str]) -> list[Any]:
        array = outlines.constant(np.array(values, dtype=object))
        first = llm(array)
        if build == "shared-small-first":
            return [llm(outlines.constant("p5")), first, llm(first)]
        if build == "shared-small-last":
            return [first, llm(outlines.constant("p5")), llm(first)]
        if build == "samples":
            return [first, llm(array, num_samples=2)]
        if build in ("overlapping-arrays", "disjoint-arrays"):  # two large calls on one queue
            shift = 50 if build == "overlapping-arrays" else 1000
            other = outlines.constant(np.array([f"p{i + shift}" for i in range(len(values))], dtype=object))
            return [first, llm(other), llm(first)]
        return [first, llm(first)]

    observed = []
    for values in (prompts, prompts + ["new1", "new2"], prompts + ["new1", "new2"]):  # cold, partly warm, warm
        with outlines.trace() as trace, outlines.common.config.tuning(peek_min=peek_min):
            errors = "return" if build == "failing" else "raise"
            results = outlines.eval(*graph(values), cache=cache, errors=errors)
        cache.flush()
        values_seen = [[_plain(v) for v in np.asarray(r, dtype=object).reshape(-1).tolist()] for r in results]
        observed.append((values_seen, (trace.cache_hits, trace.cache_misses)))
    return tuple(observed), [list(b) for b in recording.batches]


@pytest.mark.parametrize("build", ["chain", "distinct", "split", "shared-small-first", "shared-small-last", "samples",
                                   "failing", "overlapping-arrays", "disjoint-arrays"])
def test_claims_and_the_memory_peek_change_no_value_count_or_batch(
    build: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference = _run_graph(build, tmp_path, "map-always", monkeypatch)
    monkeypatch.undo()
    assert _run_graph(build, tmp_path, "claims", monkeypatch) == reference
    monkeypatch.undo()
    assert _run_graph(build, tmp_path, "peek-small", monkeypatch) == reference
    (cold, _), (warm, (hits, misses)) = reference[0][:2]
    if build == "failing":  # the batch holding "boom" fails whole: every element holds a Failure
        assert all(v[0] == "failure" for v in cold[0])
    else:
        assert hits > 0 and misses > 0  # the warm run mixes hits and misses
        assert "p1." in sum(cold, []) and "new2." in sum(warm, [])
        assert reference[0][2][1][1] == 0  # the third run: all hits
