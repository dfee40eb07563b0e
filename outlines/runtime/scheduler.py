"""The asynchronous walk of a Plan: dispatch, batching, concurrency, failures.

State of one schedule (Dask's words): a node is *waiting* while its in-degree
counter is above zero (``waiting``), *ready* when it reaches zero (in the
``ready`` deque), *running* while its task or its draws are outstanding
(``tasks``, and the batcher's Waits), and *finished* once its output values
are stored (``values``). Kahn-style: finishing a node decrements its
consumers' counters and readies those that reach zero. ``error`` holds the
first failure (``errors="raise"``), ``failed_values`` the outputs holding a
``Failure`` (``errors="return"``).

Everything the schedule does not own comes from its ``Evaluation``
(``outlines.runtime.session``): options, cache, executor, limits, budget,
recorder. A ready node is dispatched by how its op's traits say it runs
(``walker``: the one dispatch by ``Traits.run``, which ``explain`` uses
too; model calls and Python steps are read through the protocols of
``outlines.graph.protocols``): a cheap op runs inline,
a user function inline, in a task or in the thread pool, a loop or branch as a
task (``outlines.runtime.control``), and a model call's draws join the
``Batcher``'s queues (``outlines.runtime.batching``), flushed after every
round of dispatching. The batcher calls back ``finish``, ``fail``, ``spawn``
and ``wake`` (its ``Schedule`` protocol).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import time
from collections import deque
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from outlines.common.threads import FOREGROUND
from outlines.common.errors import Failure, JobsRunning, NodeError
from outlines.graph.basic import Apply
from outlines.graph.ops import broadcast_map, scalar_or_array
from outlines.graph.protocols import python_step
from outlines.graph.traits import Run
from outlines.runtime.batching.batcher import Batcher
from outlines.runtime.control import run_control
from outlines.runtime.events import listening
from outlines.runtime.plan import Plan
from outlines.runtime.session import Evaluation

__all__ = ["Scheduler", "Walk", "quiet_collector", "schedule", "walker"]

FAST_CALL_SECONDS = 1e-3
#: Blocking Python calls made ready together go to the thread pool in at most
#: this many chunks (one executor task each), so thousands of calls cost a few
#: dispatches while slow calls still run in parallel.
PYTHON_CHUNKS = 32
#: The guards of a node that neither returns failures nor stands for stacked calls: none (never mutated).
_NO_GUARDS: dict[str, Any] = {}
_GENERATE = Run.GENERATE  # read once: a member looked up on its enum class per node costs more than the check
#: Each ``Run`` and the name of its ``Walk`` step, read once (iterating an enum and reading ``.value`` run in Python,
#: and a loop's body makes a schedule per iteration).
_STEPS = tuple((run, run.value) for run in Run)


class Scheduler:
    """One schedule of a Plan within an ``Evaluation``; see the module docstring.

    Parameters
    ----------
    plan
        What to run.
    values
        The values known before anything runs (givens and constants), by
        ``id(Variable)``; the schedule adds its nodes' outputs.
    evaluation
        The evaluation this schedule belongs to.
    """

    def __init__(self, plan: Plan, values: dict[int, Any], evaluation: Evaluation) -> None:
        self.plan = plan
        self.values = values
        self.evaluation = evaluation
        self.return_failures = evaluation.return_failures
        self.recorder = evaluation.recorder
        # Reported once per node: None when nobody acts on them (no perf_counter, no call).
        self._node_started = listening(self.recorder, "node_started")
        self._node_finished = listening(self.recorder, "node_finished")
        self.executor = evaluation.executor
        self.waiting = list(plan.indegree)
        self.ready: deque[int] = deque(i for i, n in enumerate(self.waiting) if n == 0)
        self.remaining = len(plan.nodes)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.callbacks: deque[Callable[[], None]] = deque()  # finished tasks' continuations
        self.wakeup = asyncio.Event()
        self.failed_values: set[int] = set()  # ids of outputs holding a Failure (errors="return")
        self.python_pending: list[tuple[int, Callable[[], Any]]] = []
        #: id(stacked node) -> {id(Failure): (the Failure, its exception)} of the elements that raised.
        self.element_errors: dict[int, dict[int, tuple[Failure, BaseException]]] = {}
        self.error: BaseException | None = None
        self.batcher = Batcher(plan, evaluation, self)
        #: batches sent by the schedules of this one's loops and conds (a loop iteration counts them as its own)
        self.nested_sent = 0
        self.steps = walker(self)

    # -- the loop ---------------------------------------------------------------
    async def run(self) -> list[Any]:
        """The output values of the plan, in order; raises the first error (``errors="raise"``)."""
        try:
            while self.remaining and self.error is None:
                with quiet_collector():  # a burst of synchronous work: see quiet_collector
                    step = self._round()
                if step == "stop":
                    break
                if step == "continue":
                    continue
                if step == "wait":
                    self.wakeup.clear()
                    await self.wakeup.wait()
                with quiet_collector():
                    while self.callbacks and self.error is None:
                        self.callbacks.popleft()()
        finally:
            await self._cleanup()
        if self.error is not None:
            raise self.error
        values, outputs = self.values, self.plan.outputs
        if len(outputs) <= 64:
            return [scalar_or_array(values[id(v)]) for v in outputs]
        # a stacked plan's outputs are a few arrays, each repeated (``Plan.picks``): unwrap each once
        unwrapped = {key: scalar_or_array(values[key]) for key in dict.fromkeys(map(id, outputs))}
        return [unwrapped[key] for key in map(id, outputs)]

    def _round(self) -> str:
        """Dispatch what is ready and flush the queues; then ``stop``, ``continue``, ``wait`` or ``callbacks``."""
        self._dispatch_ready()
        if self.error is not None or not self.remaining:
            return "stop"
        if self.python_pending:
            self._flush_python()
        self.batcher.flush(others_running=bool(self.tasks))
        if self.ready or not self.remaining or self.error is not None:
            return "continue"  # cache hits finished nodes synchronously in flush (a refused batch failed)
        if self.callbacks:
            return "callbacks"
        if not self.tasks and not self.batcher.window_open and not self.ready:
            raise RuntimeError(f"scheduler stalled with {self.remaining} node(s) unfinished")
        return "wait"

    async def _cleanup(self) -> None:
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.batcher.close()

    def spawn(self, coroutine: Any, on_done: Callable[[asyncio.Task[Any]], None]) -> None:
        """Run ``coroutine`` as a task of this schedule; ``on_done(task)`` runs on the loop's next callbacks."""
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)

        def finished(task: asyncio.Task[Any]) -> None:
            self.tasks.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved now: after a first error the rest are never handled
                self.callbacks.append(lambda: on_done(task))
                self.wakeup.set()

        task.add_done_callback(finished)

    # -- nodes ------------------------------------------------------------------
    def _dispatch_ready(self) -> None:
        ready, nodes, steps, values, started = self.ready, self.plan.nodes, self.steps, self.values, self._node_started
        while ready and self.error is None:
            index = ready.popleft()
            node = nodes[index]
            if started is not None:
                started(node, time.perf_counter())
            inputs = node.inputs
            try:
                # one input (a step of a chain) needs no comprehension
                args = [values[id(inputs[0])]] if len(inputs) == 1 else [values[id(v)] for v in inputs]
                steps[node.op.traits.run](index, node, args)
            except Exception as exc:  # noqa: BLE001 - reported against the node
                self.fail(index, exc)

    # -- each kind of node (``walker``) ---------------------------------------------
    def generate(self, index: int, node: Apply, inputs: list[Any]) -> None:
        """A model call: its draws join the batcher's queues."""
        self.batcher.start(index, node, inputs[0], self._has_failed_input(node))

    def inline(self, index: int, node: Apply, inputs: list[Any]) -> None:
        """A cheap pure op, run here on the loop."""
        self.finish(index, self._perform_inline(node, inputs))

    def _has_failed_input(self, node: Apply) -> bool:
        return bool(self.failed_values) and any(id(v) in self.failed_values for v in node.inputs)

    def _guards(self, node: Apply) -> dict[str, Any]:
        stacked = id(node) in self.plan.members
        if not self.return_failures and not stacked:
            return {}
        label, op = node.label, node.op.name
        if not stacked:
            return {
                "on_error": lambda exc: Failure.from_exception(label, op, exc),
                "on_failed_input": lambda failure: failure.skipped(label, op),
            }
        # A stacked node fails element by element in both modes: ``finish`` names each
        # element's own node (``_per_member``) and, with errors="raise", raises the first.
        errors = self.element_errors.setdefault(id(node), {})

        def on_error(exc: BaseException) -> Failure:
            failure = Failure.from_exception(label, op, exc)
            errors[id(failure)] = (failure, exc)
            return failure

        return {"on_error": on_error, "on_failed_input": lambda failure: failure.skipped(label, op)}

    def _per_member(self, index: int, node: Apply, members: Sequence[Apply], result: Any) -> Any:
        """A stacked node's result with each failed element named by its own node; ``None`` once it failed."""
        errors = self.element_errors.pop(id(node), {})
        if not isinstance(result, np.ndarray) or not (errors or (self.return_failures and _has_failure(result))):
            return result
        out = result.copy()
        flat, own = out.reshape(-1), node.label
        per = max(1, flat.size // len(members))  # elements per member
        for at, value in enumerate(flat):
            if isinstance(value, Failure) and value.node == own:
                member = members[min(len(members) - 1, at // per)].label
                if id(value) in errors and not self.return_failures:
                    self.fail(index, errors[id(value)][1], member)
                    return None
                flat[at] = dataclasses.replace(value, node=member)
        return out

    def _perform_inline(self, node: Apply, inputs: list[Any]) -> Any:
        op = node.op
        traits = op.traits
        if traits.guards_elements:  # it fails element by element itself (text ops)
            return op.perform(*inputs, **self._guards(node))
        stacked = id(node) in self.plan.members
        if (stacked or self._has_failed_input(node)) and traits.elementwise:
            return broadcast_map(op.perform, inputs, **self._guards(node))
        return op.perform(*inputs)

    def python(self, index: int, node: Apply, inputs: list[Any]) -> None:
        """A user function: awaited when async, run here when fast, else in the thread pool (in chunks)."""
        op = python_step(node.op)
        function = op.function
        members = self.plan.members.get(id(node)) if self.plan.members else None
        guards = self._guards(node) if self.return_failures or members is not None else _NO_GUARDS
        if function.is_async:
            self.spawn(op.aperform(*inputs, **guards), lambda t: self._task_done(index, t))
            return
        timings = self.evaluation.state.timings
        mean = timings.mean(function)
        inline = function.blocking is False or (
            function.blocking is None and mean is not None and mean < FAST_CALL_SECONDS
        )
        if inline:
            start = time.perf_counter()
            result = op.perform(*inputs, **guards) if guards else op.perform(*inputs)
            elapsed = time.perf_counter() - start
            timings.record(function, elapsed / len(members) if members else elapsed)
            self.finish(index, result)
            return
        if members is not None:  # a stacked step: its elements still run in parallel, in a few pieces
            self.spawn(self._pieces(node, inputs, guards, len(members)), lambda t: self._task_done(index, t))
            return
        self.python_pending.append((index, lambda: op.perform(*inputs, **guards)))

    async def _pieces(self, node: Apply, inputs: list[Any], guards: dict[str, Any], count: int) -> Any:
        """A stacked blocking step in at most ``PYTHON_CHUNKS`` slices of its leading axis, run in the thread pool."""
        op = python_step(node.op)
        bounds = np.linspace(0, count, min(count, PYTHON_CHUNKS) + 1).astype(int).tolist()

        def piece(start: int, stop: int) -> Callable[[], Any]:
            sliced = [v[start:stop] if isinstance(v, np.ndarray) and v.ndim else v for v in inputs]
            return lambda: op.perform(*sliced, **guards)

        calls = [self.executor.call(_run_chunk, [(stop - start, piece(start, stop))])
                 for start, stop in zip(bounds, bounds[1:])]
        pieces = [result[0] for result in await asyncio.gather(*calls)]
        for size, ok, value, seconds in pieces:
            if not ok:
                raise value
            self.evaluation.state.timings.record(op.function, seconds / max(1, size))
        return np.concatenate([value for _, _, value, _ in pieces])

    def control(self, index: int, node: Apply, inputs: list[Any]) -> None:
        """A loop or a branch: one task, whose iterations are schedules of their own (``outlines.runtime.control``)."""
        plan = self.plan

        async def counted(inner: Plan, values: dict[int, Any], evaluation: Evaluation) -> tuple[list[Any], int]:
            outputs, sent = await schedule(inner, values, evaluation)
            self.nested_sent += sent  # a call inside a cond (or a nested loop) is a call of this schedule too
            return outputs, sent

        tags = plan.element_tags.get(id(node)) if plan.element_tags else None  # stacked: a first tag per element
        if tags is None:
            first_tag = plan.tag_offsets.get(node.order, 0)  # loops number their namespaces like calls their draws
            control = run_control(self.evaluation, node, inputs, counted, first_tag)
        else:
            control = run_control(self.evaluation, node, inputs, counted, tags, plan.members[id(node)])
        self.spawn(control, lambda task: self._task_done(index, task))

    def _flush_python(self) -> None:
        """Send the blocking Python calls made ready this round, in a few chunks."""
        pending, self.python_pending = self.python_pending, []
        chunks = min(len(pending), PYTHON_CHUNKS)
        for start in range(chunks):
            self._spawn_chunk(pending[start::chunks])

    def _spawn_chunk(self, chunk: list[tuple[int, Callable[[], Any]]]) -> None:
        self.spawn(self.executor.call(_run_chunk, chunk), lambda task: self._chunk_done(chunk, task))

    def _chunk_done(self, chunk: list[tuple[int, Callable[[], Any]]], task: asyncio.Task[Any]) -> None:
        error = task.exception()
        if error is not None:
            for index, _ in chunk:
                self.fail(index, error)
            return
        for index, ok, value, seconds in task.result():
            # Recorded here, not where it ran: a worker's copy of the function is not ours.
            self.evaluation.state.timings.record(python_step(self.plan.nodes[index].op).function, seconds)
            if ok:
                self.finish(index, value)
            else:
                self.fail(index, value)

    def _task_done(self, index: int, task: asyncio.Task[Any]) -> None:
        exc = task.exception()
        if exc is not None:
            self.fail(index, exc)
        else:
            self.finish(index, task.result())

    def queued_draws(self) -> int:
        """Draws waiting in the batcher's queues, not sent yet (for progress)."""
        return self.batcher.queued_draws()

    def wake(self) -> None:
        """Wake the loop (a gathering window closed)."""
        self.wakeup.set()

    def finish(self, index: int, result: Any, error: BaseException | None = None) -> None:
        """Node ``index`` computed ``result``: store it and ready the consumers whose inputs are all there."""
        plan = self.plan
        node = plan.nodes[index]
        if plan.members and node.op.traits.run is not _GENERATE:  # the batcher names a stacked call's elements itself
            members = plan.members.get(id(node))
            if members is not None:
                result = self._per_member(index, node, members, result)
                if result is None:
                    return
        outputs = node.outputs
        if len(outputs) == 1 and not self.return_failures:  # the common case, once per node: nothing to check
            self.values[id(outputs[0])] = result
        else:
            results = result if len(outputs) > 1 else (result,)
            failed = False
            for output, value in zip(outputs, results):
                failed = self._store(output, value) or failed
            if failed:  # a trace counts the Failure elements, which node_finished does not see
                self.recorder.node_failures(node, tuple(results))
        if plan.scatter:
            scatter = plan.scatter.get(id(node))
            if scatter is not None:
                self._scatter(scatter, result)
        if self._node_finished is not None:
            self._node_finished(node, time.perf_counter(), error)
        self.remaining -= 1
        waiting, ready = self.waiting, self.ready
        for consumer in plan.consumers[index]:
            left = waiting[consumer] = waiting[consumer] - 1
            if not left:
                ready.append(consumer)

    def _store(self, variable: Any, value: Any) -> bool:
        """Store ``value`` as ``variable``'s; whether it holds a ``Failure`` (noted with ``errors="return"``)."""
        self.values[id(variable)] = value
        if self.return_failures and _has_failure(value):
            self.failed_values.add(id(variable))
            return True
        return False

    def _scatter(self, scatter: list[tuple[Any, int]], result: Any) -> None:
        """Store each element a node left out reads under its member's output (``Plan.scatter``)."""
        whole = not isinstance(result, np.ndarray)  # not an array: a Failure of the whole node
        for variable, element in scatter:
            self._store(variable, result if whole else scalar_or_array(result[element]))

    def fail(self, index: int, exc: BaseException, label: str | None = None) -> None:
        """Fail node ``index`` (``label``: the call a stacked node's failing element stands for)."""
        node = self.plan.nodes[index]
        label = label or node.label
        # ``JobsRunning`` is no failure of the node: the evaluation stops while its jobs run on.
        if not self.return_failures or isinstance(exc, JobsRunning):
            if self.error is None:
                self.error = exc if isinstance(exc, NodeError) else NodeError(label, node.op.name, exc)
                if self.error is not exc:
                    self.error.__cause__ = exc
                self.wakeup.set()  # a batch may report a failed draw while the loop waits
            self.recorder.node_finished(node, time.perf_counter(), exc)
            return
        members = self.plan.members.get(id(node)) if label is None or label == node.label else None
        if members is not None and node.op.traits.run is not _GENERATE:  # each element fails as its own node
            shape = node.outputs[0].shape
            sizes = [int(n) for n in shape if n is not None] if shape else []
            per = int(np.prod(sizes[1:], dtype=np.int64)) if shape and len(sizes) == len(shape) else 1
            elements: Any = np.empty(len(members) * per, dtype=object)
            elements[:] = [Failure.from_exception(m.label, node.op.name, exc) for m in members for _ in range(per)]
            self.finish(index, elements.reshape(tuple(sizes)) if per > 1 else elements, exc)
            return
        failure = Failure.from_exception(label, node.op.name, exc)
        self.finish(index, tuple(failure for _ in node.outputs) if len(node.outputs) > 1 else failure, exc)


async def schedule(plan: Plan, values: dict[int, Any], evaluation: Evaluation) -> tuple[list[Any], int]:
    """Run ``plan`` as one schedule of ``evaluation``: its output values, and the batches it sent.

    The count includes the batches of the loops and conds it ran (their own schedules).
    """
    scheduler = Scheduler(plan, values, evaluation)
    outputs = await scheduler.run()
    return outputs, scheduler.batcher.sent + scheduler.nested_sent


class Walk(Protocol):
    """What a walk of a plan does with each kind of node (``Traits.run``): the scheduler runs them, ``explain`` predicts them."""

    def inline(self, index: int, node: Apply, inputs: list[Any]) -> Any:
        """A cheap pure op."""

    def python(self, index: int, node: Apply, inputs: list[Any]) -> Any:
        """A user function (``outlines.fn``)."""

    def generate(self, index: int, node: Apply, inputs: list[Any]) -> Any:
        """A model call."""

    def control(self, index: int, node: Apply, inputs: list[Any]) -> Any:
        """A loop or a branch."""


def walker(walk: Walk) -> dict[Run, Callable[[int, Apply, list[Any]], Any]]:
    """``walk``'s step for each kind of node: the one dispatch by ``Traits.run`` (each value names its step)."""
    return {run: getattr(walk, name) for run, name in _STEPS}


@contextlib.contextmanager
def quiet_collector() -> Iterator[None]:
    """Keep the cyclic garbage collector out of a burst of synchronous work.

    A graph is full of reference cycles (a Variable and its owner point at
    each other), and planning or one scheduler round allocates a lot: the
    automatic collections it triggers walk the whole graph again and again
    (20-35% of an evaluation's CPU from 5,000 nodes on). The scheduler wraps
    each synchronous burst (never an ``await``) in this block: the collector
    is off inside and back on at exit, normal or not, so what the burst
    allocated is collected between bursts, as young objects. A collector
    already off (the caller's choice, or an enclosing block) is left alone.
    (``gc.freeze`` would keep it on, but counting frozen objects costs a
    walk of them, and unfreezing would undo a caller's own freeze.)
    """
    with FOREGROUND:  # the cache writer leaves the GIL to the burst (outlines.common.threads.Foreground)
        if not gc.isenabled():
            yield
            return
        gc.disable()
        try:
            yield
        finally:
            gc.enable()


def _run_chunk(chunk: list[tuple[int, Callable[[], Any]]]) -> list[tuple[int, bool, Any, float]]:
    """Run blocking calls (in a thread or on a worker); time each one.

    The schedule waits for them, so they count as ``FOREGROUND``: the cache
    writer's hashing would otherwise take turns with them for the GIL.
    """
    results = []
    with FOREGROUND:
        for index, call in chunk:
            start = time.perf_counter()
            try:
                value, ok = call(), True
            except Exception as exc:  # noqa: BLE001 - reported against its node
                value, ok = exc, False
            results.append((index, ok, value, time.perf_counter() - start))
    return results


def _has_failure(value: Any) -> bool:
    if isinstance(value, Failure):
        return True
    if isinstance(value, np.ndarray) and value.dtype == object:
        return any(isinstance(v, Failure) for v in value.flat)
    if isinstance(value, tuple):
        return any(_has_failure(v) for v in value)
    return False
