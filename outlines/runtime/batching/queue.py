"""Queues of draws waiting to be sent: one ``BatchQueue`` per backend and params.

A model call's draws join the ``BatchQueue`` of ``queue_key(backend,
params)``: one per backend and params, constraints aside (draws that differ
only in their constraint share a batch: a local model masks each row under
its own constraint in one forward pass). A queue holds one ``SlotQueue`` per
slot of its draws (params and draw number: ``outlines.draws.Slot``); inside
it a draw is its slot and its prompt, the key of the cache's memory too.
Every table is kept per slot and keyed by prompt (a ``str``, whose hash
Python caches), so joining, deduplicating and handing back 100,000 draws are
C-speed dict operations; there is no per-draw key object. A slot queue's
``pending`` table holds the prompts of its draws not sent yet, in arrival
order; its ``waiters`` know who waits for each draw pending or in flight
(``outlines.runtime.batching.waiting``).
``since`` is when the queue last went from empty to non-empty (its gathering
window starts then) and ``unready`` counts the plan's model calls on it not
dispatched yet (while some are, and other work runs, the window may stay
open). ``take`` empties the queue into one ``DrawColumns``: what the batcher
packs into batches (``outlines.runtime.batching.batches``).
"""
from __future__ import annotations

from dataclasses import replace
from itertools import chain
from typing import Any

from outlines.backends.base import Backend
from outlines.draws import DrawColumns, GenerationParams, Slot
from outlines.draws.packing import prefix_ordered
from outlines.runtime.batching.waiting import Wait, Waiters

__all__ = ["BatchQueue", "SlotQueue", "queue_key"]


def queue_key(backend: Backend, params: GenerationParams) -> tuple[Backend, GenerationParams]:
    """The ``BatchQueue`` a model call's draws join: its backend and params, constraint aside."""
    return backend, (params if params.constraint is None else replace(params, constraint=None))


class SlotQueue:
    """The draws of one slot of a queue: the prompts not sent yet (``pending``) and who waits for each draw."""

    __slots__ = ("slot", "pending", "waiters")

    def __init__(self, slot: Slot) -> None:
        self.slot = slot
        self.pending: dict[Any, None] = {}
        self.waiters = Waiters()

    def join(self, wait: Wait, prompts: dict[Any, None]) -> None:
        """``wait`` waits for the draws of these distinct prompts; those nobody waited for are queued."""
        self.add(self.waiters.join(wait, prompts))

    def add(self, prompts: dict[Any, None]) -> None:
        """Queue the draws of these distinct prompts (the first table queued is kept as it is, not copied)."""
        if not prompts:
            return
        if not self.pending:
            self.pending = prompts
        else:
            self.pending.update(prompts)


class BatchQueue:
    """Draws waiting to be sent to one backend with one set of params (constraints aside)."""

    __slots__ = ("backend", "slots", "since", "unready")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.slots: dict[Slot, SlotQueue] = {}
        self.since = 0.0
        self.unready = 0  # model calls of this queue not dispatched yet

    def slot(self, slot: Slot) -> SlotQueue:
        """The slot queue of ``slot`` (made on first use)."""
        found = self.slots.get(slot)
        if found is None:
            found = self.slots[slot] = SlotQueue(slot)
        return found

    def slot_of(self, params: GenerationParams, number: int) -> SlotQueue:
        """The slot queue of a draw with these params and draw number."""
        return self.slot(Slot(params, number))

    @property
    def pending(self) -> int:
        """Draws not sent yet."""
        return sum(len(slot.pending) for slot in self.slots.values())

    @property
    def constrained(self) -> bool:
        """Whether any of the queue's draws carries a constraint (then texts are checked)."""
        return any(slot.params.constraint is not None for slot in self.slots)

    def take(self) -> tuple[DrawColumns, Any]:
        """Empty the queue: its draws as one batch, each prompt's samples together, and a view of its prompts.

        Prompts that share a head the backend pays for once come together,
        group by group (``outlines.draws.packing.prefix_ordered``). The view (``None`` for
        several slots) holds the prompts of a one-slot queue without copying
        them: the cache's lookup reads it.
        """
        queued = [slot for slot in self.slots.values() if slot.pending]
        tables = [(slot.slot, slot.pending) for slot in queued]
        for slot in queued:
            slot.pending = {}
        if not tables:
            return DrawColumns([], [], []), None
        if len(tables) == 1:
            key, prompts = tables[0]
            return prefix_ordered(DrawColumns.in_slot(key, list(prompts)), self.backend.prefix_min_head), prompts.keys()
        return prefix_ordered(_interleaved(tables), self.backend.prefix_min_head), None

    def requeue(self, draws: DrawColumns) -> None:
        """Queue ``draws`` again (a remainder kept for the next flush)."""
        for slot, positions in draws.by_slot():
            prompts = draws.prompts if positions is None else [draws.prompts[i] for i in positions]
            self.slot(slot).add(dict.fromkeys(prompts))


def _interleaved(tables: list[tuple[Slot, dict[Any, None]]]) -> DrawColumns:
    """The draws of several slots, each prompt's draws (same params and prompt) next to each other."""
    first_params, first = tables[0][0].params, list(tables[0][1])
    if all(slot.params is first_params and len(table) == len(first) and list(table) == first for slot, table in tables):
        # The usual case, a k-sample call: every slot holds the same prompts. C-speed.
        k = len(tables)
        prompts = list(chain.from_iterable(zip(*([first] * k))))
        return DrawColumns(prompts, [first_params] * len(prompts), [slot.number for slot, _ in tables] * len(first))
    groups: dict[tuple[GenerationParams, Any], list[int]] = {}
    for slot, table in tables:
        for prompt in table:
            groups.setdefault((slot.params, prompt), []).append(slot.number)
    prompts_out: list[Any] = []
    params_out: list[GenerationParams] = []
    numbers_out: list[int] = []
    for (params, prompt), numbers in groups.items():
        prompts_out.extend([prompt] * len(numbers))
        params_out.extend([params] * len(numbers))
        numbers_out.extend(numbers)
    return DrawColumns(prompts_out, params_out, numbers_out)
