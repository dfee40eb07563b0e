"""What identifies a draw inside the batcher: its queue, its slot and its prompt.

A model call's draws join the ``BatchQueue`` of ``queue_key(backend, params)``:
one per backend and params, constraints aside (draws that differ only in their
constraint share a batch: a local model masks each row under its own
constraint in one forward pass). Inside a queue a draw is identified by its
*slot* (``Slot``: its params and draw number) and its prompt, the key of the
cache's memory too. Every table is kept per slot and keyed by prompt (a
``str``, whose hash Python caches), so joining, deduplicating and handing
back 100,000 draws are C-speed dict operations; there is no per-draw key
object. A batch carries its draws as columns (``DrawBatch``): a slot's
prompts become a batch with ``draws_of``, and a batch is split back into its
slots with ``DrawBatch.by_slot``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from outlines.backends.base import Backend, DrawBatch, GenerationParams, Slot

__all__ = ["Slot", "draws_of", "queue_key"]


def queue_key(backend: Backend, params: GenerationParams) -> tuple[Backend, GenerationParams]:
    """The ``BatchQueue`` a model call's draws join: its backend and params, constraint aside."""
    return backend, (params if params.constraint is None else replace(params, constraint=None))


def draws_of(slot: Slot, prompts: list[Any]) -> DrawBatch:
    """The draws of ``slot`` with these ``prompts`` (the list itself, not a copy), as a batch."""
    return DrawBatch(prompts, [slot.params] * len(prompts), [slot.number] * len(prompts))
