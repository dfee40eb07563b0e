"""outlines.common.threads: the shared pool, and the signal that an event loop is busy."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import pytest

from outlines.common import threads
from outlines.common.config import set_tuning


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


def test_a_waiting_thread_waits_out_a_burst_but_never_longer_than_its_patience(fresh_state: Any) -> None:
    signal = threads.Foreground()
    waiting = threading.Event()
    waited: list[float] = []

    def background() -> None:
        start = time.perf_counter()
        waiting.set()
        signal.wait()
        waited.append(time.perf_counter() - start)

    set_tuning(thread_patience=5.0)
    with signal:
        worker = threading.Thread(target=background)
        worker.start()
        assert waiting.wait(5.0)
        time.sleep(0.1)
        assert waited == []  # still waiting: the burst runs
    worker.join(4.0)
    assert len(waited) == 1 and 0.1 <= waited[0] < 4.0  # let go when the burst ended, not after 5 s
    set_tuning(thread_patience=0.05)
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


def test_the_pool_runs_calls_side_by_side_in_daemon_threads_and_hands_back_their_errors() -> None:
    pool = threads.DaemonPool(8, "test-pool")
    together = threading.Barrier(8, timeout=10)  # broken, and each call fails, unless all 8 run at once

    def meet(i: int) -> tuple[int, bool]:
        together.wait()
        return i, threading.current_thread().daemon

    futures = [pool.submit(meet, i) for i in range(8)]
    assert [f.result(timeout=20) for f in futures] == [(i, True) for i in range(8)]
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=20)
    assert pool.submit(lambda *, x: x, x="kw").result(timeout=20) == "kw"


def test_more_calls_than_workers_queue_in_order_and_idle_workers_end(fresh_state: Any) -> None:
    set_tuning(thread_idle_seconds=0.05)
    pool = threads.DaemonPool(1, "capped-pool")
    release = threading.Event()
    order: list[int] = []
    futures = [pool.submit(lambda i=i: (release.wait(10), order.append(i))) for i in range(5)]
    assert sum(t.name.startswith("capped-pool") for t in threading.enumerate()) == 1  # the cap
    release.set()
    for future in futures:
        future.result(timeout=20)
    assert order == [0, 1, 2, 3, 4]  # the queued calls ran in the order given
    deadline = time.monotonic() + 10
    while any(t.name.startswith("capped-pool") for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name.startswith("capped-pool") for t in threading.enumerate())  # idle: ended
    assert pool.submit(lambda: "again").result(timeout=20) == "again"  # a new worker starts on demand


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_runs_blocking_calls_in_a_pool_of_its_own() -> None:
    asyncio.run(threads.run_blocking(int))  # the parent's pool has an idle worker, which the child lacks
    pid = os.fork()
    if pid == 0:  # the child: a call that never runs ends it by SIGALRM
        code = 1
        try:
            signal.alarm(10)
            code = 0 if asyncio.run(threads.run_blocking(lambda: 7)) == 7 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
