"""The one packing rule: groups of items into batches under a size limit (and a padded-area limit).

A *group* is what must travel together: the samples of one prompt (the
scheduler's batches: an HTTP backend asks for them as one prompt with ``n``),
or the rows of one prompt in a forward pass (a local model's chunks).
``pack`` fills batches with whole groups, in order, closing a batch when the
next group does not fit. A group larger than the size limit is the one
exception: it has to be cut anyway, so its pieces fill the room left in the
current batch, then whole batches, and its remainder starts the next one. With
``widths``, a batch also keeps ``items x widest group`` (a padded batch's
area: rows x tokens) within ``max_area``; a single group always makes a batch.

The scheduler's batcher (``outlines.runtime.batching.packing``), ``explain``
(through the same code) and the transformers backend's forward passes all
pack with this function. It returns the number of items of each batch: the
batches are consecutive runs of the groups' items, in order.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["pack"]


def pack(
    sizes: Sequence[int],
    max_items: int | None,
    *,
    widths: Sequence[int] | None = None,
    max_area: int | None = None,
) -> list[int]:
    """The items in each batch when groups of ``sizes`` items are packed in order.

    Parameters
    ----------
    sizes
        Items per group (a group of 0 items is skipped).
    max_items
        The most items in a batch (``None``: no bound); only a group larger
        than this is cut.
    widths, max_area
        Each group's width and the most ``items x widest group`` a batch may
        hold (``None``: no bound). A group is never cut for its area.

    Returns
    -------
    list[int]
        The number of items in each batch; they add up to ``sum(sizes)``.

    Examples
    --------
    >>> pack([3] * 200, 128)  # 42 prompts of 3 samples per batch
    [126, 126, 126, 126, 96]
    >>> pack([1] * 7, 3), pack([5, 1], 2), pack([3, 3], 2)
    ([3, 3, 1], [2, 2, 2], [2, 2, 2])
    >>> pack([2, 2, 2], None, widths=[1, 5, 9], max_area=20)  # rows x widest row's tokens
    [4, 2]
    """
    total = sum(sizes)
    if not total:
        return []
    if widths is None or max_area is None:
        if max_items is None or total <= max_items:
            return [total]
        if sizes.count(sizes[0]) == len(sizes):  # one size (the usual queue): arithmetic, no step per group
            return _equal_groups(sizes[0], len(sizes), max_items)
    batches: list[int] = []
    current = widest = 0
    for index, size in enumerate(sizes):
        if size <= 0:
            continue
        width = widths[index] if widths is not None else 0
        if max_items is not None and size > max_items:  # cut anyway: its pieces fill what is left
            full, current = divmod(current + size, max_items)
            batches.extend([max_items] * full)
            widest = width if current else 0
            continue
        fits_items = max_items is None or current + size <= max_items
        fits_area = max_area is None or (current + size) * max(widest, width) <= max_area
        if current and not (fits_items and fits_area):
            batches.append(current)
            current = widest = 0
        current += size
        widest = max(widest, width)
    if current:
        batches.append(current)
    return batches


def _equal_groups(size: int, count: int, max_items: int) -> list[int]:
    """``pack([size] * count, max_items)`` by arithmetic."""
    if size > max_items:  # each group cut: the pieces run on from one group into the next
        full, left = divmod(size * count, max_items)
        return [max_items] * full + ([left] if left else [])
    per_batch = max_items // size
    full, left = divmod(count, per_batch)
    return [per_batch * size] * full + ([left * size] if left else [])
