"""Batches as data (``outlines.runtime.batching.batches``): what the batcher sends and explain predicts."""
from __future__ import annotations

from outlines.draws import Draw, DrawColumns, GenerationParams
from outlines.draws.packing import prefix_ordered
from outlines.runtime.batching.batches import Batch, pack_draws
from tests.fixtures.recording import RecordingBackend

PARAMS = GenerationParams.create(temperature=0.5)


def test_a_prompts_samples_stay_in_one_batch_when_they_fit() -> None:
    draws = DrawColumns.of([Draw(f"p{i}", PARAMS, d) for i in range(200) for d in range(3)])
    batches = pack_draws(RecordingBackend(max_batch=128), draws)
    assert [b.size for b in batches] == [126, 126, 126, 126, 96] and all(b.unknown == 0 for b in batches)
    seen: dict[str, int] = {}
    for number, batch in enumerate(batches):
        for draw in batch.draws:
            assert seen.setdefault(draw.prompt, number) == number  # all 3 samples in one batch
    assert [d for b in batches for d in b.draws] == list(draws) and len(seen) == 200


def test_a_prompt_larger_than_a_batch_goes_in_pieces_that_fill_the_batches() -> None:
    a = [Draw("a", PARAMS, d) for d in range(5)]
    b = Draw("b", PARAMS, 0)
    batches = pack_draws(RecordingBackend(max_batch=2), DrawColumns.of([*a, b]))
    assert [list(x.draws) for x in batches] == [[a[0], a[1]], [a[2], a[3]], [a[4], b]]
    one = pack_draws(RecordingBackend(), DrawColumns.of([*a, b]))  # no max_batch: one batch, the draws themselves
    assert len(one) == 1 and list(one[0].draws) == [*a, b]


def test_a_dry_run_packs_the_groups_it_cannot_know_after_the_known_ones() -> None:
    known = DrawColumns(["a", "b", "c"], [PARAMS] * 3, [0] * 3)
    batches = pack_draws(RecordingBackend(max_batch=4), known, unknown=[2, 2, 2])
    assert [(len(b.draws), b.unknown) for b in batches] == [(3, 0), (0, 4), (0, 2)]
    assert batches[0] == Batch(batches[0].backend, known) and [b.size for b in batches] == [3, 4, 2]


HEADS = ["Translate to French, one word only. " * 3, "Answer yes or no, nothing else. " * 3]


def test_prefix_groups_come_together_and_stay_in_one_batch() -> None:
    prompts = [HEADS[i % 2] + f"q{i}" for i in range(6)] + ["alone"]
    draws = DrawColumns(prompts, [PARAMS] * 7, [0] * 7)
    backend = RecordingBackend(max_batch=4, prefix_min_head=32)
    ordered = prefix_ordered(draws, backend.prefix_min_head)
    assert ordered.prompts == [prompts[i] for i in (0, 2, 4, 1, 3, 5, 6)]
    assert [b.draws.prompts for b in pack_draws(backend, ordered)] == [
        ordered.prompts[0:3], ordered.prompts[3:7]]  # a lone prompt fills the room a group leaves
    # Without prefix groups the same draws fill each batch, mixing the heads.
    plain = RecordingBackend(max_batch=4)
    assert prefix_ordered(draws, plain.prefix_min_head) is draws
    assert [b.size for b in pack_draws(plain, draws)] == [4, 3]


def test_a_prefix_group_larger_than_a_batch_is_cut_between_its_prompts() -> None:
    prompts = [HEADS[0] + f"q{i}" for i in range(5)]
    draws = DrawColumns.of([Draw(p, PARAMS, d) for p in prompts for d in range(2)])
    backend = RecordingBackend(max_batch=4, prefix_min_head=32)
    assert prefix_ordered(draws, backend.prefix_min_head) is draws  # one group, already together
    batches = pack_draws(backend, draws)
    assert [b.size for b in batches] == [4, 4, 2]
    for batch in batches:  # each prompt's samples stay in one batch
        assert all(batch.draws.prompts.count(p) in (0, 2) for p in prompts)
