"""The one packing rule (``outlines.draws.packing``): the batcher's, explain's and the transformers backend's.

``pack`` on group sizes, and on draws: each prompt's run (``group_sizes``), prefix groups
(``prefix_ordered``, ``draw_units``) and the full batches of a queue (``full_batches``).
"""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outlines.draws import Draw, DrawColumns, GenerationParams, pack
from outlines.draws.packing import draw_units, group_sizes, prefix_ordered, full_batches


@pytest.mark.parametrize(
    ("runs", "max_items", "sizes"),
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
        ([(0, 3), (2, 1)], 4, [2]),  # empty groups are skipped
    ],
)
def test_groups_pack_whole_unless_one_alone_is_too_large(
    runs: list[tuple[int, int]], max_items: int | None, sizes: list[int]
) -> None:
    assert pack([size for size, count in runs for _ in range(count)], max_items) == sizes


def _by_hand(groups: list[int], max_items: int) -> list[int]:
    """The rule written out item by item: a group that fits goes whole, one too large fills what is left."""
    batches: list[int] = []
    current = 0
    for size in groups:
        if size > max_items:
            for _ in range(size):
                if current == max_items:
                    batches.append(current)
                    current = 0
                current += 1
            continue
        if current + size > max_items:
            batches.append(current)
            current = 0
        current += size
    return batches + ([current] if current else [])


@given(st.lists(st.integers(1, 9), max_size=40), st.integers(1, 12))
def test_the_arithmetic_agrees_with_the_rule_item_by_item(groups: list[int], max_items: int) -> None:
    assert pack(groups, max_items) == _by_hand(groups, max_items)
    assert sum(pack(groups, max_items)) == sum(groups)


def test_an_area_limit_closes_a_batch_at_its_widest_group_and_never_cuts_one() -> None:
    assert pack([2, 2, 2], None, widths=[1, 5, 9], max_area=20) == [4, 2]  # 4 rows x 5 fit; 6 x 9 do not
    assert pack([2, 2], 10, widths=[50, 60], max_area=10) == [2, 2]  # a group alone always makes a batch
    assert pack([1, 1, 1], 2, widths=[1, 1, 1], max_area=100) == [2, 1]  # and the item limit still holds


# -- draws: each prompt's run, prefix groups, full batches -------------------------------
PARAMS = GenerationParams.create(temperature=0.5)
HEADS = ["Translate to French, one word only. " * 3, "Answer yes or no, nothing else. " * 3]


def test_groups_are_runs_of_one_prompt_and_one_slot_holds_one_draw_per_prompt() -> None:
    other = GenerationParams.create(temperature=0.9)
    assert group_sizes(DrawColumns(["a", "b", "c"], [PARAMS] * 3, [0] * 3)) == [1, 1, 1]
    mixed = DrawColumns(["a", "a", "b", "a"], [PARAMS, PARAMS, PARAMS, other], [0, 1, 0, 0])
    assert group_sizes(mixed) == [2, 1, 1]  # the same text under other params is another prompt
    assert group_sizes(DrawColumns([], [], [])) == []


def test_whole_batches_keep_the_last_partial_one_back() -> None:
    draws = DrawColumns([f"p{i}" for i in range(10)], [PARAMS] * 10, [0] * 10)
    full, rest = full_batches(draws, 4, None)
    assert full.prompts == [f"p{i}" for i in range(8)] and rest.prompts == ["p8", "p9"]
    full, rest = full_batches(draws, 5, None)
    assert len(full) == 10 and len(rest) == 0


def test_prefix_ordering_keeps_each_prompts_samples_together_and_whole_batches_keep_groups() -> None:
    prompts = [HEADS[i % 2] + f"q{i}" for i in range(4)]
    draws = DrawColumns.of([Draw(p, PARAMS, d) for p in prompts for d in range(2)])
    ordered = prefix_ordered(draws, 32)
    assert ordered.prompts == [prompts[i] for i in (0, 0, 2, 2, 1, 1, 3, 3)]
    assert ordered.numbers == [0, 1] * 4
    assert prefix_ordered(draws, None) is draws  # no head worth sharing: nothing moves
    full, rest = full_batches(prefix_ordered(draws[:6], 32), 4, 32)  # groups of 4 and 2 draws
    assert full.prompts == [prompts[0]] * 2 + [prompts[2]] * 2 and rest.prompts == [prompts[1]] * 2


def test_a_prefix_group_is_one_unit_where_it_fits_and_its_runs_where_it_does_not() -> None:
    prompts = [HEADS[0] + f"q{i}" for i in range(3)] + ["alone"]
    draws = DrawColumns.of([Draw(p, PARAMS, d) for p in prompts for d in range(2)])
    assert draw_units(draws, 8, 32) == [6, 2]  # the group's three prompts, then the lone one
    assert draw_units(draws, 4, 32) == [2, 2, 2, 2]  # too big for a batch: cut between its prompts
    assert draw_units(draws, 8, None) == draw_units(draws, None, 32) == [2, 2, 2, 2]


def test_prompts_that_are_not_text_are_not_grouped() -> None:
    draws = DrawColumns([[1, 2, 3], "text"], [PARAMS] * 2, [0] * 2)
    assert prefix_ordered(draws, 2) is draws
