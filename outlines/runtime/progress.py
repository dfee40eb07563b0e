"""Progress of a long evaluation: draws done / total, batches running, tokens.

Shown when ``progress=True``, or (``progress=None``) once an evaluation has run
for ``progress_auto_delay`` seconds; never with ``progress=False``. The counts come from
the evaluation's events (a ``Counter``, one of the listeners its recorder is
composed of) and from the schedule's queues (``Progress``): a *draw* is one
sample of one prompt, done when its batch finished or the cache held it.
It shows as a ``TerminalView``, a ``LogView`` or, in Jupyter, a ``NotebookView``
(no ipywidgets needed).

The line says how many draws failed and how many the cache held, and how many
elements of each loop ran out of iterations (``4 of 15 stopped at
max_iter=4``: ``while_loop``'s ``on_max_iter``); the last one
ends with what happened (``Progress.outcome``): ``(finished)``,
``(finished, 2 of 12 draws failed)``, ``(all 4 draws failed)``, or
``(stopped by NodeError: 4 draws failed, 8 not run)``.
"""
from __future__ import annotations

import asyncio
import contextlib
import html
import math
import sys
import time
from typing import Any, AsyncIterator, Protocol, Sequence, TextIO

from outlines.common.config import Tuning
from outlines.graph.basic import Apply
from outlines.graph.traits import Run
from outlines.runtime.events import Listener

__all__ = ["Counter", "Progress", "shown"]


class Counter(Listener):
    """Counts draws done, batches running and tokens, from the evaluation's events."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.hits = 0
        self.sent_done = 0
        self.running: dict[int, int] = {}  # batch id -> draws in it
        self.tokens = 0
        self.dispatched: set[int] = set()  # id() of Generate nodes already turned into draws
        self.failed_sent = 0  # draws of batches that failed
        self.failed_elements = 0  # draws that hold their own Failure (errors="return")
        self.jobs: dict[str, tuple[str, int, int]] = {}  # open provider job id -> (state, lines done, lines)
        self.limited: dict[str, tuple[int, int, int]] = {}  # loop label -> (stopped at max_iter, elements, max_iter)

    def node_started(self, node: Apply, t: float) -> None:
        if node.op.traits.run is Run.GENERATE:
            self.dispatched.add(id(node))

    def node_cache(self, node: Apply, hits: int, misses: int) -> None:
        self.hits += hits

    def node_failures(self, node: Apply, outputs: tuple[Any, ...]) -> None:
        if node.op.traits.run is Run.GENERATE:
            from outlines.common.errors import Failure

            for output in outputs:
                items = output.reshape(-1).tolist() if getattr(output, "dtype", None) == object else [output]
                self.failed_elements += sum(1 for v in items if isinstance(v, Failure) and v.upstream is None)

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None:
        self.running[batch_id] = size

    def batch_finished(
        self, batch_id: int, t: float, error: BaseException | None, usage: Sequence[int], worker: str | None,
        requests: int = 0,
    ) -> None:
        size = self.running.pop(batch_id, 0)
        self.sent_done += size
        if error is not None:
            self.failed_sent += size
        self.tokens += int(usage[1])

    def loop_limited(self, loop: str, stopped: int, elements: int, max_iter: int) -> None:
        before, total, _ = self.limited.get(loop, (0, 0, max_iter))
        self.limited[loop] = (before + stopped, total + elements, max_iter)

    def job_event(self, batch_id: int, event: Any) -> None:
        status = event.status
        if event.kind == "collected" or status.state == "failed":
            self.jobs.pop(status.id, None)
        else:
            total = status.total or event.requests
            self.jobs[status.id] = (status.state, status.succeeded + status.failed, total)

    @property
    def done(self) -> int:
        return self.hits + self.sent_done

    @property
    def failed(self) -> int:
        """Draws that failed: of failed batches, or holding their own ``Failure`` (the same draws, counted once)."""
        return max(self.failed_sent, self.failed_elements)


class Schedule(Protocol):
    """What the figures read from the schedule shown (``outlines.runtime.scheduler.Scheduler``)."""

    plan: Any

    def queued_draws(self) -> int:
        """Draws waiting in the batcher's queues, not sent yet."""


class Progress:
    """The figures shown: the ``counter``'s, and the draws the ``schedule`` has not sent or started yet."""

    def __init__(self, counter: Counter, schedule: Schedule) -> None:
        self.counter = counter
        self.schedule = schedule

    def total(self) -> tuple[int, bool]:
        """(draws known so far, whether that is every draw of the evaluation)."""
        counter = self.counter
        known = counter.done + sum(counter.running.values()) + self.schedule.queued_draws()
        exact = True
        for node in self.schedule.plan.nodes:
            if node.op.traits.run is not Run.GENERATE or id(node) in counter.dispatched:
                continue
            count = _size(getattr(node.outputs[0], "shape", None))
            if count is None:
                exact = False
            else:
                known += count
        return known, exact

    def line(self) -> str:
        """``outlines: 12/40 draws | 2 batches running | 1,234 tokens | job batch_1 in_progress 3/20 | 13.2 s``."""
        counter = self.counter
        total, exact = self.total()
        parts = [f"{counter.done}/{total} draws" if exact else f"{counter.done}/{total}+ draws"]
        if counter.failed:
            parts[0] += f" ({counter.failed} failed)"
        if counter.hits:
            parts.append(f"{counter.hits} cached")
        running = len(counter.running)
        parts.append(f"{running} batch{'es' if running != 1 else ''} running")
        if counter.tokens:
            parts.append(f"{counter.tokens:,} tokens")
        for job_id, (state, finished, lines) in sorted(counter.jobs.items()):
            parts.append(f"job {job_id} {state} {finished}/{lines}")
        for loop, (stopped, elements, max_iter) in counter.limited.items():
            parts.append(f"{loop}: {stopped} of {elements} stopped at max_iter={max_iter}")
        parts.append(f"{time.perf_counter() - counter.started:.1f} s")
        return "outlines: " + " | ".join(parts)

    def outcome(self, error: BaseException | None) -> str:
        """How the evaluation ended, for the last line: ``finished``, ``all 5 draws failed``, ``stopped by ...``."""
        counter = self.counter
        failed, done = counter.failed, counter.done
        if error is not None:
            left = max(self.total()[0] - done, 0)
            cause = "interrupted" if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)) else (
                f"stopped by {type(error).__name__}")
            return f"{cause}: {failed} draw(s) failed, {left} not run"
        left = max(self.total()[0] - done, 0)  # draws left out because what they read had failed
        skipped = f", {left} not run" if left else ""
        if failed and failed >= done:
            return f"all {done} draws failed{skipped}"
        if failed:
            return f"finished, {failed} of {done} draws failed{skipped}"
        return "finished"

    def fraction(self) -> float:
        total, _ = self.total()
        return self.counter.done / total if total else 0.0


def _size(shape: Any) -> int | None:
    if shape is None:
        return None
    try:
        return math.prod(int(n) for n in shape)
    except (TypeError, ValueError):  # an unknown dimension
        return None


@contextlib.asynccontextmanager
async def shown(
    counter: Counter | None, schedule: Schedule, option: bool | None, tuning: Tuning
) -> AsyncIterator[None]:
    """Show ``counter``'s progress on ``schedule`` while the block runs, per ``option`` (``None``: nothing to show).

    ``tuning``: the evaluation's (``progress_auto_delay``, ``progress_refresh``, ``progress_log_every``).
    """
    if option is False or counter is None:
        yield
        return
    progress = Progress(counter, schedule)
    views: list[Any] = [_view(tuning)] if option else []  # asked for: shown even if the run never yields
    if views:
        views[0].show(progress)
    watcher = asyncio.ensure_future(_watch(progress, views, 0.0 if option else tuning.progress_auto_delay, tuning))
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        if views:
            views[0].close(progress, progress.outcome(error))


async def _watch(progress: Progress, views: list[Any], delay: float, tuning: Tuning) -> None:
    await asyncio.sleep(delay)
    if not views:
        views.append(_view(tuning))
        views[0].show(progress)
    while True:
        await asyncio.sleep(tuning.progress_refresh)
        views[0].show(progress)


def _view(tuning: Tuning) -> Any:
    shell = _jupyter_shell()
    if shell is not None:
        return NotebookView()
    stream = sys.stderr
    return TerminalView(stream) if _isatty(stream) else LogView(stream, tuning.progress_log_every)


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

    def show(self, progress: Progress) -> None:
        text = progress.line()
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = len(text)

    def close(self, progress: Progress, outcome: str) -> None:
        text = f"{progress.line()} ({outcome})"
        self.stream.write("\r" + text.ljust(self.width) + "\n")
        self.stream.flush()


class LogView:
    """A log or pipe: a line at the start, at most one every ``every`` seconds, one at the end."""

    def __init__(self, stream: TextIO, every: float = Tuning.progress_log_every) -> None:
        self.stream = stream
        self.every = every
        self.last: float | None = None

    def show(self, progress: Progress) -> None:
        now = time.perf_counter()
        if self.last is None or now - self.last >= self.every:
            self.last = now
            self.stream.write(progress.line() + "\n")
            self.stream.flush()

    def close(self, progress: Progress, outcome: str) -> None:
        self.stream.write(f"{progress.line()} ({outcome})\n")
        self.stream.flush()


class NotebookView:
    """One HTML block in the cell's output, updated in place through its ``display_id``."""

    def __init__(self) -> None:
        self.handle: Any = None

    def show(self, progress: Progress, outcome: str | None = None) -> None:
        from IPython.display import HTML, display

        line = progress.line() if outcome is None else f"{progress.line()} ({outcome})"
        page = HTML(progress_html(line, progress.fraction()))
        if self.handle is None:
            self.handle = display(page, display_id=True)
        else:
            self.handle.update(page)

    def close(self, progress: Progress, outcome: str) -> None:
        self.show(progress, outcome)


def progress_html(line: str, fraction: float) -> str:
    """The HTML of the notebook view: a bar (a plain ``<progress>`` element) and the line."""
    value = max(0.0, min(fraction, 1.0))
    return (f'<div class="outlines-progress" style="font-family:monospace">'
            f'<progress value="{value:.3f}" max="1" style="width:20em;vertical-align:middle"></progress> '
            f"{html.escape(line)}</div>")
