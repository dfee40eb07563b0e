"""Draws: one sample of one prompt (``Draw``), its slot, and draws held as columns (``DrawColumns``).

A draw is identified by its *slot* (its params and draw number, ``Slot``) and
its prompt. The tables that find draws (the batcher's queues, the cache's
memory) are kept per slot and keyed by prompt, so a lookup hashes a string,
whose hash Python caches. The scheduler hands a backend a ``DrawColumns``, and
the batcher and the cache split one into its slots with the one rule,
``DrawColumns.by_slot``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, NamedTuple, Sequence, overload

from outlines.draws.params import GenerationParams

__all__ = ["Draw", "DrawColumns", "Slot"]


@dataclass(frozen=True)
class Draw:
    """One sample of one prompt: the prompt, its parameters and its draw number.

    A draw is identified by its *slot* (its params and draw number, ``Slot``)
    and its prompt: tables that find draws (the scheduler's queues, the
    cache's memory) are kept per slot and keyed by prompt, so each lookup
    hashes a string, whose hash Python caches. Many draws travel as
    columns (``DrawColumns``). Draws of deterministic parameters all carry
    ``draw=0`` (they collapse).
    """

    prompt: str
    params: GenerationParams = field(default_factory=GenerationParams)
    draw: int = 0


class Slot(NamedTuple):
    """The draws of one params and one draw number: told apart by their prompt alone (see ``Draw``)."""

    params: GenerationParams
    number: int


class DrawColumns(Sequence[Draw]):
    """Draws held as columns: prompts, params and draw numbers.

    A batch (one backend call) reaches a backend's ``generate`` as one of
    these, and the cache is asked for draws in one: 100,000 prompts cost
    three lists, not 100,000 ``Draw`` objects. It is a
    ``Sequence[Draw]`` (indexing and iterating make the ``Draw`` objects on
    demand); a backend that needs only the text reads ``prompts``.

    Examples
    --------
    >>> batch = DrawColumns(["a", "b"], [GenerationParams()] * 2, [0, 3])
    >>> batch.prompts, batch[1].draw, len(batch)
    (['a', 'b'], 3, 2)
    """

    __slots__ = ("prompts", "params", "numbers")

    def __init__(self, prompts: list[Any], params: list[GenerationParams], numbers: list[int]) -> None:
        self.prompts = prompts
        self.params = params
        self.numbers = numbers

    @classmethod
    def in_slot(cls, slot: Slot, prompts: list[Any]) -> DrawColumns:
        """The draws of ``slot`` with these ``prompts`` (the list itself, not a copy)."""
        return cls(prompts, [slot.params] * len(prompts), [slot.number] * len(prompts))

    @classmethod
    def of(cls, draws: Iterable[Draw]) -> DrawColumns:
        """``draws`` as columns (already a ``DrawColumns``: itself)."""
        if isinstance(draws, DrawColumns):
            return draws
        draws = list(draws)
        return cls([d.prompt for d in draws], [d.params for d in draws], [d.draw for d in draws])

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def slot(self) -> Slot | None:
        """The slot of every draw, when they share one (else, or when empty, ``None``).

        Two C-speed ``list.count`` passes (an identity test per draw): a
        100,000 draws cost no Python step each.
        """
        params, numbers = self.params, self.numbers
        if not params:
            return None
        first, number = params[0], numbers[0]
        if params.count(first) == len(params) and numbers.count(number) == len(numbers):
            return Slot(first, int(number))
        return None

    def by_slot(self) -> list[tuple[Slot, list[int] | None]]:
        """The draws per slot: ``(slot, positions)``, positions ``None`` when all are in that slot.

        The usual columns have one slot (``slot``); several follow the order of their first draw.
        """
        if not self.params:
            return []
        one = self.slot
        if one is not None:
            return [(one, None)]
        groups: dict[Slot, list[int]] = {}
        for position, slot in enumerate(map(Slot, self.params, self.numbers)):
            groups.setdefault(slot, []).append(position)
        return [(Slot(slot.params, int(slot.number)), positions) for slot, positions in groups.items()]

    def take(self, positions: Sequence[int]) -> DrawColumns:
        """The draws at ``positions``, in that order."""
        prompts, params, numbers = self.prompts, self.params, self.numbers
        return DrawColumns([prompts[i] for i in positions], [params[i] for i in positions],
                         [numbers[i] for i in positions])

    @overload
    def __getitem__(self, index: int) -> Draw: ...

    @overload
    def __getitem__(self, index: slice) -> DrawColumns: ...

    def __getitem__(self, index: int | slice) -> Draw | DrawColumns:
        if isinstance(index, slice):
            return DrawColumns(self.prompts[index], self.params[index], self.numbers[index])
        return Draw(self.prompts[index], self.params[index], self.numbers[index])

    def __iter__(self) -> Iterator[Draw]:
        return map(Draw, self.prompts, self.params, self.numbers)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DrawColumns):
            return (self.prompts, self.numbers, self.params) == (other.prompts, other.numbers, other.params)
        return isinstance(other, (list, tuple)) and list(self) == list(other)

    # defining __eq__ without __hash__ leaves the batch unhashable (Python sets __hash__ to None)

    def __repr__(self) -> str:
        return f"DrawColumns({len(self)} draws)"
