"""SIGTERM during a sync evaluation: stop like Ctrl-C, store what finished, then end as SIGTERM ends.

Containers, job schedulers and ``kill`` stop a process with SIGTERM, whose
default action ends it at once: draws that finished but still wait in the
cache writer's queue (``outlines.cache.disk.WriteBehind``) would be lost.
While a sync ``eval`` (or a ``Program`` call) runs in the main thread,
``terminating_gracefully`` catches SIGTERM instead: it cancels the running
schedule the way Ctrl-C does, waits for the cache writers to commit
everything queued, puts the default action back and sends SIGTERM again, so
the process still ends with the status SIGTERM gives (143 in a shell).

A step that never returns while holding the schedule's event loop (a
Python step run on the loop, ``outlines.fn(blocking=False)``, stuck in
``time.sleep``) would keep the cancellation from ever running: if the
process is still there ``GRACE_SECONDS`` after SIGTERM, a watchdog thread
waits for the cache writers and ends it by SIGTERM all the same. Steps run
in the thread pool never hold it back (``outlines.common.threads.DaemonPool``).
An application's own SIGTERM handler is left alone (``terminating_gracefully``).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from typing import Any, Callable, Coroutine, Iterator, TypeVar

from outlines.cache.disk import flush_all

__all__ = ["GRACE_SECONDS", "Termination", "terminating_gracefully"]

#: After SIGTERM, how long the running schedule has to stop before the process ends anyway.
GRACE_SECONDS = 5.0

T = TypeVar("T")
Factory = Callable[[Any], Coroutine[Any, Any, T]]


class Termination:
    """Where SIGTERM finds the running schedule: its loop and task, noted once they exist."""

    def __init__(self) -> None:
        self.received = False
        self._lock = threading.Lock()
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def running(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """The schedule started as ``task`` on ``loop`` (a SIGTERM received already cancels it now)."""
        with self._lock:
            self._running = (loop, task)
            received = self.received
        if received:
            self._cancel()

    def watching(self, factory: Factory[T]) -> Factory[T]:
        """``factory`` (as ``evaluate.run_sync`` takes it) whose coroutine first notes its task here."""

        async def noted(blocked_loop: Any) -> T:
            task = asyncio.current_task()
            assert task is not None  # a coroutine awaited by a running task
            self.running(asyncio.get_running_loop(), task)
            return await factory(blocked_loop)

        return noted

    def receive(self, signum: int, frame: Any) -> None:
        """The SIGTERM handler (main thread): cancel the schedule, as Ctrl-C does; end anyway after the grace."""
        with self._lock:
            self.received = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM, or the watchdog's, ends the process at once
        self._cancel()
        threading.Thread(target=_flush_then_die, args=(GRACE_SECONDS,), name="outlines-sigterm", daemon=True).start()

    def _cancel(self) -> None:
        with self._lock:
            running = self._running
        if running is not None:
            loop, task = running
            with contextlib.suppress(RuntimeError):  # the loop has just closed: nothing left to cancel
                loop.call_soon_threadsafe(task.cancel)


@contextlib.contextmanager
def terminating_gracefully() -> Iterator[Termination]:
    """Catch SIGTERM while the block runs; after a SIGTERM, flush the cache and die of SIGTERM at exit.

    The block tells the returned ``Termination`` which task runs the
    schedule (``Termination.running``). Outside the main thread, or when
    SIGTERM's handler is not the default one, nothing is installed.
    """
    termination = Termination()
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield termination
        return
    signal.signal(signal.SIGTERM, termination.receive)
    try:
        yield termination
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM from here on ends the process at once
        if termination.received:
            _flush_then_die()


def _flush_then_die(after: float = 0.0) -> None:
    """After ``after`` seconds, wait for the cache writers, then end the process by SIGTERM (its default action)."""
    time.sleep(after)
    flush_all()
    os.kill(os.getpid(), signal.SIGTERM)
    # Delivered at once unless the signal is blocked in this thread: exit as a shell reports SIGTERM.
    raise SystemExit(128 + signal.SIGTERM)
