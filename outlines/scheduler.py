"""The asynchronous walk of a Plan: dispatch, batching, concurrency, failures.

State of one evaluation (Dask's words): a node is *waiting* while its
in-degree counter is above zero, *ready* when it reaches zero (in the ``ready``
deque), *running* while its task or its draws are outstanding, and *finished*
once its output values are stored. Kahn-style: finishing a node decrements its
consumers' counters and readies those that reach zero.

Model calls are not run one node at a time: a ready ``Generate`` node turns
into draws that join a per-(backend, params) ``Group``. Groups are flushed
after every round of dispatching: draws are deduplicated, looked up in the
cache in one query, split by the backend's ``max_batch`` and sent as batch
tasks, at most ``max_concurrency`` per backend. A short gathering window keeps
a group open while other nodes that feed it are still running.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from outlines import cache as cache_module
from outlines._threads import run_blocking
from outlines.backends.base import (
    Backend,
    BackendError,
    Request,
    _requests_callback,
    _result_callback,
    _usage_callback,
)
from outlines.errors import Failure, NodeError
from outlines.graph.basic import Apply
from outlines.graph.ops import scalar_or_array
from outlines.plan import Plan
from outlines.trace import Recorder

__all__ = ["LocalExecutor", "Scheduler"]

FAST_CALL_SECONDS = 1e-3
#: Blocking Python calls made ready together go to the thread pool in at most
#: this many chunks (one executor task each), so thousands of calls cost a few
#: dispatches while slow calls still run in parallel.
PYTHON_CHUNKS = 32


class LocalExecutor:
    """Runs batches and blocking Python calls in this process."""

    async def generate(self, backend: Backend, requests: list[Request]) -> tuple[list[str], str | None]:
        return await backend.generate(requests), None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await run_blocking(fn, *args)


class _Draws:
    """The outstanding draws of one running Generate node."""

    __slots__ = ("index", "shape", "results", "remaining", "hits")

    def __init__(self, index: int, shape: tuple[int, ...], count: int) -> None:
        self.index = index
        self.shape = shape
        self.results: list[Any] = [None] * count
        self.remaining = count
        self.hits = 0


class _Group:
    """Draws waiting to be sent to one backend with one set of params."""

    __slots__ = ("backend", "pending", "since", "unready")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pending: dict[Request, None] = {}
        self.since = 0.0
        self.unready = 0  # Generate nodes of this group not dispatched yet


class Scheduler:
    """Evaluate one Plan; see the module docstring."""

    def __init__(
        self,
        plan: Plan,
        values: dict[int, Any],
        *,
        cache: Any = True,
        errors: str = "raise",
        max_concurrency: int | None = None,
        recorder: Recorder | None = None,
        executor: Any = None,
        batch_window: float = 0.005,
    ) -> None:
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
        self.plan = plan
        self.values = values
        self.cache = cache_module.resolve(cache)
        self.return_failures = errors == "return"
        self.recorder = recorder or Recorder()
        self.tracing = type(self.recorder) is not Recorder
        self.executor = executor or LocalExecutor()
        self.batch_window = batch_window
        self.global_limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.waiting = list(plan.indegree)
        self.ready: deque[int] = deque(i for i, n in enumerate(self.waiting) if n == 0)
        self.remaining = len(plan.nodes)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.done: deque[Callable[[], None]] = deque()
        self.wakeup = asyncio.Event()
        self.groups: dict[tuple[Backend, Any], _Group] = {}
        self.waiters: dict[tuple[Backend, Request], list[tuple[_Draws, int]]] = {}
        self.limits: dict[Backend, asyncio.Semaphore | None] = {}
        self.tainted: set[int] = set()
        self.python_pending: list[tuple[int, Callable[[], Any]]] = []
        self.error: BaseException | None = None
        self.batch_ids = 0
        self.timer: asyncio.TimerHandle | None = None
        for node in plan.nodes:
            if node.op.mode == "generate":
                self._group(node).unready += 1

    # -- the loop ---------------------------------------------------------------
    async def run(self) -> list[Any]:
        self.recorder.eval_started(self.plan, time.perf_counter())
        try:
            while self.remaining and self.error is None:
                self._dispatch_ready()
                if self.error is not None or not self.remaining:
                    break
                if self.python_pending:
                    self._flush_python()
                self._flush_groups()
                if self.ready or not self.remaining:
                    continue  # cache hits finished nodes synchronously in _flush_groups
                if not self.done:
                    if not self.tasks and self.timer is None and not self.ready:
                        raise RuntimeError(f"scheduler stalled with {self.remaining} node(s) unfinished")
                    self.wakeup.clear()
                    await self.wakeup.wait()
                while self.done and self.error is None:
                    self.done.popleft()()
        except BaseException as exc:
            self.recorder.eval_finished(time.perf_counter(), exc)
            raise
        finally:
            await self._cleanup()
        self.recorder.eval_finished(time.perf_counter(), self.error)
        if self.error is not None:
            raise self.error
        return [scalar_or_array(self.values[id(v)]) for v in self.plan.outputs]

    async def _cleanup(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        backends = {group.backend for group in self.groups.values()}
        for backend in sorted(backends, key=repr):
            await backend.aclose()

    def _spawn(self, coroutine: Any, on_done: Callable[[asyncio.Task[Any]], None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self.tasks.add(task)

        def finished(task: asyncio.Task[Any]) -> None:
            self.tasks.discard(task)
            if not task.cancelled():
                task.exception()  # retrieved now: after a first error the rest are never handled
                self.done.append(lambda: on_done(task))
                self.wakeup.set()

        task.add_done_callback(finished)

    # -- nodes ------------------------------------------------------------------
    def _dispatch_ready(self) -> None:
        ready, plan = self.ready, self.plan
        while ready and self.error is None:
            index = ready.popleft()
            node = plan.nodes[index]
            self.recorder.node_started(node, time.perf_counter())
            inputs = [self.values[id(v)] for v in node.inputs]
            mode = node.op.mode
            try:
                if mode == "generate":
                    self._start_generate(index, node, inputs[0])
                elif mode == "python":
                    self._start_python(index, node, inputs)
                else:
                    self._finish(index, self._perform_inline(node, inputs))
            except Exception as exc:  # noqa: BLE001 - reported against the node
                self._fail_node(index, exc)

    def _tainted(self, node: Apply) -> bool:
        return bool(self.tainted) and any(id(v) in self.tainted for v in node.inputs)

    def _guards(self, node: Apply) -> dict[str, Any]:
        if not self.return_failures:
            return {}
        label, op = node.label, node.op.name
        return {
            "on_error": lambda exc: Failure.from_exception(label, op, exc),
            "on_failed_input": lambda failure: failure.skipped(label, op),
        }

    def _perform_inline(self, node: Apply, inputs: list[Any]) -> Any:
        if self._tainted(node) and getattr(node.op, "elementwise", False):
            from outlines.graph.ops import broadcast_map

            return broadcast_map(node.op.perform, inputs, **self._guards(node))
        return node.op.perform(*inputs)

    def _start_python(self, index: int, node: Apply, inputs: list[Any]) -> None:
        op: Any = node.op
        function = op.function
        guards = self._guards(node)
        if function.is_async:
            self._spawn(op.aperform(*inputs, **guards), lambda t: self._task_done(index, t))
            return
        mean = function.mean_seconds
        inline = function.blocking is False or (
            function.blocking is None and mean is not None and mean < FAST_CALL_SECONDS
        )
        if inline:
            start = time.perf_counter()
            result = op.perform(*inputs, **guards)
            function.record(time.perf_counter() - start)
            self._finish(index, result)
            return

        self.python_pending.append((index, lambda: op.perform(*inputs, **guards)))

    def _flush_python(self) -> None:
        """Send the blocking Python calls made ready this round, in a few chunks."""
        pending, self.python_pending = self.python_pending, []
        chunks = min(len(pending), PYTHON_CHUNKS)
        for start in range(chunks):
            self._spawn_chunk(pending[start::chunks])

    def _spawn_chunk(self, chunk: list[tuple[int, Callable[[], Any]]]) -> None:
        self._spawn(self.executor.call(_run_chunk, chunk), lambda task: self._chunk_done(chunk, task))

    def _chunk_done(self, chunk: list[tuple[int, Callable[[], Any]]], task: asyncio.Task[Any]) -> None:
        if task.exception() is not None:
            for index, _ in chunk:
                self._fail_node(index, task.exception())  # type: ignore[arg-type]
            return
        for index, ok, value, seconds in task.result():
            # Recorded here, not where it ran: a worker's copy of the function is not ours.
            self.plan.nodes[index].op.function.record(seconds)  # type: ignore[attr-defined]
            if ok:
                self._finish(index, value)
            else:
                self._fail_node(index, value)

    def _task_done(self, index: int, task: asyncio.Task[Any]) -> None:
        exc = task.exception()
        if exc is not None:
            self._fail_node(index, exc)
        else:
            self._finish(index, task.result())

    def _finish(self, index: int, result: Any, error: BaseException | None = None) -> None:
        node = self.plan.nodes[index]
        outputs = node.outputs
        results = result if len(outputs) > 1 else (result,)
        for output, value in zip(outputs, results):
            self.values[id(output)] = value
            if self.return_failures and _has_failure(value):
                self.tainted.add(id(output))
        self.recorder.node_finished(node, time.perf_counter(), error)
        self.remaining -= 1
        for consumer in self.plan.consumers[index]:
            self.waiting[consumer] -= 1
            if self.waiting[consumer] == 0:
                self.ready.append(consumer)

    def _fail_node(self, index: int, exc: BaseException) -> None:
        node = self.plan.nodes[index]
        if not self.return_failures:
            if self.error is None:
                self.error = exc if isinstance(exc, NodeError) else NodeError(node.label, node.op.name, exc)
                if self.error is not exc:
                    self.error.__cause__ = exc
            self.recorder.node_finished(node, time.perf_counter(), exc)
            return
        failure = Failure.from_exception(node.label, node.op.name, exc)
        self._finish(index, tuple(failure for _ in node.outputs) if len(node.outputs) > 1 else failure, exc)

    # -- model calls ----------------------------------------------------------------
    def _group(self, node: Apply) -> _Group:
        key = (node.op.backend, node.op.params)  # type: ignore[attr-defined]
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = _Group(node.op.backend)  # type: ignore[attr-defined]
        return group

    def _start_generate(self, index: int, node: Apply, prompt: Any) -> None:
        op = node.op
        group = self._group(node)
        group.unready -= 1
        if isinstance(prompt, Failure):
            self._finish(index, prompt.skipped(node.label, op.name))
            return
        failed: list[Failure | None] = []
        if self.return_failures and isinstance(prompt, np.ndarray) and id(node.inputs[0]) in self.tainted:
            failed = [x if isinstance(x, Failure) else None for x in prompt.reshape(-1)]
            prompt = np.where(np.vectorize(lambda x: isinstance(x, Failure), otypes=[bool])(prompt), "", prompt)
        shape, requests = op.requests(prompt, self.plan.draw_offsets.get(id(node), 0))  # type: ignore[attr-defined]
        draws = _Draws(index, shape, len(requests))
        per_element = op.num_samples  # type: ignore[attr-defined]
        if not group.pending:
            group.since = time.perf_counter()
        for position, request in enumerate(requests):
            upstream = failed[position // per_element] if failed else None
            if upstream is not None:
                draws.results[position] = upstream.skipped(node.label, op.name)
                draws.remaining -= 1
                continue
            waiting = self.waiters.get((group.backend, request))
            if waiting is None:
                self.waiters[group.backend, request] = [(draws, position)]
                group.pending[request] = None
            else:
                waiting.append((draws, position))
        if draws.remaining == 0:
            self._finish_draws(draws)

    def _flush_groups(self) -> None:
        now = time.perf_counter()
        wait_until = None
        for group in self.groups.values():
            if not group.pending:
                continue
            full = group.backend.max_batch is not None and len(group.pending) >= group.backend.max_batch
            deadline = group.since + self.batch_window
            if group.unready and self.tasks and now < deadline:
                if full:  # send the whole batches now; the remainder may still fill up
                    self._send(group, whole_batches=True)
                if group.pending:
                    wait_until = deadline if wait_until is None else min(wait_until, deadline)
                continue
            self._send(group)
        if wait_until is not None and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(max(0.0, wait_until - now), self._window_closed)

    def _window_closed(self) -> None:
        self.timer = None
        self.wakeup.set()

    def _send(self, group: _Group, whole_batches: bool = False) -> None:
        requests = list(group.pending)
        if whole_batches:
            size = group.backend.max_batch or len(requests)
            requests = requests[: len(requests) - len(requests) % size]
            for request in requests:
                del group.pending[request]
        else:
            group.pending.clear()
        backend = group.backend
        keys: list[str] = []
        if self.cache is not None:
            identity = backend.identity
            keys = [cache_module.draw_key(identity, r) for r in requests]
            found = self.cache.get_many(keys)
            if found:
                misses, miss_keys = [], []
                for request, key in zip(requests, keys):
                    if key in found:
                        self._resolve(backend, request, found[key], hit=True)
                    else:
                        misses.append(request)
                        miss_keys.append(key)
                requests, keys = misses, miss_keys
        size = backend.max_batch or len(requests) or 1
        for start in range(0, len(requests), size):
            self._start_batch(backend, requests[start : start + size], keys[start : start + size])

    def _start_batch(self, backend: Backend, requests: list[Request], keys: list[str]) -> None:
        """Send one batch; ``keys`` are the draws' cache keys (empty: no cache)."""
        self.batch_ids += 1
        batch_id = self.batch_ids
        done: dict[int, str] = {}  # requests the backend reported before the batch ended
        self._spawn(
            self._run_batch(batch_id, backend, requests, keys, done),
            lambda t: self._batch_done(backend, requests, t, done),
        )

    async def _run_batch(
        self, batch_id: int, backend: Backend, requests: list[Request], keys: list[str], done: dict[int, str]
    ) -> list[str]:
        limit = self._limit(backend)
        if limit is not None:
            await limit.acquire()
        if self.global_limit is not None:
            await self.global_limit.acquire()
        usage = [0, 0]

        def add_usage(prompt_tokens: int, completion_tokens: int) -> None:
            usage[0] += prompt_tokens
            usage[1] += completion_tokens

        requests_sent = [0]

        def add_requests(count: int) -> None:
            requests_sent[0] += count

        def add_result(index: int, text: str) -> None:
            if 0 <= index < len(requests) and index not in done and isinstance(text, str):
                done[index] = text
                if self.cache is not None:
                    self.cache.put_many({keys[index]: text})

        token = _usage_callback.set(add_usage)
        requests_token = _requests_callback.set(add_requests)
        result_token = _result_callback.set(add_result)
        nodes: list[str] = []
        if self.tracing:  # a waiter lookup per request: only when someone listens
            indices = {d.index for r in requests for d, _ in self.waiters.get((backend, r), ())}
            nodes = sorted(self.plan.nodes[i].label for i in indices)
        self.recorder.batch_started(batch_id, backend, nodes, len(requests), time.perf_counter())
        error: BaseException | None = None
        worker = None
        try:
            texts, worker = await self.executor.generate(backend, requests)
            if not isinstance(texts, list) or len(texts) != len(requests):
                raise BackendError(f"{backend!r} returned {len(texts)} completions for {len(requests)} prompts")
            if self.cache is not None and len(done) < len(requests):
                self.cache.put_many({k: t for i, (k, t) in enumerate(zip(keys, texts)) if i not in done})
            return texts
        except BaseException as exc:
            error = exc
            raise
        finally:
            _usage_callback.reset(token)
            _requests_callback.reset(requests_token)
            _result_callback.reset(result_token)
            self.recorder.batch_finished(
                batch_id, time.perf_counter(), error, (usage[0], usage[1]), worker, requests=requests_sent[0]
            )
            if self.global_limit is not None:
                self.global_limit.release()
            if limit is not None:
                limit.release()

    def _limit(self, backend: Backend) -> asyncio.Semaphore | None:
        if backend not in self.limits:
            bound = backend.max_concurrency
            per_executor = getattr(self.executor, "max_concurrency", None)
            if per_executor is not None:  # a cluster holds one copy of a local model per worker
                bound = per_executor(backend)
            self.limits[backend] = asyncio.Semaphore(bound) if bound else None
        return self.limits[backend]

    def _batch_done(
        self, backend: Backend, requests: list[Request], task: asyncio.Task[Any], done: dict[int, str]
    ) -> None:
        exc = task.exception()
        if exc is None:
            for request, text in zip(requests, task.result()):
                self._resolve(backend, request, text, hit=False)
            return
        if self.return_failures and done:  # what finished before the failure is kept
            for index, text in done.items():
                self._resolve(backend, requests[index], text, hit=False)
            requests = [r for i, r in enumerate(requests) if i not in done]
        if not self.return_failures:
            waiting = self.waiters.get((backend, requests[0]))
            self._fail_node(waiting[0][0].index if waiting else 0, exc)
            return
        for request in requests:
            for draws, position in self.waiters.pop((backend, request), ()):
                node = self.plan.nodes[draws.index]
                self._resolve_one(draws, position, Failure.from_exception(node.label, node.op.name, exc))

    def _resolve(self, backend: Backend, request: Request, value: Any, *, hit: bool) -> None:
        for draws, position in self.waiters.pop((backend, request), ()):
            draws.hits += hit
            self._resolve_one(draws, position, value)

    def _resolve_one(self, draws: _Draws, position: int, value: Any) -> None:
        draws.results[position] = value
        draws.remaining -= 1
        if draws.remaining == 0:
            self._finish_draws(draws)

    def _finish_draws(self, draws: _Draws) -> None:
        node = self.plan.nodes[draws.index]
        count = len(draws.results)
        self.recorder.node_cache(node, draws.hits, count - draws.hits)
        if not draws.shape:
            self._finish(draws.index, draws.results[0])
            return
        array = np.fromiter(draws.results, dtype=object, count=count).reshape(draws.shape)
        self._finish(draws.index, array)


def _run_chunk(chunk: list[tuple[int, Callable[[], Any]]]) -> list[tuple[int, bool, Any, float]]:
    """Run blocking calls (in a thread or on a worker); time each one."""
    results = []
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
