"""outlines.threads: the shared pool, and the signal that an event loop is busy."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from outlines import threads


def test_blocking_calls_run_in_the_shared_pool() -> None:
    async def main() -> tuple[str, str]:
        name = await threads.run_blocking(lambda: threading.current_thread().name)
        keyword = await threads.run_blocking(lambda *, x: x, x="kw")
        return name, keyword

    name, keyword = asyncio.run(main())
    assert name.startswith("outlines") and keyword == "kw"
    assert threads.pool() is threads.pool()


def test_the_busy_signal_nests_and_is_idle_when_every_burst_ends() -> None:
    signal = threads.Foreground()
    assert signal.idle.is_set()
    with signal:
        with signal:
            assert not signal.idle.is_set()
        assert not signal.idle.is_set()  # the outer burst still runs
    assert signal.idle.is_set()


def test_a_waiting_thread_waits_out_a_burst_but_never_longer_than_its_patience(monkeypatch: pytest.MonkeyPatch) -> None:
    signal = threads.Foreground()
    waiting = threading.Event()
    waited: list[float] = []

    def background() -> None:
        start = time.perf_counter()
        waiting.set()
        signal.wait()
        waited.append(time.perf_counter() - start)

    monkeypatch.setattr(threads, "PATIENCE", 5.0)
    with signal:
        worker = threading.Thread(target=background)
        worker.start()
        assert waiting.wait(5.0)
        time.sleep(0.1)
        assert waited == []  # still waiting: the burst runs
    worker.join(4.0)
    assert len(waited) == 1 and 0.1 <= waited[0] < 4.0  # let go when the burst ended, not after 5 s
    monkeypatch.setattr(threads, "PATIENCE", 0.05)
    with signal:
        start = time.perf_counter()
        signal.wait()  # a burst that does not end while this thread waits: patience runs out
        assert 0.04 <= time.perf_counter() - start < 3.0


def test_a_watched_loop_is_busy_except_while_it_waits_for_events() -> None:
    def look() -> bool:  # another thread looks while the loop waits for it in select()
        time.sleep(0.05)
        return threads.FOREGROUND.idle.is_set()

    async def main() -> list[bool]:
        busy = threads.FOREGROUND.idle.is_set()  # running Python: busy
        return [busy, await asyncio.to_thread(look)]

    with threads.FOREGROUND, asyncio.Runner(loop_factory=threads.watched_loop) as runner:
        seen = runner.run(main())
    assert seen == [False, True]
    assert threads.FOREGROUND.idle.is_set()  # every burst ended with the loop
