"""Prompts grouped by the head they share: a radix grouping, pure and fast.

Providers bill a repeated prompt head at a discount once it is in their cache
(OpenAI: 1,024+ tokens, automatically; Anthropic: at ``cache_control``
breakpoints), and a local model computes a head's keys and values once for
all the rows that start with it. Both need to know which prompts of a batch
start alike: ``prefix_groups``. Token ids are compared as packed bytes, so
text and tokens both run at C speed.

Cost: one short slice and one hash per prompt (the first ``PROBE`` items),
then a min/max per bucket of prompts that begin alike, and a sort only for a
bucket whose members part before ``min_head``: 10,000 prompts take a few
milliseconds (``tests/draws/test_prefix.py`` measures it).
"""
from __future__ import annotations

import array
import operator
from typing import AnyStr, Iterator, NamedTuple, Sequence, Union, cast

__all__ = ["PROBE", "PrefixGroups", "common_prefix_length", "prefix_groups"]

#: Items hashed per prompt to find the buckets that may share a head (at most ``min_head``).
PROBE = 64

#: Members of a bucket compared with its first to guess the group's head before checking it.
SAMPLES = 8

#: A prompt as text, or as its token ids.
Prompt = Union[str, bytes, Sequence[int]]


class PrefixGroups(NamedTuple):
    """Prompts grouped by shared head, as columns (cheap for 10,000 lone prompts).

    ``order`` lists prompt positions group by group (each group's members
    ascending, groups in the order of their first member), ``sizes`` the
    members of each group and ``heads`` the head each group shares: characters
    for text, tokens for token ids; 0 for a prompt alone in its group.
    ``sizes`` is what a packer takes to keep each group in one batch.
    """

    order: list[int]
    sizes: list[int]
    heads: list[int]

    def groups(self) -> Iterator[tuple[int, list[int]]]:
        """``(head, members)`` of each group, in order."""
        start = 0
        for size, head in zip(self.sizes, self.heads):
            yield head, self.order[start : start + size]
            start += size


def common_prefix_length(a: AnyStr, b: AnyStr, known: int = 0) -> int:
    """Items ``a`` and ``b`` both start with; ``known`` of them are known to be equal already.

    A binary search over slices, each compared at C speed; the slices shrink
    by half at each step, so the work is linear in the answer.

    Examples
    --------
    >>> common_prefix_length("few-shot: 1+1=2. Q: 3+4?", "few-shot: 1+1=2. Q: 5+6?")
    20
    """
    lo, hi = known, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if b.startswith(a[lo:mid], lo):
            lo = mid
        else:
            hi = mid - 1
    return lo


def prefix_groups(prompts: Sequence[Prompt], min_head: int) -> PrefixGroups:
    """Group ``prompts`` by shared head: every group's members share at least ``min_head`` items.

    The groups are the subtrees at depth ``min_head`` of the prompts' radix
    tree: two prompts are in one group exactly when their common head is at
    least ``min_head`` long, and each group's head is the longest head all
    its members share (identical prompts share all of themselves). Prompts
    are text, or token ids (a list of ints per prompt); every prompt is in
    exactly one group.

    Parameters
    ----------
    prompts
        The prompts of one batch, all text or all token ids.
    min_head
        The shortest head worth sharing (characters or tokens), at least 1.

    Returns
    -------
    PrefixGroups
        Groups in the order of their first member; members ascending.

    Raises
    ------
    ValueError
        When ``min_head`` is not a positive integer.
    TypeError
        When the prompts mix text and token ids.

    Examples
    --------
    >>> header = "Translate to French. cat: chat. dog: chien. "
    >>> found = prefix_groups([header + "bird:", "Hello", header + "fish:"], min_head=16)
    >>> found
    PrefixGroups(order=[0, 2, 1], sizes=[2, 1], heads=[44, 0])
    >>> list(found.groups())
    [(44, [0, 2]), (0, [1])]
    """
    if isinstance(min_head, bool) or not isinstance(min_head, int) or min_head < 1:
        raise ValueError(f"min_head must be a positive integer, got {min_head!r}")
    count = len(prompts)
    if not count:
        return PrefixGroups([], [], [])
    keys, width = _comparable(prompts)
    least = min_head * width
    heads = list(map(operator.itemgetter(slice(0, min(PROBE, min_head) * width)), keys))
    if len(set(heads)) == count:  # nothing starts alike: the common case of unrelated prompts
        return PrefixGroups(list(range(count)), [1] * count, [0] * count)
    buckets: dict[Prompt, list[int]] = {}
    for index, head in enumerate(heads):
        buckets.setdefault(head, []).append(index)
    found: list[tuple[list[int], int]] = []  # (members, head)
    for members in buckets.values():
        if len(members) == 1:
            found.append((members, 0))
        else:
            found.extend(_split(keys, members, least, width))
    found.sort(key=lambda group: group[0][0])
    order: list[int] = []
    for members, _ in found:
        order.extend(members)
    return PrefixGroups(order, [len(m) for m, _ in found], [h for _, h in found])


def _comparable(prompts: Sequence[Prompt]) -> tuple[list[str | bytes], int]:
    """The prompts as ``str`` or ``bytes`` (token ids packed, ``width`` bytes each) and that width."""
    kinds = set(map(type, prompts))  # in C: a type test per prompt would cost more than the grouping
    if all(issubclass(kind, str) for kind in kinds) or kinds == {bytes}:
        return cast("list[str | bytes]", list(prompts)), 1  # all str, or all bytes: the kinds just checked
    if any(issubclass(kind, (str, bytes)) for kind in kinds):
        raise TypeError("prompts must all be text or all be sequences of integer token ids")
    for code in ("I", "q"):  # 4 bytes per id when they fit, else 8
        try:
            packed: list[str | bytes] = [array.array(code, p).tobytes() for p in prompts]
        except (OverflowError, TypeError):
            continue
        return packed, array.array(code).itemsize
    raise TypeError("prompts must all be text or all be sequences of integer token ids")


def _split(keys: list[str | bytes], members: list[int], least: int, width: int) -> list[tuple[list[int], int]]:
    """The groups ``(members, head)`` of one bucket (members that begin alike), cut where heads part before ``least``."""
    texts = operator.itemgetter(*members)(keys)  # a tuple, made in C
    # The usual bucket is one group. Its head is at most what the first member
    # shares with a few others; if every member starts with that, it is exactly
    # the group's head: one pass in C over the heads, no sort.
    step = max(1, len(texts) // SAMPLES)
    shared = min(common_prefix_length(texts[0], other) for other in texts[1::step])
    if shared >= least and all(map(operator.methodcaller("startswith", texts[0][:shared]), texts)):
        return [(members, shared // width)]
    shared = common_prefix_length(min(texts), max(texts))  # sorted order's ends: their head is everyone's
    if shared >= least:
        return [(members, shared // width)]
    order = sorted(range(len(members)), key=texts.__getitem__)
    groups: list[tuple[list[int], int]] = []
    run = [order[0]]
    for position in order[1:]:
        previous = texts[run[-1]]
        if len(previous) >= least and texts[position].startswith(previous[:least]):
            run.append(position)
            continue
        groups.append(_group(texts, members, run, width))
        run = [position]
    groups.append(_group(texts, members, run, width))
    return groups


def _group(texts: Sequence[AnyStr], members: list[int], run: list[int], width: int) -> tuple[list[int], int]:
    """A group from a run of sorted positions in one bucket: its head is the run's ends' common head."""
    chosen = sorted(members[p] for p in run)
    if len(run) == 1:
        return chosen, 0
    return chosen, common_prefix_length(texts[run[0]], texts[run[-1]]) // width
