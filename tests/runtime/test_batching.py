"""The pure helpers of ``outlines.runtime.batching`` that the scheduler and ``explain`` share."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outlines.backends.base import Draw, GenerationParams
from outlines.cache import Cache, draw_key
from outlines.runtime.batching import batch_sizes, lookup, pack_groups, prompt_batches, unique_draws
from tests.fixtures.recording import RecordingBackend

PARAMS = GenerationParams.create(temperature=0.5)


@pytest.mark.parametrize(
    ("runs", "max_batch", "sizes"),
    [
        ([], None, []),
        ([(1, 0)], 4, []),
        ([(1, 7)], None, [7]),
        ([(1, 7)], 3, [3, 3, 1]),
        ([(1, 6)], 3, [3, 3]),
        ([(1, 2)], 16, [2]),
        ([(1, 5)], 1, [1] * 5),
        ([(3, 200)], 128, [126, 126, 126, 126, 96]),  # 42 prompts of 3 samples per batch
        ([(3, 2), (1, 2)], 4, [3, 4, 1]),  # a 1-sample prompt fills the gap a 3-sample one leaves
        ([(10, 1), (1, 1)], 4, [4, 4, 3]),  # a prompt larger than a batch goes in pieces
        ([(8, 1)], 4, [4, 4]),
        ([(3, 2)], 2, [2, 2, 2]),  # prompts cut anyway fill each other's gaps: no extra batch
    ],
)
def test_batch_sizes_pack_whole_prompts(runs: list[tuple[int, int]], max_batch: int | None, sizes: list[int]) -> None:
    assert batch_sizes(runs, max_batch) == sizes
    groups = [[0] * size for size, count in runs for _ in range(count)]
    assert [len(batch) for batch in pack_groups(groups, max_batch)] == sizes  # the arithmetic twin agrees


def test_prompt_batches_never_split_a_prompt_that_fits() -> None:
    draws = [Draw(f"p{i}", PARAMS, d) for i in range(200) for d in range(3)]
    batches = prompt_batches(draws, 128)
    assert [len(b) for b in batches] == [126, 126, 126, 126, 96]
    seen: dict[str, int] = {}
    for number, batch in enumerate(batches):
        for draw in batch:
            assert seen.setdefault(draw.prompt, number) == number  # all 3 samples in one batch
    assert [d for b in batches for d in b] == draws and len(seen) == 200


def test_prompt_batches_group_interleaved_draws_and_split_oversized_prompts() -> None:
    other = GenerationParams.create(temperature=0.9)
    a = [Draw("a", PARAMS, d) for d in range(5)]
    b, c = Draw("b", PARAMS, 0), Draw("a", other, 0)  # same text, other params: another prompt
    assert prompt_batches([a[0], b, a[1], c, a[2]], None) == [[a[0], b, a[1], c, a[2]]]  # one batch: as queued
    assert prompt_batches([a[0], b, a[1], c, a[2]], 4) == [[a[0], a[1], a[2], b], [c]]  # cut: grouped by prompt
    assert prompt_batches([*a, b], 2) == [[a[0], a[1]], [a[2], a[3]], [a[4], b]]


def test_unique_draws_keep_the_first_seen_order() -> None:
    a0, b0, a1 = Draw("a", PARAMS, 0), Draw("b", PARAMS, 0), Draw("a", PARAMS, 1)
    assert unique_draws([a0, b0, Draw("a", PARAMS, 0), a1, b0]) == [a0, b0, a1]


def test_lookup_finds_cached_draws_in_one_query(tmp_path: Path) -> None:
    backend = RecordingBackend()
    cache = Cache(tmp_path)
    hit, miss = Draw("cached", PARAMS, 0), Draw("fresh", PARAMS, 0)
    cache.put_many({draw_key(backend.identity, hit): "stored"})
    cache.flush()
    assert lookup(cache, backend, [hit, miss]) == {hit: "stored"}
    assert lookup(None, backend, [hit]) == {} and lookup(cache, backend, []) == {}
    other = RecordingBackend(name="other")
    assert lookup(cache, other, [hit]) == {}  # keys hold the backend identity


# -- the batcher's draw form (issue 15) ---------------------------------------------------------
def test_a_draw_batch_is_a_sequence_of_draws_held_as_columns() -> None:
    import pickle

    from outlines.backends.base import DrawBatch

    draws = [Draw("a", PARAMS, 0), Draw("b", PARAMS, 2), Draw("a", GenerationParams(), 1)]
    batch = DrawBatch.of(draws)
    assert batch.prompts == ["a", "b", "a"] and batch.numbers == [0, 2, 1]
    assert list(batch) == draws and batch[1] == draws[1] and len(batch) == 3
    assert batch[1:] == draws[1:] and isinstance(batch[1:], DrawBatch)
    assert batch == draws and batch == DrawBatch.of(draws) and batch != draws[:2]
    assert DrawBatch.of(batch) is batch
    assert pickle.loads(pickle.dumps(batch)) == batch  # it crosses to Dask workers


def test_queues_key_draws_by_prompt_number_and_params_and_build_batches_of_them() -> None:
    from outlines.backends.constraints import make_constraint
    from outlines.runtime.batching import BatchQueue

    queue = BatchQueue(RecordingBackend())
    plain = GenerationParams.create(temperature=0.5)
    constrained = GenerationParams.create(temperature=0.5, constraint=make_constraint(choices=["y", "n"]))
    assert queue.param_id(plain) == 0 and queue.param_id(GenerationParams.create(temperature=0.5)) == 0
    assert not queue.constrained
    assert queue.param_id(constrained) == 1 and queue.constrained
    batch = queue.batch([("p", 3, 0), ("q", 0, 1)])
    assert list(batch) == [Draw("p", plain, 3), Draw("q", constrained, 0)]
    assert len(queue.batch([])) == 0


def test_params_hash_once_equal_params_hash_equal_and_pickle_without_their_hash() -> None:
    import pickle

    first = GenerationParams.create(temperature=0.5, stop=["\n"], logit_bias={"1": 2})
    second = GenerationParams.create(logit_bias={"1": 2}, stop="\n", temperature=0.5)
    assert first == second and hash(first) == hash(second)
    assert {first: 1}[second] == 1
    assert hash(first) != hash(GenerationParams.create(temperature=0.6, stop=["\n"], logit_bias={"1": 2}))
    copy = pickle.loads(pickle.dumps(first))
    assert copy == first and "_hash" not in pickle.loads(pickle.dumps(GenerationParams())).__dict__


def test_merged_without_overrides_is_the_same_params_and_with_them_a_validated_copy() -> None:
    base = GenerationParams.create(temperature=0.5, logit_bias={"1": 2})
    assert base.merged() is base and base.merged(max_tokens=None, stop=None) is base
    changed = base.merged(max_tokens=8, stop="x", presence_penalty=0.1)
    assert changed.max_tokens == 8 and changed.stop == ("x",) and changed.temperature == 0.5
    assert dict(changed.extra) == {"logit_bias": {"1": 2}, "presence_penalty": 0.1}
    assert base.max_tokens is None and dict(base.extra) == {"logit_bias": {"1": 2}}
    with pytest.raises(ValueError, match="max_tokens"):
        base.merged(max_tokens=0)


# -- bulk waiting for large prompt arrays (issue 15) ------------------------------------------------
def _plain(value: Any) -> Any:
    """A Failure without its node's label (creation numbers differ between two builds)."""
    from outlines.errors import Failure

    import re

    if isinstance(value, Failure):
        return "failure", value.error_type, re.sub(r"#\d+", "#N", value.message)
    return value


def _run_graph(build: str, tmp_path: Path, bulk_min: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """Evaluate one of a few graphs twice (cold, then warm with more inputs); what a caller can observe."""
    import numpy as np

    import outlines
    from outlines.runtime import batching

    monkeypatch.setattr(batching, "BULK_MIN", bulk_min)
    recording = RecordingBackend(name=f"bulk-{build}", max_batch=48 if build == "split" else None,
                                 fail_on="boom" if build == "failing" else None)
    llm = recording.model(temperature=0.5)
    cache = Cache(tmp_path / f"cache-{bulk_min}")
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
        if build in ("overlapping-arrays", "disjoint-arrays"):  # two bulk nodes on one queue: segments
            shift = 50 if build == "overlapping-arrays" else 1000
            other = outlines.constant(np.array([f"p{i + shift}" for i in range(len(values))], dtype=object))
            return [first, llm(other), llm(first)]
        return [first, llm(first)]

    observed = []
    for values in (prompts, prompts + ["new1", "new2"], prompts + ["new1", "new2"]):  # cold, partly warm, warm
        with outlines.trace() as trace:
            errors = "return" if build == "failing" else "raise"
            results = outlines.eval(*graph(values), cache=cache, errors=errors)
        cache.flush()
        values_seen = [[_plain(v) for v in np.asarray(r, dtype=object).reshape(-1).tolist()] for r in results]
        observed.append((values_seen,
                         (trace.cache_hits, trace.cache_misses)))
    return tuple(observed), [list(b) for b in recording.batches]


@pytest.mark.parametrize("build", ["chain", "distinct", "split", "shared-small-first", "shared-small-last", "samples", "failing",
                                   "overlapping-arrays", "disjoint-arrays"])
def test_bulk_waiting_sends_and_returns_what_waiting_per_element_does(
    build: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_element = _run_graph(build, tmp_path, 10**9, monkeypatch)
    bulk = _run_graph(build, tmp_path, 8, monkeypatch)
    assert bulk == per_element
    (cold, _), (warm, (hits, misses)) = per_element[0][:2]
    if build == "failing":  # the batch holding "boom" fails whole: every element holds a Failure
        assert all(v[0] == "failure" for v in cold[0])
    else:
        assert hits > 0 and misses > 0  # the warm run mixes hits and misses
        assert "p1." in sum(cold, []) and "new2." in sum(warm, [])
        assert per_element[0][2][1][1] == 0  # the third run: all hits
