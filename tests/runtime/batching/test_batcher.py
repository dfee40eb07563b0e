"""The batcher's cache step (``cached_values``): one lookup per identity, before a batch is packed."""
from __future__ import annotations

from pathlib import Path

from outlines.backends.base import Draw, DrawBatch, GenerationParams
from outlines.cache import Cache
from outlines.runtime.batching.batcher import cached_values
from tests.fixtures.recording import RecordingBackend

PARAMS = GenerationParams.create(temperature=0.5)


def test_cached_values_answer_the_stored_draws_and_miss_the_rest(tmp_path: Path) -> None:
    backend = RecordingBackend()
    cache = Cache(tmp_path)
    hit, miss = Draw("cached", PARAMS, 0), Draw("fresh", PARAMS, 0)
    cache.put_draws(backend.identity, DrawBatch.of([hit]), ["stored"])
    cache.flush()
    draws = DrawBatch.of([hit, miss])
    assert cached_values(Cache(tmp_path, timeout=3.0), backend, draws) == ["stored", None]  # from the file
    assert cached_values(None, backend, draws) == [None, None] and cached_values(cache, backend, draws[0:0]) == []
    assert cached_values(cache, RecordingBackend(name="other"), draws) == [None, None]  # keys hold the identity
    before = cache.stats()["hits"]
    assert cached_values(cache, backend, draws, record=False) == ["stored", None]
    assert cache.stats()["hits"] == before  # a dry run counts nothing


def test_a_fallback_chain_looks_under_each_members_identity_in_turn(tmp_path: Path) -> None:
    from outlines.backends.fallback import FallbackBackend

    primary, second = RecordingBackend(name="primary"), RecordingBackend(name="second")
    chain = FallbackBackend([primary, second])
    cache = Cache(tmp_path)
    cache.put_draws(primary.identity, DrawBatch.of([Draw("a", PARAMS, 0)]), ["from primary"])
    cache.put_draws(second.identity, DrawBatch.of([Draw("a", PARAMS, 0), Draw("b", PARAMS, 0)]), ["x", "from second"])
    draws = DrawBatch.of([Draw("a", PARAMS, 0), Draw("b", PARAMS, 0), Draw("c", PARAMS, 0)])
    assert cached_values(cache, chain, draws) == ["from primary", "from second", None]
