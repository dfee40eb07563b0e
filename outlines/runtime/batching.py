"""Model calls inside a schedule: draws, per-backend queues, batches, the cache.

A ready ``Generate`` node turns into draws that join the ``BatchQueue`` of its
(backend, params less the constraint: ``queue_key``). After each dispatch round the scheduler flushes the
``Batcher``: queued draws are deduplicated (waiters keyed by backend and draw),
looked up in the cache in one query (``lookup``), split by the backend's
``max_batch`` (``batch_sizes``) and sent as batch tasks, at most
``max_concurrency`` per backend. A queue stays open for a short gathering
window while other nodes that feed it are still running; a full queue sends
its whole batches at once and keeps the remainder open. Each finished draw is
cached as soon as its backend reports it; constrained draws are checked first
and retried while they break their constraint (``constraints.generate_valid``).

The scheduler and the ``Batcher`` talk through the callbacks given to the
constructor (``finish``, ``fail``, ``spawn``, ``wake``) and the methods
``start``, ``flush`` and ``close``. The pure helpers are shared with
``outlines.runtime.explain``.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Callable, Coroutine, Iterable, Sequence

import numpy as np

from outlines import cache as cache_module
from outlines.backends.base import Backend, BackendError, BatchReport, Draw, GenerationParams
from outlines.backends.constraints import generate_valid
from outlines.errors import Failure
from outlines.graph.basic import Apply
from outlines.runtime.executor import Executor
from outlines.runtime.plan import Plan
from outlines.tracing import Recorder

__all__ = ["BatchQueue", "Batcher", "NodeDraws", "batch_sizes", "lookup", "queue_key", "unique_draws"]


# -- pure helpers (explain uses them too) ------------------------------------------
def queue_key(backend: Backend, params: GenerationParams) -> tuple[Backend, GenerationParams]:
    """The ``BatchQueue`` a model call's draws join.

    Draws that differ only in their constraint share a queue, so a batch
    (issue 13): a local model masks each row under its own constraint in one
    forward pass, and each draw keeps its params (so its cache key).
    """
    return backend, replace(params, constraint=None)


def unique_draws(draws: Iterable[Draw]) -> list[Draw]:
    """``draws`` without repeats, in first-seen order."""
    return list(dict.fromkeys(draws))


def batch_sizes(count: int, max_batch: int | None) -> list[int]:
    """Sizes of the batches that send ``count`` draws, at most ``max_batch`` each."""
    size = max_batch or count or 1
    return [min(size, count - start) for start in range(0, count, size)]


def lookup(
    cache: Any, backend: Backend, draws: Sequence[Draw], *, record: bool = True, keys: Sequence[bytes] | None = None
) -> dict[Draw, Any]:
    """The cached texts of ``draws`` (one ``get_many``); ``record=False`` counts no hits.

    A backend that is not ``cacheable`` (its identity holds an object id) never
    reads the disk; a stored value that is not text is a miss. ``keys``: the
    draws' keys, when the caller has them already.
    """
    if cache is None or not draws or not backend.cacheable:
        return {}
    if keys is None:
        keys = cache_module.draw_keys(backend.identity, draws)
    found = cache.get_many(keys, record=record, expect=str)
    return {d: found[k] for d, k in zip(draws, keys) if k in found} if found else {}


# -- state --------------------------------------------------------------------------
class NodeDraws:
    """The outstanding draws of one running Generate node."""

    __slots__ = ("index", "shape", "results", "remaining", "hits")

    def __init__(self, index: int, shape: tuple[int, ...], count: int) -> None:
        self.index = index
        self.shape = shape
        self.results: list[Any] = [None] * count
        self.remaining = count
        self.hits = 0


class BatchQueue:
    """Draws waiting to be sent to one backend with one set of params."""

    __slots__ = ("backend", "pending", "since", "unready")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pending: dict[Draw, None] = {}
        self.since = 0.0
        self.unready = 0  # Generate nodes of this queue not dispatched yet


Spawn = Callable[[Coroutine[Any, Any, Any], Callable[["asyncio.Task[Any]"], None]], None]


class Batcher:
    """Queues, waiters and cache lookups of one evaluation's model calls.

    Parameters
    ----------
    plan, cache, executor
        The scheduler's plan, resolved cache (``None``: off) and executor.
    recorder
        Returns the scheduler's recorder, read at each event: progress puts a
        ``Counter`` in front of it after the scheduler is built.
    return_failures
        ``errors="return"``: failed draws become ``Failure`` values.
    batch_window
        Seconds a queue waits for more draws while their producers run.
    request_limit
        The evaluation's bound on wire requests (or batches) in flight.
    finish, fail
        ``finish(index, value)`` / ``fail(index, error)`` a node of the plan.
    spawn
        ``spawn(coroutine, on_done)`` runs a task owned by the scheduler.
    wake
        Wakes the scheduler's loop when a gathering window closes.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        cache: Any,
        executor: Executor,
        recorder: Callable[[], Recorder],
        return_failures: bool,
        batch_window: float,
        request_limit: asyncio.Semaphore | None,
        finish: Callable[[int, Any], None],
        fail: Callable[[int, BaseException], None],
        spawn: Spawn,
        wake: Callable[[], None],
    ) -> None:
        self.plan = plan
        self.cache = cache
        self.executor = executor
        self._recorder = recorder
        self.return_failures = return_failures
        self.batch_window = batch_window
        self.request_limit = request_limit
        self.finish = finish
        self.fail = fail
        self.spawn = spawn
        self.wake = wake
        self.queues: dict[tuple[Backend, Any], BatchQueue] = {}
        self.waiters: dict[tuple[Backend, Draw], list[tuple[NodeDraws, int]]] = {}
        self.limits: dict[Backend, asyncio.Semaphore | None] = {}
        self.batch_ids = 0
        self.timer: asyncio.TimerHandle | None = None
        for node in plan.nodes:
            if node.op.mode == "generate":
                self._queue(node).unready += 1

    @property
    def recorder(self) -> Recorder:
        """The scheduler's recorder now (a progress ``Counter`` may stand in front of a trace)."""
        return self._recorder()

    @property
    def tracing(self) -> bool:
        """Whether someone listens to batch details (a plain ``Recorder`` ignores them)."""
        return type(self.recorder) is not Recorder

    @property
    def window_open(self) -> bool:
        """Whether a gathering window will wake the scheduler later."""
        return self.timer is not None

    def _queue(self, node: Apply) -> BatchQueue:
        key = queue_key(node.op.backend, node.op.params)  # type: ignore[attr-defined]
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = BatchQueue(node.op.backend)  # type: ignore[attr-defined]
        return queue

    # -- draws in ------------------------------------------------------------------
    def start(self, index: int, node: Apply, prompt: Any, failed_input: bool) -> None:
        """Turn a ready Generate node into queued draws (``failed_input``: its prompt holds Failures)."""
        op: Any = node.op
        queue = self._queue(node)
        queue.unready -= 1
        if isinstance(prompt, Failure):
            self.finish(index, prompt.skipped(node.label, op.name))
            return
        failed: list[Failure | None] = []
        if self.return_failures and isinstance(prompt, np.ndarray) and failed_input:
            failed = [x if isinstance(x, Failure) else None for x in prompt.reshape(-1)]
            prompt = np.where(np.vectorize(lambda x: isinstance(x, Failure), otypes=[bool])(prompt), "", prompt)
        shape, draws = op.draws(prompt, self.plan.draw_offsets.get(id(node), 0))
        outstanding = NodeDraws(index, shape, len(draws))
        per_element = op.num_samples
        if not queue.pending:
            queue.since = time.perf_counter()
        for position, draw in enumerate(draws):
            upstream = failed[position // per_element] if failed else None
            if upstream is not None:
                outstanding.results[position] = upstream.skipped(node.label, op.name)
                outstanding.remaining -= 1
                continue
            waiting = self.waiters.get((queue.backend, draw))
            if waiting is None:
                self.waiters[queue.backend, draw] = [(outstanding, position)]
                queue.pending[draw] = None
            else:
                waiting.append((outstanding, position))
        if outstanding.remaining == 0:
            self._finish_node(outstanding)

    # -- batches out ---------------------------------------------------------------
    def flush(self, others_running: bool) -> None:
        """Send what is queued, unless a queue may still fill while ``others_running``."""
        now = time.perf_counter()
        wait_until = None
        for queue in self.queues.values():
            if not queue.pending:
                continue
            full = queue.backend.max_batch is not None and len(queue.pending) >= queue.backend.max_batch
            deadline = queue.since + self.batch_window
            if queue.unready and others_running and now < deadline:
                if full:  # send the whole batches now; the remainder may still fill up
                    self._send(queue, whole_batches=True)
                if queue.pending:
                    wait_until = deadline if wait_until is None else min(wait_until, deadline)
                continue
            self._send(queue)
        if wait_until is not None and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(max(0.0, wait_until - now), self._window_closed)

    def _window_closed(self) -> None:
        self.timer = None
        self.wake()

    async def close(self) -> None:
        """Stop the window timer and release every backend's loop-bound resources."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for backend in sorted({queue.backend for queue in self.queues.values()}, key=repr):
            await backend.aclose()

    def _send(self, queue: BatchQueue, whole_batches: bool = False) -> None:
        draws = list(queue.pending)
        backend = queue.backend
        if whole_batches:
            size = backend.max_batch or len(draws)
            draws = draws[: len(draws) - len(draws) % size]
            for draw in draws:
                del queue.pending[draw]
        else:
            queue.pending.clear()
        # Each draw is keyed once: for the lookup and, on a miss, for storing its text.
        # Empty: no cache, or a backend that is not cacheable (nothing goes to disk).
        cached = self.cache is not None and backend.cacheable and bool(draws)
        keys = cache_module.draw_keys(backend.identity, draws) if cached else []
        found = lookup(self.cache, backend, draws, keys=keys) if cached else {}
        if found:
            for draw in draws:
                if draw in found:
                    self._resolve(backend, draw, found[draw], hit=True)
            keys = [k for d, k in zip(draws, keys) if d not in found]
            draws = [d for d in draws if d not in found]
        start = 0
        for size in batch_sizes(len(draws), backend.max_batch) if draws else []:
            self._start_batch(backend, draws[start : start + size], keys[start : start + size])
            start += size

    def _start_batch(self, backend: Backend, draws: list[Draw], keys: list[bytes]) -> None:
        self.batch_ids += 1
        batch_id = self.batch_ids

        def on_result(index: int, text: str) -> None:
            if keys and 0 <= index < len(keys):
                self.cache.put_many({keys[index]: text})

        def on_failure(index: int, error: BaseException) -> None:
            if not self.return_failures and 0 <= index < len(draws):
                self._fail_draw(backend, draws[index], error)

        report = BatchReport(
            on_result=on_result,
            on_failure=on_failure,
            on_request=lambda start, end, error: self.recorder.request_finished(batch_id, start, end, error),
            on_model_loaded=lambda start, end: self.recorder.model_loaded(backend, start, end),
            request_limit=self.request_limit if backend.sends_requests else None,
        )
        self.spawn(
            self._run_batch(batch_id, backend, draws, keys, report),
            lambda task: self._batch_done(backend, draws, task, report),
        )

    async def _run_batch(
        self, batch_id: int, backend: Backend, draws: list[Draw], keys: list[bytes], report: BatchReport
    ) -> list[str]:
        limit = self._limit(backend)
        # A backend that sends its own requests takes one evaluation slot per request.
        whole = self.request_limit if not backend.sends_requests else None
        if limit is not None:
            await limit.acquire()
        if whole is not None:
            await whole.acquire()
        nodes: list[str] = []
        if self.tracing:  # a waiter lookup per draw: only when someone listens
            indices = {d.index for r in draws for d, _ in self.waiters.get((backend, r), ())}
            nodes = sorted(self.plan.nodes[i].label for i in indices)
        self.recorder.batch_started(batch_id, backend, nodes, len(draws), time.perf_counter())
        error: BaseException | None = None
        worker = None
        try:
            # Constrained draws are checked, and retried while they break their constraint.
            texts, worker = await generate_valid(self.executor.generate, backend, draws, report)
            if not isinstance(texts, list) or len(texts) != len(draws):
                raise BackendError(f"{backend!r} returned {len(texts)} completions for {len(draws)} prompts")
            if keys:  # what the backend did not report (and cache) already
                reported = report.results.keys() | report.failures.keys()
                rest = {k: t for i, (k, t) in enumerate(zip(keys, texts)) if i not in reported}
                if rest:
                    self.cache.put_many(rest)
            return texts
        except BaseException as exc:
            error = exc
            raise
        finally:
            usage = (report.tokens[0], report.tokens[1])
            self.recorder.batch_finished(batch_id, time.perf_counter(), error, usage, worker, requests=report.requests)
            if whole is not None:
                whole.release()
            if limit is not None:
                limit.release()

    def _limit(self, backend: Backend) -> asyncio.Semaphore | None:
        if backend not in self.limits:
            bound = self.executor.max_concurrency(backend)
            self.limits[backend] = asyncio.Semaphore(bound) if bound else None
        return self.limits[backend]

    # -- results back -------------------------------------------------------------
    def _batch_done(self, backend: Backend, draws: list[Draw], task: asyncio.Task[Any], report: BatchReport) -> None:
        exc = task.exception()
        if exc is None:
            texts = task.result()
            for index, draw in enumerate(draws):
                if index in report.failures:
                    self._fail_draw(backend, draw, report.failures[index])
                else:
                    self._resolve(backend, draw, report.results.get(index, texts[index]), hit=False)
            return
        if not self.return_failures:
            self._fail_draw(backend, draws[0], exc)
            return
        # What finished before the failure is kept; each reported failure is its own.
        for index, draw in enumerate(draws):
            if index in report.results:
                self._resolve(backend, draw, report.results[index], hit=False)
            else:
                self._fail_draw(backend, draw, report.failures.get(index, exc))

    def _fail_draw(self, backend: Backend, draw: Draw, exc: BaseException) -> None:
        if not self.return_failures:
            waiting = self.waiters.get((backend, draw))
            self.fail(waiting[0][0].index if waiting else 0, exc)
            return
        for outstanding, position in self.waiters.pop((backend, draw), ()):
            node = self.plan.nodes[outstanding.index]
            self._resolve_one(outstanding, position, Failure.from_exception(node.label, node.op.name, exc))

    def _resolve(self, backend: Backend, draw: Draw, value: Any, *, hit: bool) -> None:
        for outstanding, position in self.waiters.pop((backend, draw), ()):
            outstanding.hits += hit
            self._resolve_one(outstanding, position, value)

    def _resolve_one(self, outstanding: NodeDraws, position: int, value: Any) -> None:
        outstanding.results[position] = value
        outstanding.remaining -= 1
        if outstanding.remaining == 0:
            self._finish_node(outstanding)

    def _finish_node(self, outstanding: NodeDraws) -> None:
        node = self.plan.nodes[outstanding.index]
        count = len(outstanding.results)
        self.recorder.node_cache(node, outstanding.hits, count - outstanding.hits)
        if not outstanding.shape:
            self.finish(outstanding.index, outstanding.results[0])
            return
        array = np.fromiter(outstanding.results, dtype=object, count=count).reshape(outstanding.shape)
        self.finish(outstanding.index, array)
