"""A tqdm progress bar for long evaluations: nodes done / total, batches in flight.

Shown when ``progress=True``, or (``progress=None``) once an evaluation has run
for ``AUTO_DELAY`` seconds; never with ``progress=False``.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

__all__ = ["AUTO_DELAY", "progress_for"]

AUTO_DELAY = 2.0
REFRESH = 0.1


@contextlib.asynccontextmanager
async def progress_for(scheduler: Any, option: bool | None) -> AsyncIterator[None]:
    """Show a bar for ``scheduler`` while the block runs, per ``option``."""
    if option is False:
        yield
        return
    watcher = asyncio.ensure_future(_watch(scheduler, 0.0 if option else AUTO_DELAY))
    try:
        yield
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def _watch(scheduler: Any, delay: float) -> None:
    await asyncio.sleep(delay)
    from tqdm.auto import tqdm

    total = len(scheduler.plan.nodes)
    bar = tqdm(total=total, unit="node", desc="outlines", leave=False, dynamic_ncols=True)
    try:
        while True:
            bar.n = total - scheduler.remaining
            bar.set_postfix(in_flight=len(scheduler.tasks), refresh=False)
            bar.refresh()
            await asyncio.sleep(REFRESH)
    finally:
        bar.n = total - scheduler.remaining
        bar.close()
