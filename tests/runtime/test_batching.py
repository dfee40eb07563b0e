"""The pure helpers of ``outlines.runtime.batching`` that the scheduler and ``explain`` share."""
from __future__ import annotations

from pathlib import Path

import pytest

from outlines.backends.base import Draw, GenerationParams
from outlines.cache import Cache, draw_key
from outlines.runtime.batching import batch_sizes, lookup, unique_draws
from tests.fixtures.recording import RecordingBackend

PARAMS = GenerationParams.create(temperature=0.5)


@pytest.mark.parametrize(
    ("count", "max_batch", "sizes"),
    [(0, None, []), (0, 4, []), (7, None, [7]), (7, 3, [3, 3, 1]), (6, 3, [3, 3]), (2, 16, [2]), (5, 1, [1] * 5)],
)
def test_batch_sizes_split_by_max_batch(count: int, max_batch: int | None, sizes: list[int]) -> None:
    assert batch_sizes(count, max_batch) == sizes


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
