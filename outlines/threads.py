"""Threads beside the event loop: a shared pool for blocking calls, and the loop's busy signal.

``run_blocking`` runs a blocking call in the process-wide pool. ``FOREGROUND``
says whether an event loop is in a burst of synchronous work: the scheduler
enters it around each burst, and a loop built by ``watched_loop`` counts as
busy whenever it is not waiting for events (``WatchedSelector``). Background
threads that would compete for the GIL (the cache writer) call
``FOREGROUND.wait()`` between chunks of their work.
"""
from __future__ import annotations

import asyncio
import functools
import selectors
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

__all__ = ["FOREGROUND", "MAX_THREADS", "PATIENCE", "Foreground", "WatchedSelector", "pool", "run_blocking", "watched_loop"]

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
MAX_THREADS = 64
#: The longest a background chunk waits for the event loops' bursts to end.
PATIENCE = 0.05


def pool() -> ThreadPoolExecutor:
    """The process-wide pool (created on first use)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="outlines")
        return _pool


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
    and waits (at most ``PATIENCE`` seconds a chunk, so it is never starved)
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
            self.idle.wait(PATIENCE)


class WatchedSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
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
