"""Draws (``outlines.draws.draw``): one sample of one prompt, its slot, and a batch of draws held as columns."""
from __future__ import annotations

import pickle

from outlines.draws import Draw, DrawBatch, GenerationParams, Slot

PARAMS = GenerationParams.create(temperature=0.5)


def test_a_draw_batch_is_a_sequence_of_draws_held_as_columns() -> None:
    draws = [Draw("a", PARAMS, 0), Draw("b", PARAMS, 2), Draw("a", GenerationParams(), 1)]
    batch = DrawBatch.of(draws)
    assert batch.prompts == ["a", "b", "a"] and batch.numbers == [0, 2, 1]
    assert list(batch) == draws and batch[1] == draws[1] and len(batch) == 3
    assert batch[1:] == draws[1:] and isinstance(batch[1:], DrawBatch)
    assert batch == draws and batch == DrawBatch.of(draws) and batch != draws[:2]
    assert DrawBatch.of(batch) is batch
    assert batch.take([2, 0]) == [draws[2], draws[0]]
    assert pickle.loads(pickle.dumps(batch)) == batch  # it crosses to Dask workers


def test_a_batch_splits_by_slot_in_the_order_of_each_slots_first_draw() -> None:
    one = DrawBatch(["a", "b"], [PARAMS, PARAMS], [3, 3])
    assert one.slot == Slot(PARAMS, 3) and one.by_slot() == [(Slot(PARAMS, 3), None)]
    mixed = DrawBatch(["a", "b", "a", "c"], [PARAMS, PARAMS, PARAMS, GenerationParams()], [1, 0, 0, 1])
    assert mixed.slot is None
    assert mixed.by_slot() == [(Slot(PARAMS, 1), [0]), (Slot(PARAMS, 0), [1, 2]), (Slot(GenerationParams(), 1), [3])]
    equal = GenerationParams.create(temperature=0.5)  # equal params, another object: the same slot
    assert DrawBatch(["a", "b"], [PARAMS, equal], [0, 0]).by_slot() == [(Slot(PARAMS, 0), None)]
    assert DrawBatch([], [], []).by_slot() == [] and DrawBatch([], [], []).slot is None


def test_a_slots_prompts_make_a_batch_of_that_slot_without_a_copy() -> None:
    prompts = ["a", "b"]
    batch = DrawBatch.in_slot(Slot(PARAMS, 4), prompts)
    assert batch.prompts is prompts and batch == [Draw("a", PARAMS, 4), Draw("b", PARAMS, 4)]
    assert batch.by_slot() == [(Slot(PARAMS, 4), None)]
