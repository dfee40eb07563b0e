"""Draws (``outlines.draws.draw``): one sample of one prompt, its slot, and a batch of draws held as columns."""
from __future__ import annotations

import pickle

import pytest

from outlines.draws import Draw, DrawColumns, GenerationParams, Slot

PARAMS = GenerationParams.create(temperature=0.5)


def test_a_draw_batch_is_a_sequence_of_draws_held_as_columns() -> None:
    draws = [Draw("a", PARAMS, 0), Draw("b", PARAMS, 2), Draw("a", GenerationParams(), 1)]
    batch = DrawColumns.of(draws)
    assert batch.prompts == ["a", "b", "a"] and batch.numbers == [0, 2, 1]
    assert list(batch) == draws and batch[1] == draws[1] and len(batch) == 3
    assert batch[1:] == draws[1:] and isinstance(batch[1:], DrawColumns)
    assert batch == draws and batch == DrawColumns.of(draws) and batch != draws[:2]
    assert DrawColumns.of(batch) is batch
    assert batch.take([2, 0]) == [draws[2], draws[0]]
    assert pickle.loads(pickle.dumps(batch)) == batch  # it crosses to Dask workers


def test_a_batch_splits_by_slot_in_the_order_of_each_slots_first_draw() -> None:
    one = DrawColumns(["a", "b"], [PARAMS, PARAMS], [3, 3])
    assert one.slot == Slot(PARAMS, 3) and one.by_slot() == [(Slot(PARAMS, 3), None)]
    mixed = DrawColumns(["a", "b", "a", "c"], [PARAMS, PARAMS, PARAMS, GenerationParams()], [1, 0, 0, 1])
    assert mixed.slot is None
    assert mixed.by_slot() == [(Slot(PARAMS, 1), [0]), (Slot(PARAMS, 0), [1, 2]), (Slot(GenerationParams(), 1), [3])]
    equal = GenerationParams.create(temperature=0.5)  # equal params, another object: the same slot
    assert DrawColumns(["a", "b"], [PARAMS, equal], [0, 0]).by_slot() == [(Slot(PARAMS, 0), None)]
    assert DrawColumns([], [], []).by_slot() == [] and DrawColumns([], [], []).slot is None


def test_a_slots_prompts_make_a_batch_of_that_slot_without_a_copy() -> None:
    prompts = ["a", "b"]
    batch = DrawColumns.in_slot(Slot(PARAMS, 4), prompts)
    assert batch.prompts is prompts and batch == [Draw("a", PARAMS, 4), Draw("b", PARAMS, 4)]
    assert batch.by_slot() == [(Slot(PARAMS, 4), None)]


def test_draw_batch_is_a_deprecated_name_of_draw_columns() -> None:
    import outlines.draws

    with pytest.warns(DeprecationWarning, match="use DrawColumns"):
        assert outlines.draws.DrawBatch is DrawColumns
    with pytest.raises(AttributeError):
        outlines.draws.NoSuchName  # noqa: B018
