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
``pack`` returns the number of items of each batch: the batches are
consecutive runs of the groups' items, in order.

For draws (``DrawColumns``), the groups are each prompt's draws
(``group_sizes``), and prompts that share a long head (``min_head``
characters: a provider's prompt cache, a local model's shared prefill) are
one *prefix group* (``outlines.draws.prefix.prefix_groups``):
``prefix_ordered`` puts each group's prompts next to each other, and
``draw_units`` makes such a group one unit to pack unless it alone exceeds
``max_batch``; then it is cut between prompts, as any run of prompts is.

The batcher's batches (``outlines.runtime.batching.batches``), ``explain``
(through the same code) and the transformers backend's forward passes all
pack with these functions.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Any, Sequence

from outlines.draws.draw import DrawColumns
from outlines.draws.prefix import PrefixGroups, prefix_groups

__all__ = ["draw_units", "full_batches", "group_sizes", "pack", "prefix_ordered"]


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


def group_sizes(draws: DrawColumns) -> list[int]:
    """The size of each run of one prompt's draws (same params and prompt) in ``draws``, which are distinct.

    One slot (the usual batch) holds one draw per prompt: no step per draw.
    """
    prompts, params = draws.prompts, draws.params
    if not prompts or draws.slot is not None:
        return [1] * len(prompts)
    sizes: list[int] = []
    last: object = None
    for group in zip(params, prompts):
        if sizes and group == last:
            sizes[-1] += 1
        else:
            sizes.append(1)
            last = group
    return sizes


def _runs(draws: DrawColumns) -> tuple[list[int], list[Any]]:
    """Each prompt's run of draws: its size and its prompt."""
    sizes = group_sizes(draws)
    if len(sizes) == len(draws):
        return sizes, draws.prompts
    return sizes, [draws.prompts[start] for start in accumulate(sizes[:-1], initial=0)]


def _prefix_groups(prompts: list[Any], min_head: int | None) -> PrefixGroups | None:
    """The prefix groups of these prompts; ``None`` when no two share a head of ``min_head`` worth keeping together."""
    if min_head is None or len(prompts) < 2:
        return None
    try:
        found = prefix_groups(prompts, min_head)
    except TypeError:  # prompts that are not all text: there is no head to share
        return None
    return None if len(found.sizes) == len(prompts) else found


def prefix_ordered(draws: DrawColumns, min_head: int | None) -> DrawColumns:
    """``draws`` (each prompt's draws adjacent) with each prefix group's prompts next to each other.

    Groups come in the order of their first prompt and keep their prompts'
    order; ``draws`` itself when nothing moves (``min_head`` is ``None``: a
    shared head gains nothing; or no two prompts share one).

    Examples
    --------
    >>> from outlines.draws import GenerationParams
    >>> head = "Translate to French: "
    >>> draws = DrawColumns([head + "cat", "Hello", head + "dog"], [GenerationParams()] * 3, [0] * 3)
    >>> prefix_ordered(draws, 8).prompts
    ['Translate to French: cat', 'Translate to French: dog', 'Hello']
    """
    if min_head is None:  # no head to share: nothing moves
        return draws
    sizes, prompts = _runs(draws)
    found = _prefix_groups(prompts, min_head)
    if found is None or found.order == list(range(len(prompts))):
        return draws
    if len(sizes) == len(draws):
        return draws.take(found.order)
    starts = list(accumulate(sizes, initial=0))
    return draws.take([position for run in found.order for position in range(starts[run], starts[run + 1])])


def draw_units(draws: DrawColumns, max_batch: int | None, min_head: int | None) -> list[int]:
    """What ``pack`` packs of ``draws``: each prompt's run, or a whole prefix group where it fits in one batch."""
    sizes, prompts = _runs(draws)
    found = _prefix_groups(prompts, min_head) if max_batch is not None else None
    if max_batch is None or found is None or found.order != list(range(len(prompts))):  # no groups, or not ordered by them
        return sizes
    units: list[int] = []
    start = 0
    for count in found.sizes:
        part = sizes[start : start + count]
        start += count
        total = sum(part)
        if total <= max_batch:
            units.append(total)
        else:  # too big for one batch: cut between its prompts
            units.extend(part)
    return units


def full_batches(draws: DrawColumns, max_batch: int | None, min_head: int | None) -> tuple[DrawColumns, DrawColumns]:
    """``draws`` cut after its last full batch: (the draws of the full batches, the rest)."""
    counts = pack(draw_units(draws, max_batch, min_head), max_batch)
    cut = sum(counts) - (counts[-1] if counts and counts[-1] < (max_batch or 0) else 0)
    return draws[:cut], draws[cut:]

