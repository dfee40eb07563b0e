"""The one packing rule (``outlines.backends.packing.pack``): the batcher's, explain's and the transformers backend's."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outlines.backends.packing import pack


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
