"""Client-side rate limits for HTTP backends.

``TokenBucket`` spends a per-minute budget (requests or tokens) and says how
long to wait when it is overdrawn; it is thread-safe and holds no event-loop
state, so one bucket serves every loop a backend runs on. ``AIMDLimiter``
bounds requests in flight on one loop: it halves its limit when the server
says it is overloaded (429) and creeps back up by one per window of
successes (additive increase, multiplicative decrease).
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any, Callable

__all__ = ["AIMDLimiter", "TokenBucket"]


class TokenBucket:
    """A budget of ``per_minute`` units that refills continuously.

    Reservations may overdraw the bucket; the caller then waits until the
    debt is repaid, so waiters are served in order without polling.

    Parameters
    ----------
    per_minute
        Units (requests, tokens) allowed per minute; also the burst size.
    clock
        Monotonic clock in seconds (patched in tests).

    Examples
    --------
    >>> now = [0.0]
    >>> bucket = TokenBucket(60, clock=lambda: now[0])
    >>> bucket.reserve(60), bucket.reserve(1)
    (0.0, 1.0)
    """

    def __init__(self, per_minute: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not per_minute > 0:
            raise ValueError(f"a rate limit must be positive, got {per_minute!r}")
        self.capacity = float(per_minute)
        self.rate = self.capacity / 60.0
        self.clock = clock
        self._tokens = self.capacity
        self._stamp = clock()
        self._lock = threading.Lock()

    def reserve(self, amount: float) -> float:
        """Take ``amount`` units now; return the seconds to wait before using them.

        Amounts larger than the whole budget are charged as the whole budget,
        so a single huge request waits at most one minute instead of forever.
        """
        with self._lock:
            self._refill()
            self._tokens -= min(float(amount), self.capacity)
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def refund(self, amount: float) -> None:
        """Give back (or, negative, charge) units after the true cost is known."""
        with self._lock:
            self._refill()
            self._tokens = min(self.capacity, self._tokens + float(amount))

    async def acquire(self, amount: float = 1.0, *, sleep: Callable[[float], Any] = asyncio.sleep) -> None:
        """Reserve ``amount`` and wait until it is covered."""
        delay = self.reserve(amount)
        if delay > 0:
            await sleep(delay)

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


class AIMDLimiter:
    """An adaptive bound on requests in flight, for use on one event loop.

    Parameters
    ----------
    maximum
        The starting and largest limit.
    minimum
        The smallest limit after decreases.
    cooldown
        Seconds during which further overload signals do not halve again
        (one burst of 429s counts as one signal).
    clock
        Monotonic clock in seconds (patched in tests).

    Examples
    --------
    >>> limiter = AIMDLimiter(8)
    >>> limiter.on_overload(); limiter.limit
    4
    """

    def __init__(
        self,
        maximum: int,
        *,
        minimum: int = 1,
        cooldown: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.maximum = max(1, int(maximum))
        self.minimum = max(1, min(int(minimum), self.maximum))
        self.cooldown = cooldown
        self.clock = clock
        self.in_flight = 0
        self.peak = 0
        self._limit = float(self.maximum)
        self._last_decrease = -float("inf")
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._reserved = 0  # permits handed to woken waiters that have not resumed yet

    @property
    def limit(self) -> int:
        """The current bound on requests in flight."""
        return int(self._limit)

    def on_overload(self) -> None:
        """The server refused for load (429): halve the limit, once per cooldown."""
        now = self.clock()
        if now - self._last_decrease >= self.cooldown:
            self._last_decrease = now
            self._limit = max(float(self.minimum), self._limit / 2.0)

    def on_success(self) -> None:
        """A request succeeded: grow the limit by about one per ``limit`` successes."""
        if self._limit < self.maximum:
            self._limit = min(float(self.maximum), self._limit + 1.0 / self._limit)
            self._wake()

    async def acquire(self) -> None:
        """Wait for a free slot and take it (first come, first served)."""
        if self._waiters or self.in_flight + self._reserved >= self.limit:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._reserved -= 1  # a slot was kept for us: hand it on
                    self._wake()
                elif waiter in self._waiters:
                    self._waiters.remove(waiter)
                raise
            self._reserved -= 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def release(self) -> None:
        """Free a slot taken by ``acquire``."""
        self.in_flight -= 1
        self._wake()

    async def __aenter__(self) -> AIMDLimiter:
        await self.acquire()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        self.release()

    def _wake(self) -> None:
        while self._waiters and self.in_flight + self._reserved < self.limit:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._reserved += 1
