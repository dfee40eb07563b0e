"""Waiting for draws: one rule for every model call, however large.

State, named once (Dask's ``local.py`` style):

- a ``Wait`` per running Generate node: the prompt of each of its elements
  (``prompts``), the slot of each of its draw numbers (``slots``: k of them
  for a k-sample call, each a ``Waiters``), the values of its distinct draws
  as they arrive (``found``, per slot), how many distinct draws are still
  ``missing``, the elements decided before anything is sent (``settled``:
  a prompt that failed upstream) and the draws the cache answered (``hits``);
- per slot of a queue, ``Waiters``: who waits for each of its draws that is
  pending or in flight (``waits``: prompt -> the Waits that want it);
- a ``NodeParts`` per running node whose elements draw in namespaces of their
  own (a stacked loop's body): one Wait per namespace as its parts, their
  values put back in the node's order once all are complete.

The rule: a node's value at position ``e * k + j`` is the value of the draw
of ``slots[j]`` and ``prompts[e]``; once nothing is missing it is read out of
``found`` in one pass (``Wait.results``). Draws reach a Wait through
``Waiters.hand_over``, in one step for all the draws of a batch that the same
Waits want. A node that wants a draw already pending or in flight waits for
it instead of sending it again (deduplication).

``Waiters`` writes its map lazily for the latest join only: a join that
shares no draw with the slot's (the usual case) is kept as its ``claim`` (its
distinct prompts and its Wait) until a later join, or a batch that holds
draws of other Waits, needs the map. So a call over 100,000 prompts that goes
out in one batch or in several costs C-speed passes only (join, then hand
over), and writes no map.
"""
from __future__ import annotations

from collections import deque
from itertools import repeat
from operator import is_
from typing import Any, Sequence

__all__ = ["Wait", "Waiters", "NodeParts"]


class Wait:
    """The outstanding draws of one running Generate node (see the module docstring).

    Parameters
    ----------
    index, shape
        The node's position in the plan and its output shape.
    prompts
        The prompt of each element, flat (an element in ``settled`` is not drawn).
    slots
        The slot of each draw number, in order (the same one k times for a
        greedy k-sample call: its draws collapse).
    settled
        ``element -> value`` of the elements decided up front (each of their
        positions holds it).
    """

    __slots__ = ("index", "shape", "prompts", "slots", "found", "hits", "missing", "settled", "all_values", "all_hit",
                 "parent")

    def __init__(
        self, index: int, shape: tuple[int, ...], prompts: list[Any], slots: Sequence[Waiters],
        settled: dict[int, Any] | None = None,
    ) -> None:
        self.index = index
        self.shape = shape
        self.prompts = prompts
        self.slots = list(slots)
        self.found: dict[Waiters, dict[Any, Any]] = {slot: {} for slot in self.slots}
        self.hits: dict[Waiters, set[Any]] = {}
        self.missing = 0
        self.settled = settled or {}
        self.all_values: list[Any] | None = None  # its values, when they came in one piece in its prompts' order
        self.all_hit = False
        self.parent: NodeParts | None = None  # the node it is a part of, when its elements draw in namespaces apart

    @property
    def count(self) -> int:
        """Positions of the node's output (elements x draw numbers)."""
        return len(self.prompts) * len(self.slots)

    def receive(self, slot: Waiters, prompts: Sequence[Any], values: list[Any], hit: bool) -> None:
        """The values of distinct draws of ``slot`` this Wait wants (``hit``: from the cache).

        Its every draw at once, in the order of its prompts (a call over
        distinct prompts sent in one batch), are its results as they are.
        """
        found = self.found[slot]
        if not found and len(self.slots) == 1 and not self.settled and prompts == self.prompts:
            self.all_values, self.all_hit = values, hit
            self.missing -= len(prompts)
            return
        found.update(zip(prompts, values))
        self.missing -= len(prompts)
        if hit:
            self.hits.setdefault(slot, set()).update(prompts)

    def receive_one(self, slot: Waiters, prompt: Any, value: Any, hit: bool) -> None:
        """The value of one draw of ``slot`` this Wait wants."""
        self.found[slot][prompt] = value
        self.missing -= 1
        if hit:
            self.hits.setdefault(slot, set()).add(prompt)

    def results(self) -> list[Any]:
        """The value of each position, element-major (all draws of element 0 first)."""
        if self.all_values is not None:
            return self.all_values
        prompts, k, settled = self.prompts, len(self.slots), self.settled
        if k == 1:
            found = self.found[self.slots[0]]
            values = list(map(found.get if settled else found.__getitem__, prompts))
        else:
            values = [None] * (len(prompts) * k)
            for j, slot in enumerate(self.slots):
                found = self.found[slot]
                values[j::k] = map(found.get if settled else found.__getitem__, prompts)
        for element, value in settled.items():
            values[element * k : (element + 1) * k] = [value] * k
        return values

    def cache_hits(self) -> int:
        """Positions whose draw the cache answered."""
        if self.all_values is not None:
            return len(self.all_values) if self.all_hit else 0
        if not self.hits:
            return 0
        total = 0
        for slot in self.slots:
            hits = self.hits.get(slot)
            if not hits:
                continue
            if self.settled:
                total += sum(1 for e, p in enumerate(self.prompts) if e not in self.settled and p in hits)
            elif len(hits) == len(self.found[slot]):
                total += len(self.prompts)
            else:
                total += sum(map(hits.__contains__, self.prompts))
        return total

    def element_of(self, prompt: Any) -> int:
        """The first element drawing ``prompt`` (what a failure of its draw names)."""
        return self.prompts.index(prompt)


class NodeParts:
    """A node whose elements draw in namespaces of their own: one ``Wait`` per namespace, as its parts.

    Each part waits for the elements of one namespace (their flat
    ``positions`` in the node); once every part is complete, ``results``
    puts their values back in the node's element-major order.

    Parameters
    ----------
    index, shape
        The node's position in the plan and its output shape.
    size, k
        Its elements (prompts) and draws per element.
    settled
        ``element -> value`` of the elements decided up front, by flat position in the node.
    """

    __slots__ = ("index", "shape", "size", "k", "settled", "parts", "left")

    def __init__(self, index: int, shape: tuple[int, ...], size: int, k: int, settled: dict[int, Any]) -> None:
        self.index, self.shape, self.size, self.k, self.settled = index, shape, size, k, settled
        self.parts: dict[Wait, list[int]] = {}  # each part -> the node's positions of its elements
        self.left = 0  # parts not complete yet

    def add(self, wait: Wait, positions: list[int]) -> None:
        """``wait`` waits for the elements at ``positions`` of the node."""
        wait.parent = self
        self.parts[wait] = positions
        self.left += 1

    def position(self, wait: Wait, element: int) -> int:
        """The node's position of element ``element`` of part ``wait``."""
        return self.parts[wait][element]

    def results(self) -> list[Any]:
        """The value of each position of the node, element-major, from its parts."""
        k = self.k
        values: list[Any] = [None] * (self.size * k)
        for wait, positions in self.parts.items():
            got = wait.results()
            if k == 1:
                for position, value in zip(positions, got):
                    values[position] = value
            else:
                for j, position in enumerate(positions):
                    values[position * k : (position + 1) * k] = got[j * k : (j + 1) * k]
        return values

    def cache_hits(self) -> int:
        """Positions whose draw the cache answered."""
        return sum(wait.cache_hits() for wait in self.parts)


class Waiters:
    """Who waits for each draw of one slot that is pending or in flight (see the module docstring)."""

    __slots__ = ("waits", "claim")

    def __init__(self) -> None:
        self.waits: dict[Any, tuple[Wait, ...]] = {}
        self.claim: tuple[dict[Any, None], Wait] | None = None  # the latest join, not in ``waits`` yet

    def join(self, wait: Wait, prompts: dict[Any, None]) -> dict[Any, None]:
        """Make ``wait`` wait for the draws of these distinct ``prompts``; returns those nobody waited for.

        ``prompts`` is kept (not copied) while it is the claim: the caller
        must not change it.
        """
        wait.missing += len(prompts)
        self._write()
        waits = self.waits
        if not waits or waits.keys().isdisjoint(prompts.keys()):  # a view: the smaller side is walked
            self.claim = (prompts, wait)
            return prompts
        new: dict[Any, None] = {}
        alone = (wait,)
        for prompt in prompts:
            owners = waits.get(prompt)
            if owners is None:
                waits[prompt] = alone
                new[prompt] = None
            else:
                waits[prompt] = owners + alone
        return new

    def _write(self) -> None:
        """Write the claim into the map."""
        if self.claim is not None:
            prompts, wait = self.claim
            self.claim = None
            self.waits.update(zip(prompts, repeat((wait,))))

    def hand_over(self, prompts: list[Any], values: list[Any], hit: bool) -> list[Wait]:
        """Give these distinct draws' values to the Waits that want them; returns the Waits now complete."""
        if not prompts:
            return []
        claim = self.claim
        if claim is not None:
            claimed, wait = claim
            in_order = len(claimed) == len(prompts) and list(claimed) == prompts  # the usual: all of it, in order
            if in_order or all(map(claimed.__contains__, prompts)):  # only the latest join wants them
                if len(claimed) == len(prompts):
                    self.claim = None
                else:
                    deque(map(claimed.pop, prompts), maxlen=0)
                wait.receive(self, prompts, values, hit)
                return [] if wait.missing else [wait]
            self._write()
        waits = self.waits
        owners = waits.get(prompts[0])
        done: list[Wait] = []
        if owners is not None and all(map(is_, map(waits.get, prompts), repeat(owners))):  # one join's draws
            if len(waits) == len(prompts):
                waits.clear()
            else:
                deque(map(waits.pop, prompts), maxlen=0)
            for wait in owners:
                wait.receive(self, prompts, values, hit)
                if not wait.missing:
                    done.append(wait)
            return done
        for prompt, value in zip(prompts, values):
            for wait in waits.pop(prompt, ()):
                wait.receive_one(self, prompt, value, hit)
                if not wait.missing:
                    done.append(wait)
        return done

    def pop(self, prompt: Any) -> tuple[Wait, ...]:
        """The Waits that want the draw of ``prompt``, which no longer waits (it failed)."""
        claim = self.claim
        if claim is not None and prompt in claim[0]:
            claimed, wait = claim
            del claimed[prompt]
            if not claimed:
                self.claim = None
            return (wait,)
        return self.waits.pop(prompt, ())

    def first(self, prompt: Any) -> Wait | None:
        """The first Wait that wants the draw of ``prompt`` (``None``: nobody)."""
        claim = self.claim
        if claim is not None and prompt in claim[0]:
            return claim[1]
        owners = self.waits.get(prompt)
        return owners[0] if owners else None

    def wanting(self, prompts: Sequence[Any]) -> list[Wait]:
        """The Waits that want any of these draws, in first-seen order."""
        claim = self.claim
        if claim is not None and all(map(claim[0].__contains__, prompts)):
            return [claim[1]]
        found: dict[int, Wait] = {}
        for prompt in prompts:
            if claim is not None and prompt in claim[0]:
                found.setdefault(id(claim[1]), claim[1])
            for wait in self.waits.get(prompt, ()):
                found.setdefault(id(wait), wait)
        return list(found.values())

