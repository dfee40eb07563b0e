"""The pure helpers of ``outlines.runtime.batching`` that the scheduler and ``explain`` share."""
from __future__ import annotations

from pathlib import Path

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
