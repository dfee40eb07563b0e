"""Progress of a long evaluation: draws done / total, batches running, tokens.

Shown when ``progress=True``, or (``progress=None``) once an evaluation has run
for ``AUTO_DELAY`` seconds; never with ``progress=False``. The counts come from
the scheduler's events (a ``Counter`` placed in front of its recorder): a *draw*
is one sample of one prompt, done when its batch finished or the cache held it.
Where it shows depends on the output: in a terminal, one line redrawn every
``REFRESH`` seconds; in a log or pipe, a line at the start, at most one every
``LOG_EVERY`` seconds, and one at the end; in Jupyter, one HTML block updated in
place (``IPython.display`` with a ``display_id``; no ipywidgets needed).
"""
from __future__ import annotations

import asyncio
import contextlib
import html
import math
import sys
import time
from typing import Any, AsyncIterator, TextIO

from outlines.tracing import Forwarding, Recorder

__all__ = ["AUTO_DELAY", "Counter", "LOG_EVERY", "REFRESH", "progress_for"]

AUTO_DELAY = 2.0
#: Seconds between redraws in a terminal and in Jupyter.
REFRESH = 0.5
#: Seconds between lines when the output is not a terminal (a log file, CI).
LOG_EVERY = 30.0


class Counter(Forwarding):
    """Counts draws, batches and tokens, and passes every event on to ``inner``."""

    def __init__(self, inner: Recorder, scheduler: Any) -> None:
        super().__init__(inner)
        self.scheduler = scheduler
        self.started = time.perf_counter()
        self.hits = 0
        self.sent_done = 0
        self.running: dict[int, int] = {}  # batch id -> draws in it
        self.tokens = 0
        self.dispatched: set[int] = set()  # id() of Generate nodes already turned into draws

    def __getattr__(self, name: str) -> Any:  # anything else a recorder offers (``for_eval`` ...)
        return getattr(self.inner, name)

    def node_started(self, node: Any, t: float) -> None:
        if node.op.mode == "generate":
            self.dispatched.add(id(node))
        super().node_started(node, t)

    def node_cache(self, node: Any, hits: int, misses: int) -> None:
        self.hits += hits
        super().node_cache(node, hits, misses)

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None:
        self.running[batch_id] = size
        super().batch_started(batch_id, backend, nodes, size, t)

    def batch_finished(
        self,
        batch_id: int,
        t: float,
        error: BaseException | None,
        usage: tuple[int, int],
        worker: str | None,
        requests: int = 0,
    ) -> None:
        self.sent_done += self.running.pop(batch_id, 0)
        self.tokens += int(usage[1])
        super().batch_finished(batch_id, t, error, usage, worker, requests=requests)

    # -- the figures shown ---------------------------------------------------------
    @property
    def done(self) -> int:
        return self.hits + self.sent_done

    def total(self) -> tuple[int, bool]:
        """(draws known so far, whether that is every draw of the evaluation)."""
        scheduler = self.scheduler
        known = self.done + sum(self.running.values())
        known += sum(len(queue.pending) for queue in scheduler.batcher.queues.values())
        exact = True
        for node in scheduler.plan.nodes:
            if node.op.mode != "generate" or id(node) in self.dispatched:
                continue
            count = _size(getattr(node.outputs[0], "shape", None))
            if count is None:
                exact = False
            else:
                known += count
        return known, exact

    def line(self) -> str:
        """``outlines: 12/40 draws | 2 batches running | 1,234 tokens | 13.2 s``."""
        total, exact = self.total()
        parts = [f"{self.done}/{total} draws" if exact else f"{self.done}/{total}+ draws"]
        if self.hits:
            parts.append(f"{self.hits} cached")
        parts.append(f"{len(self.running)} batch{'es' if len(self.running) != 1 else ''} running")
        if self.tokens:
            parts.append(f"{self.tokens:,} tokens")
        parts.append(f"{time.perf_counter() - self.started:.1f} s")
        return "outlines: " + " | ".join(parts)

    def fraction(self) -> float:
        total, _ = self.total()
        return self.done / total if total else 0.0


def _size(shape: Any) -> int | None:
    if shape is None:
        return None
    try:
        return math.prod(int(n) for n in shape)
    except (TypeError, ValueError):  # an unknown dimension
        return None


@contextlib.asynccontextmanager
async def progress_for(scheduler: Any, option: bool | None) -> AsyncIterator[None]:
    """Show progress for ``scheduler`` while the block runs, per ``option``."""
    if option is False:
        yield
        return
    counter = Counter(scheduler.recorder, scheduler)
    scheduler.recorder = counter
    views: list[Any] = [_view()] if option else []  # asked for: shown even if the run never yields
    if views:
        views[0].show(counter)
    watcher = asyncio.ensure_future(_watch(counter, views, 0.0 if option else AUTO_DELAY))
    try:
        yield
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if views:
            views[0].close(counter)


async def _watch(counter: Counter, views: list[Any], delay: float) -> None:
    await asyncio.sleep(delay)
    if not views:
        views.append(_view())
        views[0].show(counter)
    while True:
        await asyncio.sleep(REFRESH)
        views[0].show(counter)


def _view() -> Any:
    shell = _jupyter_shell()
    if shell is not None:
        return NotebookView()
    stream = sys.stderr
    return TerminalView(stream) if _isatty(stream) else LogView(stream)


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _jupyter_shell() -> Any:
    """The running IPython kernel's shell, or None (a plain script, or a terminal IPython)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return None
    shell = ipython.get_ipython()
    return shell if shell is not None and type(shell).__name__ == "ZMQInteractiveShell" else None


class TerminalView:
    """One line, redrawn in place with a carriage return."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.width = 0

    def show(self, counter: Counter) -> None:
        text = counter.line()
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = len(text)

    def close(self, counter: Counter) -> None:
        self.show(counter)
        self.stream.write("\n")
        self.stream.flush()


class LogView:
    """A log or pipe: a line at the start, at most one every ``LOG_EVERY`` seconds, one at the end."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.last: float | None = None

    def show(self, counter: Counter) -> None:
        now = time.perf_counter()
        if self.last is None or now - self.last >= LOG_EVERY:
            self.last = now
            self.stream.write(counter.line() + "\n")
            self.stream.flush()

    def close(self, counter: Counter) -> None:
        self.stream.write(counter.line() + " (finished)\n")
        self.stream.flush()


class NotebookView:
    """One HTML block in the cell's output, updated in place through its ``display_id``."""

    def __init__(self) -> None:
        self.handle: Any = None

    def show(self, counter: Counter) -> None:
        from IPython.display import HTML, display

        page = HTML(progress_html(counter.line(), counter.fraction()))
        if self.handle is None:
            self.handle = display(page, display_id=True)
        else:
            self.handle.update(page)

    def close(self, counter: Counter) -> None:
        self.show(counter)


def progress_html(line: str, fraction: float) -> str:
    """The HTML of the notebook view: a bar (a plain ``<progress>`` element) and the line."""
    value = max(0.0, min(fraction, 1.0))
    return (f'<div class="outlines-progress" style="font-family:monospace">'
            f'<progress value="{value:.3f}" max="1" style="width:20em;vertical-align:middle"></progress> '
            f"{html.escape(line)}</div>")
