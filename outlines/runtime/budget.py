"""Budgets: stop sending batches before an evaluation spends more than allowed.

``Budget(tokens=..., cost=...)`` is what the user allows one evaluation to
spend. The scheduler's ``Batcher`` asks a ``BudgetGuard`` before it sends each
batch: the batch needs its prompt tokens (counted by the backend:
``Backend.usage_bound``) plus ``max_tokens`` per sample, an upper bound on its
completion; it goes out only if what is spent, plus what batches in flight may
still spend, plus that need stays within the budget. A batch that does not fit
whole is split (``fitting``): its leading draws that fit go out, the rest is
refused. Once draws are refused no later batch is sent (``exhausted``):
refused draws fail with ``BudgetExceeded`` ("budget exhausted: ..."), so a
budget too small for a whole batch still buys what it can. When a batch ends its reservation
is replaced by the usage the backend reported (or kept whole when it reported
none). Cache hits cost nothing, so raising the budget and running again sends
only what was refused.

Money is counted exactly (``outlines.backends.usage``: ``Price.money``, the
budget's ``cost`` read as the decimal it is written as) and compared with no
rounding, so a batch split in any way needs what it needs whole, and a budget
equal to ``explain``'s estimate (rounded up to a micro-unit) admits the run.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

from outlines.backends.usage import Price, PriceTable, exact_money, price_of, reported
from outlines.common.errors import BudgetExceeded

__all__ = ["Budget", "BudgetGuard"]


@dataclass(frozen=True, eq=False)
class Budget:
    """The most one evaluation may spend: ``tokens`` (prompt + completion) and/or ``cost``.

    Parameters
    ----------
    tokens
        Prompt plus completion tokens, all backends together (``None``: no bound).
    cost
        Money, in the unit of the prices (``None``: no bound), read as the
        decimal it is written as and compared exactly: ``explain(...).cost``
        admits the run it estimates. Every model called must have a price:
        ``models.openai(..., price=(in, out))`` per million tokens, or an
        entry of ``prices``.
    prices
        A user price table, model name (or backend repr) -> ``(input_per_1M,
        output_per_1M)``; a model's own ``price`` wins.

    Examples
    --------
    >>> import outlines
    >>> outlines.Budget(tokens=10_000)
    Budget(tokens=10000)
    """

    tokens: int | None = None
    cost: float | None = None
    prices: PriceTable | None = None

    def __post_init__(self) -> None:
        if self.tokens is None and self.cost is None:
            raise ValueError("Budget needs tokens=, cost= or both")
        if self.tokens is not None and (isinstance(self.tokens, bool) or not isinstance(self.tokens, int)
                                        or self.tokens < 0):
            raise ValueError(f"Budget tokens must be an integer >= 0, got {self.tokens!r}")
        if self.cost is not None and (isinstance(self.cost, bool) or not isinstance(self.cost, (int, float))
                                      or not 0 <= self.cost < float("inf")):
            raise ValueError(f"Budget cost must be a number >= 0, got {self.cost!r}")

    def __repr__(self) -> str:
        parts = [f"tokens={self.tokens}"] if self.tokens is not None else []
        parts += [f"cost={self.cost:g}"] if self.cost is not None else []
        return f"Budget({', '.join(parts)})"


def resolve_budget(option: Any) -> Budget | None:
    """The ``budget=`` evaluation option, checked."""
    if option is None or isinstance(option, Budget):
        return option
    raise TypeError(f"budget must be an outlines.Budget or None, got {type(option).__name__}")


class BudgetGuard:
    """One evaluation's spending against its ``Budget``; see the module docstring."""

    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.limit = None if budget.cost is None else exact_money(budget.cost)
        self.tokens = 0  # spent, as reported (or reserved, where nothing was reported)
        self.cost = Fraction(0)  # exact money (``Price.money``)
        self.reserved: dict[int, tuple[int, Fraction]] = {}  # ticket -> (tokens, cost) in flight
        self.tickets = 0
        self.exhausted: BudgetExceeded | None = None

    def _price(self, backend: Any) -> Price | None:
        price = price_of(backend, self.budget.prices)
        if price is None and self.budget.cost is not None:
            raise ValueError(
                f"{self.budget!r} needs a price for {backend!r}: pass price=(input_per_1M, output_per_1M) "
                f"to its model, or Budget(prices={{{backend.model_name!r}: (input, output)}})"
            )
        return price

    def _need(self, backend: Any, draws: Sequence[Any], batch: bool = False) -> tuple[int, Fraction, bool]:
        """``(tokens, cost, priced)`` sending ``draws`` to ``backend`` may spend, at most."""
        prompt_tokens, completion = backend.usage_bound(draws)
        if completion is None:
            raise ValueError(
                f"{self.budget!r} needs max_tokens on every model call (it bounds what a completion "
                f"may cost); a call to {backend!r} sets none"
            )
        price = self._price(backend)
        cost = price.money(prompt_tokens, completion, jobs=batch) if price is not None else Fraction(0)
        return prompt_tokens + completion, cost, price is not None

    def _in_flight(self) -> tuple[int, Fraction]:
        return sum(t for t, _ in self.reserved.values()), sum((c for _, c in self.reserved.values()), Fraction(0))

    def _fits(self, tokens: int, cost: Fraction) -> bool:
        in_flight_tokens, in_flight_cost = self._in_flight()
        over_tokens = self.budget.tokens is not None and self.tokens + in_flight_tokens + tokens > self.budget.tokens
        over_cost = self.limit is not None and self.cost + in_flight_cost + cost > self.limit
        return not (over_tokens or over_cost)

    def fitting(self, backend: Any, draws: Sequence[Any], *, batch: bool = False) -> int:
        """How many of the leading ``draws`` fit in what is left: all, some (the batch is split) or none.

        Raises
        ------
        ValueError
            As ``admit``.
        """
        if self.exhausted is not None:
            return 0
        if self._fits(*self._need(backend, draws, batch)[:2]):
            return len(draws)
        low, high = 0, len(draws) - 1  # the need grows with the draws: the most that fit, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            if self._fits(*self._need(backend, draws[:middle], batch)[:2]):
                low = middle
            else:
                high = middle - 1
        return low

    def admit(self, backend: Any, draws: Sequence[Any], node: str, *, batch: bool = False) -> int:
        """Reserve what sending ``draws`` to ``backend`` may cost; a ticket for ``settle``.

        ``batch``: they go as provider batch jobs, at the jobs' price (``Price.job_discount``).

        Raises
        ------
        BudgetExceeded
            When the batch might pass the budget, or an earlier one was refused.
        ValueError
            When a draw has no ``max_tokens`` (its completion is unbounded), or
            a cost budget meets a backend without a price.
        """
        if self.exhausted is not None:
            raise self.exhausted.again(node)
        tokens, cost, priced = self._need(backend, draws, batch)
        if not self._fits(tokens, cost):
            in_flight_tokens, in_flight_cost = self._in_flight()
            self.exhausted = BudgetExceeded(
                node, self.budget, spent_tokens=self.tokens + in_flight_tokens,
                spent_cost=reported(self.cost + in_flight_cost),
                needed_tokens=tokens, needed_cost=reported(cost) if priced else None,
                backend=repr(backend), draws=len(draws),
            )
            raise self.exhausted
        self.tickets += 1
        self.reserved[self.tickets] = (tokens, cost)
        return self.tickets

    def settle(self, ticket: int, backend: Any, usage: Sequence[int], failed: bool, *, batch: bool = False) -> None:
        """The batch of ``ticket`` ended: charge its reported ``usage`` instead of its reservation.

        ``usage`` is ``(prompt, completion[, cached, cache_write])`` tokens
        (``BatchReport.tokens``): cached prompt tokens cost the cached-input
        price.

        A batch that reported no usage is charged its whole reservation if it
        succeeded (its real use is unknown) and nothing if it failed.
        """
        tokens, cost = self.reserved.pop(ticket, (0, Fraction(0)))
        if usage[0] or usage[1]:
            price = price_of(backend, self.budget.prices)
            tokens = usage[0] + usage[1]
            cost = price.money(usage[0], usage[1], cached_tokens=usage[2] if len(usage) > 2 else 0,
                               cache_write_tokens=usage[3] if len(usage) > 3 else 0, jobs=batch) if price is not None else Fraction(0)
        elif failed:
            tokens, cost = 0, Fraction(0)
        self.tokens += tokens
        self.cost += cost
