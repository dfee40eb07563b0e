"""Batches as data: the backend calls a queue's ready draws make.

``pack_draws`` cuts the draws a queue is about to send (``BatchQueue.take``,
less the cache's hits) into ``Batch`` records with the package's one packing
rule (``outlines.draws.packing``): each prompt's draws (its samples) are a
group that never splits unless it alone exceeds the backend's ``max_batch``,
and the prompts of a prefix group (sharing ``Backend.prefix_min_head``
characters) stay in one batch where they fit. The batcher sends these
records; ``explain`` makes them with the same call on the draws it predicts
(adding the groups of prompts it cannot know, ``unknown``), so it reads the
plan the batcher would make.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from outlines.backends.base import Backend
from outlines.backends.hosted import HostedBackend
from outlines.draws import DrawColumns, pack
from outlines.draws.packing import draw_units

__all__ = ["Batch", "pack_draws"]


@dataclass(frozen=True)
class Batch:
    """One backend call: the draws it sends, and in a dry run the draws whose prompts are unknown."""

    backend: Backend
    draws: DrawColumns
    #: Draws of prompts a dry run cannot know (``explain``); 0 in a real run.
    unknown: int = 0
    #: Job mode: the draws go as provider batch jobs (``outlines.runtime.jobs``), at the jobs' price;
    #: ``False``: a live call (also, in job mode, draws whose constraint no job line can carry).
    jobs: bool = False

    @property
    def size(self) -> int:
        """Draws in the call."""
        return len(self.draws) + self.unknown


def pack_draws(backend: Backend, draws: DrawColumns, unknown: Sequence[int] = (), *, jobs: bool = False) -> list[Batch]:
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


def _pack(backend: Backend, draws: DrawColumns, unknown: Sequence[int], *, jobs: bool) -> list[Batch]:
    max_batch = None if jobs else backend.max_batch
    if max_batch is None and not unknown:  # one call takes them all: no step per draw
        return [Batch(backend, draws, jobs=jobs)] if len(draws) else []
    counts = pack([*draw_units(draws, max_batch, backend.prefix_min_head), *unknown], max_batch)
    if len(counts) == 1 and not unknown:
        return [Batch(backend, draws, jobs=jobs)]
    batches, start, known = [], 0, len(draws)
    for count in counts:
        stop = min(start + count, known)
        batches.append(Batch(backend, draws[start:stop] if start < known else draws[0:0],
                             count - max(stop - start, 0), jobs))
        start += count
    return batches
