"""Results as they finish: ``Program.stream`` and ``outlines.as_completed``.

``as_completed`` runs ONE schedule, like ``eval``, and hands out each value as
its node finishes (a ``Watcher``: one of the listeners the evaluation's
recorder is composed of). ``Program.stream`` runs one schedule per chunk of the
leading axis, all at once on one event loop and ONE ``Evaluation``: its
bounds, permits, cache, executor and budget; its backends closed once, at the
end. Both are a ``Stream``: ``for`` in sync code runs the schedule on a private
loop in a helper thread (so it works inside a running loop such as
Jupyter's), ``async for`` on the caller's loop.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping

import numpy as np

from outlines.graph.basic import Variable
from outlines.graph.ops import scalar_or_array
from outlines.graph.protocols import model_call
from outlines.graph.traits import Run
from outlines.runtime.evaluate import interrupt_raises, run_watched
from outlines.runtime.events import Listener
from outlines.runtime.plan import Plan, as_value, bind_givens, check_shapes
from outlines.runtime.scheduler import Scheduler
from outlines.runtime.session import Evaluation, Options

if TYPE_CHECKING:
    from outlines.runtime.program import Program

__all__ = ["Stream", "Watcher", "as_completed", "default_chunk_size", "stream_program"]

#: An async iterator of results, made for the loop that a sync caller blocks (or ``None``).
Factory = Callable[[asyncio.AbstractEventLoop | None], AsyncGenerator[tuple[int, Any], None]]


class Stream:
    """``(index, value)`` pairs in the order they finish; iterate once, with ``for`` or ``async for``.

    Nothing runs before the iteration starts. ``close()`` (or leaving a
    ``for`` loop) cancels what is still running; in async code, wrap it in
    ``contextlib.aclosing`` to cancel at once when leaving the loop early
    (otherwise the loop's async-generator hook cancels it a moment later).
    """

    def __init__(self, factory: Factory, what: str) -> None:
        self._factory = factory
        self._what = what
        self._used = False
        self._iterator: Any = None  # a weak reference: leaving a ``for`` loop must free (so close) it

    def _claim(self) -> None:
        if self._used:
            raise RuntimeError(f"{self._what} was iterated already; a Stream runs once (call it again for a new one)")
        self._used = True

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        self._claim()
        iterator = _iterate_sync(self._factory)
        self._iterator = weakref.ref(iterator)
        return iterator

    def __aiter__(self) -> AsyncIterator[tuple[int, Any]]:
        self._claim()
        iterator = self._factory(None)
        self._iterator = weakref.ref(iterator)
        return iterator

    def close(self) -> None:
        """Cancel what is still running (a sync iteration; see ``aclose`` for ``async for``)."""
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is not None and hasattr(iterator, "close"):
            iterator.close()

    async def aclose(self) -> None:
        """Cancel what is still running (an ``async for`` iteration)."""
        iterator = self._iterator() if self._iterator is not None else None
        if iterator is not None and hasattr(iterator, "aclose"):
            await iterator.aclose()

    def __repr__(self) -> str:
        return f"Stream({self._what})"


# -- sync iteration ---------------------------------------------------------------------
_ITEM, _DONE, _ERROR = "item", "done", "error"


def _iterate_sync(factory: Factory) -> Iterator[tuple[int, Any]]:
    """Iterate ``factory``'s results from sync code: its loop runs in a helper thread.

    Results cross through a queue, so the schedule goes on while the caller
    handles one. Closing this generator cancels the schedule and waits for
    its cleanup (tasks cancelled, backends closed) before returning.
    """
    try:
        caller_loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        caller_loop = None
    results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    control: dict[str, Any] = {}
    started = threading.Event()
    context = contextvars.copy_context()

    async def main() -> None:
        control["loop"], control["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        iterator = factory(caller_loop)
        try:
            async for item in iterator:
                results.put((_ITEM, item))
        finally:
            await iterator.aclose()

    def target() -> None:
        try:
            context.run(run_watched, main())  # eval's loop: the cache writer waits out its bursts
            results.put((_DONE, None))
        except asyncio.CancelledError:  # closed by the caller: nobody reads on
            results.put((_DONE, None))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            results.put((_ERROR, exc))
        finally:
            started.set()

    thread = threading.Thread(target=target, name="outlines-stream", daemon=True)
    thread.start()
    try:
        while True:
            with interrupt_raises():
                kind, payload = results.get()
            if kind == _DONE:
                return
            if kind == _ERROR:
                raise payload
            yield payload
    finally:
        started.wait()
        if thread.is_alive() and "task" in control:
            with contextlib.suppress(RuntimeError):  # the loop may have just closed: nothing to cancel
                control["loop"].call_soon_threadsafe(control["task"].cancel)
        thread.join()


# -- as_completed: one schedule, outputs as their nodes finish ----------------------------
class Watcher(Listener):
    """Reports each output of ``plan`` (by its position among the Variables asked) once its node has finished.

    ``values`` is the schedule's table of values (``Scheduler.values``);
    ``raising``: with ``errors="raise"`` a failed node reports nothing (the
    schedule raises its error). An output the plan stacked into an array node
    (``Plan.picks``) is reported, as its own element, when that node finishes.
    """

    def __init__(self, plan: Plan, values: dict[int, Any], raising: bool, report: Callable[[int, Any], None]) -> None:
        self.values = values
        self.raising = raising
        self.report = report
        #: id(Variable of the plan) -> (position among the arguments, its element there or None) of each output
        self.positions: dict[int, list[tuple[int, int | None]]] = {}
        for position, variable in enumerate(plan.outputs):
            picked = plan.picks.get(position)
            self.positions.setdefault(id(variable), []).append((position, None if picked is None else picked[1]))

    def node_finished(self, node: Any, t: float, error: BaseException | None = None) -> None:
        if error is not None and self.raising:
            return
        for output in node.outputs:
            for position, element in self.positions.get(id(output), ()):
                value = self.values[id(output)]
                if element is not None and isinstance(value, np.ndarray):  # else a Failure of the whole node
                    value = value[element]
                self.report(position, scalar_or_array(value))


def as_completed(*variables: Variable, givens: Mapping[Any, Any] | None = None, **options: Any) -> Stream:
    """Evaluate Variables in ONE schedule, yielding each value as soon as it is computed.

    Like ``concurrent.futures.as_completed`` over the arguments: yields
    ``(position, value)``, ``position`` being the Variable's place among
    ``variables``, in the order they finish (work they share is done once,
    as with ``eval``). Iterate with ``for`` or ``async for``.

    Parameters
    ----------
    *variables
        The Variables to compute.
    givens
        Values of the free inputs, keyed by Variable or by name.
    **options
        As for ``eval`` (``cache``, ``errors``, ``max_concurrency``,
        ``executor``, ``batch_window``); there is no progress bar.

    Returns
    -------
    Stream
        With ``errors="return"`` a failed Variable yields its value holding
        ``outlines.Failure``; with ``errors="raise"`` the first failure
        raises its ``NodeError`` from the iteration after the values that
        finished before it, and cancels the rest.

    Examples
    --------
    >>> import outlines
    >>> q = outlines.string("q")
    >>> sorted(outlines.as_completed(q + "!", q + "?", givens={"q": "hi"}))
    [(0, 'hi!'), (1, 'hi?')]
    """
    if not variables:
        raise TypeError("as_completed needs at least one Variable")
    checked = Options.check(options)
    plan = Plan(variables)  # eval's plan: sibling calls stacked, each output picked as it finishes
    check_shapes(plan, bind_givens(plan, givens))  # a missing input or a bad pairing raises here, before anything is sent

    async def results(blocked_loop: asyncio.AbstractEventLoop | None) -> AsyncGenerator[tuple[int, Any], None]:
        ready: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        values = bind_givens(plan, givens)
        watcher = Watcher(plan, values, checked.errors == "raise", lambda i, v: ready.put_nowait((i, v)))
        evaluation = Evaluation.open(checked, watcher, blocked_loop=blocked_loop)
        for position, variable in enumerate(plan.outputs):
            if variable.owner is None:  # an input or a constant: known before anything runs
                ready.put_nowait((position, scalar_or_array(values[id(variable)])))

        async def evaluate() -> list[Any]:
            async with evaluation.running(plan):
                return await Scheduler(plan, values, evaluation).run()

        run = asyncio.ensure_future(evaluate())
        try:
            for _ in range(len(variables)):
                getter = asyncio.ensure_future(ready.get())
                await asyncio.wait([getter, run], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    run.result()  # the schedule failed: raise its error
                    getter = asyncio.ensure_future(ready.get())  # it finished: the rest are queued
                yield await getter
        finally:
            if not run.done():
                run.cancel()
            await asyncio.gather(run, return_exceptions=True)

    return Stream(results, f"as_completed({len(variables)} variable(s))")


# -- Program.stream: one schedule per chunk of the leading axis ------------------------
def default_chunk_size(plan: Plan) -> int:
    """The smallest ``max_batch`` among the plan's model calls; 1 when none sets one."""
    sizes: list[int] = [model_call(n.op).backend.max_batch for n in plan.nodes if n.op.traits.run is Run.GENERATE]
    return min((s for s in sizes if s), default=1)


def _leading_length(program: Program, givens: dict[Variable, Any]) -> int:
    lengths = {v.name or "?": np.shape(value)[0] for v, value in givens.items() if np.ndim(value) > 0}
    if not lengths:
        raise ValueError(
            f"{program.name}.stream needs at least one array input to stream over; call the program for one value"
        )
    sizes = set(lengths.values()) - {1} or {1}
    if len(sizes) > 1:
        shown = ", ".join(f"{name}: {length}" for name, length in lengths.items())
        raise ValueError(f"{program.name}.stream: the array inputs must share their leading axis, got {shown}")
    return sizes.pop()


def stream_program(program: Program, givens: dict[Variable, Any], chunk_size: int | None) -> Stream:
    """The ``Stream`` of ``Program.stream``: see the module docstring."""
    options = program.options
    givens = {v: as_value(value) for v, value in givens.items()}
    length = _leading_length(program, givens)
    size = default_chunk_size(program.plan) if chunk_size is None else chunk_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"chunk_size must be a positive integer (elements per schedule) or None, got {chunk_size!r}")

    def chunk(start: int) -> dict[Variable, Any]:
        return {
            v: value[start : start + size] if np.ndim(value) > 0 and np.shape(value)[0] == length else value
            for v, value in givens.items()
        }

    async def results(blocked_loop: asyncio.AbstractEventLoop | None) -> AsyncGenerator[tuple[int, Any], None]:
        # One evaluation, whose schedules are the chunks: one cache, executor, budget and set of limits.
        evaluation = Evaluation.open(options, blocked_loop=blocked_loop)

        async def run_chunk(start: int) -> tuple[int, list[Any]]:
            plan = program.plan
            return start, plan.pick(await Scheduler(plan, bind_givens(plan, chunk(start)), evaluation).run())

        outputs_of = program.outputs if isinstance(program.outputs, tuple) else (program.outputs,)

        async with evaluation.running(program.plan):
            tasks = [asyncio.ensure_future(run_chunk(start)) for start in range(0, length, size)]
            try:
                for finished in asyncio.as_completed(tasks):
                    start, outputs = await finished
                    count = min(size, length - start)
                    for output, value in zip(outputs_of, outputs):
                        if not isinstance(value, np.ndarray) or value.ndim == 0 or value.shape[0] != count:
                            raise ValueError(
                                f"{program.name}.stream: output {output.name or output!r} has shape "
                                f"{np.shape(value)} for {count} input element(s); every output must keep the "
                                "inputs' leading axis"
                            )
                    for offset in range(count):
                        row = [scalar_or_array(value[offset]) for value in outputs]
                        yield start + offset, tuple(row) if isinstance(program.outputs, tuple) else row[0]
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    return Stream(results, f"{program.name}.stream({length} element(s), chunks of {size})")
