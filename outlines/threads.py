"""The shared thread pool that runs blocking user code off the event loop."""
from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
MAX_THREADS = 64


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
