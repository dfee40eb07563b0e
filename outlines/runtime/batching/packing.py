"""Batches as data: the backend calls a queue's ready draws make.

``pack_draws`` cuts the draws a queue is about to send (``BatchQueue.take``,
less the cache's hits) into ``Batch`` records with the package's one packing
rule (``outlines.backends.packing.pack``): each prompt's draws (its samples)
are a group that never splits unless it alone exceeds the backend's
``max_batch``. The batcher sends these records; ``explain`` makes them with
the same call on the draws it predicts (adding the groups of prompts it
cannot know, ``unknown``), so it reads the plan the batcher would make.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from outlines.backends.base import Backend, DrawBatch
from outlines.backends.packing import pack

__all__ = ["Batch", "group_sizes", "pack_draws", "whole_batches"]


@dataclass(frozen=True)
class Batch:
    """One backend call: the draws it sends, and in a dry run the draws whose prompts are unknown."""

    backend: Backend
    draws: DrawBatch
    #: Draws of prompts a dry run cannot know (``explain``); 0 in a real run.
    unknown: int = 0

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


def pack_draws(backend: Backend, draws: DrawBatch, unknown: Sequence[int] = (), *, jobs: bool = False) -> list[Batch]:
    """The calls to ``backend`` that send ``draws`` (each prompt's draws adjacent, as ``take`` gives them).

    ``unknown`` are the sizes of groups of draws whose prompts a dry run
    cannot know; they are packed after the known ones. ``jobs``: the draws go
    as provider batch jobs (``outlines.runtime.jobs``), one call per round
    whatever ``max_batch`` (the job client splits at the provider's limits).
    """
    counts = pack([*group_sizes(draws), *unknown], None if jobs else backend.max_batch)
    if len(counts) == 1 and not unknown:
        return [Batch(backend, draws)]
    batches, start, known = [], 0, len(draws)
    for count in counts:
        stop = min(start + count, known)
        batches.append(Batch(backend, draws[start:stop] if start < known else draws[0:0], count - max(stop - start, 0)))
        start += count
    return batches


def whole_batches(backend: Backend, draws: DrawBatch) -> tuple[DrawBatch, DrawBatch]:
    """``draws`` cut after its last full batch: (the draws of the full batches, the rest)."""
    counts = pack(group_sizes(draws), backend.max_batch)
    cut = sum(counts) - (counts[-1] if counts and counts[-1] < (backend.max_batch or 0) else 0)
    return draws[:cut], draws[cut:]
