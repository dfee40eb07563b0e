"""Model calls inside a schedule: queues, Waits, batches as data, the batcher.

A ready ``Generate`` node turns into a ``Wait`` for its draws, which join the
``BatchQueue`` of its backend and params (``queue_key``; inside a queue a draw
is its slot and its prompt: ``outlines.draws``). After each round of
dispatching the scheduler flushes the ``Batcher``: a queue's draws are taken,
each prompt's samples together (``queue``), the cache answers what it holds,
the rest is packed into ``Batch`` records (``batches``, with the one packing
rule of ``outlines.draws.packing``) and each is handed to its backend; values
come back to the Waits that want them (``waiting``), and a complete Wait
finishes its node (``batcher``).

- ``waiting``: ``Wait`` (one node's outstanding draws) and ``Waiters`` (who waits for each draw of a slot).
- ``queue``: ``queue_key``, ``BatchQueue`` and ``SlotQueue``: draws not sent yet.
- ``batches``: ``Batch`` records and ``pack_draws`` (shared with ``explain``).
- ``batcher``: the ``Batcher`` that runs the steps.
"""
from __future__ import annotations

from outlines.runtime.batching.batcher import Batcher, Schedule, cached_values
from outlines.runtime.batching.batches import Batch, pack_draws
from outlines.runtime.batching.queue import BatchQueue, SlotQueue, queue_key
from outlines.runtime.batching.waiting import Wait, Waiters

__all__ = [
    "Batch",
    "BatchQueue",
    "Batcher",
    "Schedule",
    "SlotQueue",
    "Wait",
    "Waiters",
    "cached_values",
    "pack_draws",
    "queue_key",
]
