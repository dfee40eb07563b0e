"""Token buckets and the AIMD concurrency limiter, on a patched clock."""
from __future__ import annotations

import asyncio
import pickle

import pytest

from outlines.backends.ratelimit import AIMDLimiter, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bucket_allows_a_burst_then_paces() -> None:
    clock = Clock()
    bucket = TokenBucket(120, clock=clock)  # 2 per second
    assert [bucket.reserve(1) for _ in range(120)] == [0.0] * 120
    assert bucket.reserve(1) == pytest.approx(0.5)
    assert bucket.reserve(1) == pytest.approx(1.0)  # waiters queue up in order
    clock.now = 1.0
    assert bucket.reserve(1) == pytest.approx(0.5)


def test_bucket_caps_huge_reservations_and_takes_refunds() -> None:
    clock = Clock()
    bucket = TokenBucket(600, clock=clock)
    assert bucket.reserve(10_000) == 0.0  # charged as the whole budget
    assert bucket.reserve(10) == pytest.approx(1.0)
    bucket.refund(600)
    assert bucket.reserve(10) == 0.0


def test_bucket_rejects_bad_rates_and_pickles() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0)
    bucket = pickle.loads(pickle.dumps(TokenBucket(60)))
    assert bucket.reserve(1) == 0.0


def test_bucket_acquire_sleeps_only_when_overdrawn() -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    bucket = TokenBucket(60, clock=Clock())
    asyncio.run(bucket.acquire(60, sleep=sleep))
    asyncio.run(bucket.acquire(2, sleep=sleep))
    assert waits == [pytest.approx(2.0)]


def test_aimd_halves_once_per_cooldown_and_recovers() -> None:
    clock = Clock()
    limiter = AIMDLimiter(16, cooldown=1.0, clock=clock)
    limiter.on_overload()
    limiter.on_overload()  # same burst: one decrease
    assert limiter.limit == 8
    clock.now = 2.0
    limiter.on_overload()
    assert limiter.limit == 4
    for _ in range(200):
        limiter.on_success()
    assert limiter.limit == 16
    for _ in range(10):
        clock.now += 2
        limiter.on_overload()
    assert limiter.limit == 1


def test_aimd_bounds_in_flight_and_survives_cancellation() -> None:
    async def main() -> tuple[int, int]:
        limiter = AIMDLimiter(3)
        active = 0
        peak = 0

        async def work() -> None:
            nonlocal active, peak
            async with limiter:
                active += 1
                peak = max(peak, active)
                try:
                    await asyncio.sleep(0.01)
                finally:
                    active -= 1

        tasks = [asyncio.ensure_future(work()) for _ in range(12)]
        await asyncio.sleep(0)
        tasks[5].cancel()  # a waiter
        tasks[0].cancel()  # a holder
        await asyncio.gather(*tasks, return_exceptions=True)
        return peak, limiter.in_flight

    peak, in_flight = asyncio.run(main())
    assert peak == 3 and in_flight == 0


def test_aimd_lower_limit_applies_to_new_acquires() -> None:
    async def main() -> int:
        limiter = AIMDLimiter(4, clock=Clock())
        limiter.on_overload()
        peak = 0

        async def work() -> None:
            nonlocal peak
            async with limiter:
                peak = max(peak, limiter.in_flight)
                await asyncio.sleep(0.005)

        await asyncio.gather(*(work() for _ in range(10)))
        return peak

    assert asyncio.run(main()) == 2
