"""Threads beside the event loop: a shared pool for blocking calls, and the loop's busy signal.

``run_blocking`` runs a blocking call in the process-wide pool (``pool``), a
``DaemonPool``: its threads never keep the process alive, so a blocking step
that hangs cannot stop Ctrl-C or SIGTERM from ending it (the cache's own writer
still commits everything queued before the interpreter exits). ``FOREGROUND``
says whether an event loop is in a burst of synchronous work: the scheduler
enters it around each burst, and a loop built by ``watched_loop`` counts as
busy whenever it is not waiting for events (``WatchedSelector``). Background
threads that would compete for the GIL (the cache writer) call
``FOREGROUND.wait()`` between chunks of their work.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import os
import selectors
import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable, TypeVar

from outlines.common.config import current_tuning

__all__ = [
    "FOREGROUND", "MAX_THREADS", "DaemonPool", "Foreground", "WatchedSelector", "pool",
    "run_blocking", "watched_loop",
]

T = TypeVar("T")

_lock = threading.Lock()
_pool: DaemonPool | None = None
MAX_THREADS = 64


class DaemonPool(Executor):
    """A thread pool whose threads never keep the interpreter alive: daemon threads, never joined at exit.

    ``concurrent.futures.ThreadPoolExecutor`` joins its workers when the
    interpreter exits, so one call that never returns (a step stuck in
    ``time.sleep`` or on a lock) keeps the process alive after Ctrl-C has
    raised ``KeyboardInterrupt``. Here a call still running at exit is
    abandoned: nothing it would have returned could reach anyone. Workers
    start on demand, at most ``max_workers``, take the calls in order,
    and end after ``thread_idle_seconds`` without one (``outlines.common.config.Tuning``:
    the process-wide value, read as each worker starts to wait).
    """

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers, self.name = max_workers, name
        self._condition = threading.Condition()
        self._calls: collections.deque[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]]
        self._calls = collections.deque()
        self._workers = 0  # alive
        self._waiting = 0  # of them, waiting for a call (notified or not)
        self._started = 0  # for thread names

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` in a worker; its ``Future``."""
        future: Future[T] = Future()
        with self._condition:
            self._calls.append((future, fn, args, kwargs))
            if self._waiting >= len(self._calls):  # a waiting worker not yet claimed by an earlier call
                self._condition.notify()
            elif self._workers < self.max_workers:
                self._workers += 1
                self._started += 1
                threading.Thread(target=self._work, name=f"{self.name}_{self._started}", daemon=True).start()
        return future

    def _work(self) -> None:
        condition = self._condition
        while True:
            with condition:
                while not self._calls:
                    self._waiting += 1
                    notified = condition.wait(current_tuning().thread_idle_seconds)
                    self._waiting -= 1
                    if not notified and not self._calls:
                        self._workers -= 1
                        return
                call = self._calls.popleft()
            _run(*call)
            del call  # nothing of the call stays referenced while this worker waits


def _run(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits the future
        future.set_exception(exc)
    else:
        future.set_result(result)


def pool() -> DaemonPool:
    """The process-wide pool (created on first use; a forked child makes its own)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = DaemonPool(MAX_THREADS, "outlines")
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's workers do not exist here."""
    global _lock, _pool
    _lock, _pool = threading.Lock(), None


os.register_at_fork(after_in_child=_forget_pool)


async def run_blocking(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` in the shared pool and await its result."""
    loop = asyncio.get_running_loop()
    call = functools.partial(fn, *args, **kwargs) if kwargs else (lambda: fn(*args))
    return await loop.run_in_executor(pool(), call)


class Foreground:
    """Whether an event loop is in a burst of synchronous work (background threads wait then).

    The scheduler wraps each burst in ``with FOREGROUND:``. Hashing keys and
    binding rows hold the GIL, so a cache writer busy beside a burst would
    take turns with it every few milliseconds; it checks here between chunks
    and waits (at most ``thread_patience`` seconds a chunk, so it is never starved:
    ``outlines.common.config.Tuning``, the process-wide value)
    until the bursts end. Entries nest: the signal is idle when every
    ``with`` has exited.
    """

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()
        self.idle = threading.Event()
        self.idle.set()

    def __enter__(self) -> None:
        with self._lock:
            self._count += 1
            self.idle.clear()

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._count = max(0, self._count - 1)
            if not self._count:
                self.idle.set()

    def wait(self) -> None:
        """Called by a background thread between chunks: let a burst finish first."""
        if not self.idle.is_set():
            self.idle.wait(current_tuning().thread_patience)


class WatchedSelector(selectors.DefaultSelector):
    """The selector of a loop that counts as ``FOREGROUND`` whenever it is not waiting for events.

    ``outlines.runtime.evaluate.run_sync`` runs its loops on one: the cache
    writer then hashes and writes while the loop waits for model calls,
    and stays off the GIL while the loop works.
    """

    def select(self, timeout: float | None = None) -> Any:
        if timeout is not None and timeout <= 0:
            return super().select(timeout)
        FOREGROUND.__exit__()
        try:
            return super().select(timeout)
        finally:
            FOREGROUND.__enter__()


def watched_loop() -> asyncio.AbstractEventLoop:
    """A new event loop on a ``WatchedSelector`` (enter ``FOREGROUND`` while it runs)."""
    return asyncio.SelectorEventLoop(WatchedSelector())


FOREGROUND = Foreground()
