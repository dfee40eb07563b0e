"""Batches as data: the backend calls a queue's ready draws make.

``pack_draws`` cuts the draws a queue is about to send (``BatchQueue.take``,
less the cache's hits) into ``Batch`` records with the package's one packing
rule (``outlines.backends.packing.pack``): each prompt's draws (its samples)
are a group that never splits unless it alone exceeds the backend's
``max_batch``. The batcher sends these records; ``explain`` makes them with
the same call on the draws it predicts (adding the groups of prompts it
cannot know, ``unknown``), so it reads the plan the batcher would make.

Prompts that share a long head (``Backend.prefix_min_head`` characters: a
provider's prompt cache, a local model's shared prefill) are one *prefix
group* (``outlines.backends.prefix.prefix_groups``): ``prefix_ordered`` puts
each group's prompts next to each other (``take`` does it for every round),
and packing keeps a group in one batch unless it alone exceeds ``max_batch``;
then it is cut between prompts, as any run of prompts is.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Sequence

from outlines.backends.base import Backend, DrawBatch
from outlines.backends.hosted import HostedBackend
from outlines.backends.packing import pack
from outlines.backends.prefix import PrefixGroups, prefix_groups

__all__ = ["Batch", "group_sizes", "pack_draws", "prefix_ordered", "whole_batches"]


@dataclass(frozen=True)
class Batch:
    """One backend call: the draws it sends, and in a dry run the draws whose prompts are unknown."""

    backend: Backend
    draws: DrawBatch
    #: Draws of prompts a dry run cannot know (``explain``); 0 in a real run.
    unknown: int = 0
    #: Batch mode: the draws go as provider batch jobs (``outlines.runtime.jobs``), at the batch price;
    #: ``False``: a live call (also, in batch mode, draws whose constraint no job line can carry).
    jobs: bool = False

    @property
    def size(self) -> int:
        """Draws in the call."""
        return len(self.draws) + self.unknown


def group_sizes(draws: DrawBatch) -> list[int]:
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


def _runs(draws: DrawBatch) -> tuple[list[int], list[Any]]:
    """Each prompt's run of draws: its size and its prompt."""
    sizes = group_sizes(draws)
    if len(sizes) == len(draws):
        return sizes, draws.prompts
    return sizes, [draws.prompts[start] for start in accumulate(sizes[:-1], initial=0)]


def _prefix_groups(backend: Backend, prompts: list[Any]) -> PrefixGroups | None:
    """The prefix groups of these prompts for ``backend``; ``None`` when no two share a head worth keeping together."""
    min_head = backend.prefix_min_head
    if min_head is None or len(prompts) < 2:
        return None
    try:
        found = prefix_groups(prompts, min_head)
    except TypeError:  # prompts that are not all text: there is no head to share
        return None
    return None if len(found.sizes) == len(prompts) else found


def prefix_ordered(backend: Backend, draws: DrawBatch) -> DrawBatch:
    """``draws`` (each prompt's draws adjacent) with each prefix group's prompts next to each other.

    Groups come in the order of their first prompt and keep their prompts'
    order; ``draws`` itself when nothing moves (the backend gains nothing
    from shared heads, or no two prompts share one).

    Examples
    --------
    >>> from outlines.backends.base import GenerationParams
    >>> from outlines.backends.function import FunctionBackend
    >>> backend = FunctionBackend(lambda p: p)
    >>> backend.prefix_min_head = 8
    >>> head = "Translate to French: "
    >>> draws = DrawBatch([head + "cat", "Hello", head + "dog"], [GenerationParams()] * 3, [0] * 3)
    >>> prefix_ordered(backend, draws).prompts
    ['Translate to French: cat', 'Translate to French: dog', 'Hello']
    """
    if backend.prefix_min_head is None:  # no head to share: nothing moves
        return draws
    sizes, prompts = _runs(draws)
    found = _prefix_groups(backend, prompts)
    if found is None or found.order == list(range(len(prompts))):
        return draws
    if len(sizes) == len(draws):
        return draws.take(found.order)
    starts = list(accumulate(sizes, initial=0))
    return draws.take([position for run in found.order for position in range(starts[run], starts[run + 1])])


def _units(backend: Backend, draws: DrawBatch) -> list[int]:
    """What ``pack`` packs: each prompt's run, or a whole prefix group where it fits in one batch."""
    sizes, prompts = _runs(draws)
    max_batch = backend.max_batch
    found = _prefix_groups(backend, prompts) if max_batch is not None else None
    if found is None or found.order != list(range(len(prompts))):  # no groups, or not ordered by them
        return sizes
    units: list[int] = []
    start = 0
    for count in found.sizes:
        part = sizes[start : start + count]
        start += count
        total = sum(part)
        if total <= max_batch:  # type: ignore[operator]  # checked above
            units.append(total)
        else:  # too big for one batch: cut between its prompts
            units.extend(part)
    return units


def pack_draws(backend: Backend, draws: DrawBatch, unknown: Sequence[int] = (), *, jobs: bool = False) -> list[Batch]:
    """The calls to ``backend`` that send ``draws`` (each prompt's draws adjacent, as ``take`` gives them).

    A prefix group (see the module docstring) stays in one call when it fits.
    ``unknown`` are the sizes of groups of draws whose prompts a dry run
    cannot know; they are packed after the known ones. ``jobs``: the draws go
    as provider batch jobs (``outlines.runtime.jobs``), one call per round
    whatever ``max_batch`` (the job client splits at the provider's limits),
    except the draws whose constraint a job line cannot carry
    (``HostedBackend.constraint_field(..., job=True)`` is ``None``): checked
    here, a draw breaking it would be asked again in a new job, so they go in
    live calls, packed as live draws are.
    """
    if jobs:
        carries: dict[Any, bool] = {}  # per constraint: a round's draws share a few
        live = [i for i, params in enumerate(draws.params) if not _job_carries(backend, params.constraint, carries)] \
            if isinstance(backend, HostedBackend) else []
        if live:
            carried = sorted(set(range(len(draws))) - set(live))
            return [*_pack(backend, draws.take(carried), unknown, jobs=True),
                    *_pack(backend, draws.take(live), (), jobs=False)]
    return _pack(backend, draws, unknown, jobs=jobs)


def _job_carries(backend: HostedBackend, constraint: Any, known: dict[Any, bool]) -> bool:
    if constraint is None:
        return True
    if constraint not in known:
        known[constraint] = backend.constraint_field(constraint, job=True) is not None
    return known[constraint]


def _pack(backend: Backend, draws: DrawBatch, unknown: Sequence[int], *, jobs: bool) -> list[Batch]:
    max_batch = None if jobs else backend.max_batch
    if max_batch is None and not unknown:  # one call takes them all: no step per draw
        return [Batch(backend, draws, jobs=jobs)] if len(draws) else []
    counts = pack([*_units(backend, draws), *unknown], max_batch)
    if len(counts) == 1 and not unknown:
        return [Batch(backend, draws, jobs=jobs)]
    batches, start, known = [], 0, len(draws)
    for count in counts:
        stop = min(start + count, known)
        batches.append(Batch(backend, draws[start:stop] if start < known else draws[0:0],
                             count - max(stop - start, 0), jobs))
        start += count
    return batches


def whole_batches(backend: Backend, draws: DrawBatch) -> tuple[DrawBatch, DrawBatch]:
    """``draws`` cut after its last full batch: (the draws of the full batches, the rest)."""
    counts = pack(_units(backend, draws), backend.max_batch)
    cut = sum(counts) - (counts[-1] if counts and counts[-1] < (backend.max_batch or 0) else 0)
    return draws[:cut], draws[cut:]
