"""Model calls inside a schedule: draws, per-backend groups, batches, the cache.

A ready ``Generate`` node turns into draws that join the ``Group`` of its
(backend, params). After each dispatch round the scheduler flushes the groups:
draws are deduplicated (waiters keyed by backend and request), looked up in
the cache in one query, split by the backend's ``max_batch`` and sent as
batch tasks, at most ``max_concurrency`` per backend. A group stays open for a
short gathering window while other nodes that feed it are still running; a
full group sends its whole batches at once and keeps the remainder open.
Each finished draw is cached as its request completes.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from outlines import cache as cache_module
from outlines.backends.base import (
    Backend,
    BackendError,
    Request,
    _requests_callback,
    _result_callback,
    _usage_callback,
)
from outlines.backends.constraints import generate_valid
from outlines.errors import Failure
from outlines.graph.basic import Apply
from outlines.runtime.plan import Plan
from outlines.tracing import Recorder

__all__ = ["Draws", "Group", "ModelCalls"]


class Draws:
    """The outstanding draws of one running Generate node."""

    __slots__ = ("index", "shape", "results", "remaining", "hits")

    def __init__(self, index: int, shape: tuple[int, ...], count: int) -> None:
        self.index = index
        self.shape = shape
        self.results: list[Any] = [None] * count
        self.remaining = count
        self.hits = 0


class Group:
    """Draws waiting to be sent to one backend with one set of params."""

    __slots__ = ("backend", "pending", "since", "unready")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pending: dict[Request, None] = {}
        self.since = 0.0
        self.unready = 0  # Generate nodes of this group not dispatched yet


class ModelCalls:
    """The model-call half of ``Scheduler`` (which provides the state below)."""

    plan: Plan
    cache: Any
    recorder: Recorder
    tracing: bool
    executor: Any
    batch_window: float
    return_failures: bool
    global_limit: asyncio.Semaphore | None
    tasks: set[asyncio.Task[Any]]
    wakeup: asyncio.Event
    groups: dict[tuple[Backend, Any], Group]
    waiters: dict[tuple[Backend, Request], list[tuple[Draws, int]]]
    limits: dict[Backend, asyncio.Semaphore | None]
    tainted: set[int]
    batch_ids: int
    timer: asyncio.TimerHandle | None

    def _spawn(self, coroutine: Any, on_done: Callable[[asyncio.Task[Any]], None]) -> None:
        raise NotImplementedError

    def _finish(self, index: int, result: Any, error: BaseException | None = None) -> None:
        raise NotImplementedError

    def _fail_node(self, index: int, exc: BaseException) -> None:
        raise NotImplementedError

    def _group(self, node: Apply) -> Group:
        # Draws that differ only in their constraint share batches (issue 13): a
        # local model masks each row under its own constraint in one forward pass.
        key = (node.op.backend, replace(node.op.params, constraint=None))  # type: ignore[attr-defined]
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(node.op.backend)  # type: ignore[attr-defined]
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
        draws = Draws(index, shape, len(requests))
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

    def _send(self, group: Group, whole_batches: bool = False) -> None:
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
            # Constrained draws are checked, and retried while they break their constraint.
            texts, worker = await generate_valid(self.executor.generate, backend, requests)
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

    def _resolve_one(self, draws: Draws, position: int, value: Any) -> None:
        draws.results[position] = value
        draws.remaining -= 1
        if draws.remaining == 0:
            self._finish_draws(draws)

    def _finish_draws(self, draws: Draws) -> None:
        node = self.plan.nodes[draws.index]
        count = len(draws.results)
        self.recorder.node_cache(node, draws.hits, count - draws.hits)
        if not draws.shape:
            self._finish(draws.index, draws.results[0])
            return
        array = np.fromiter(draws.results, dtype=object, count=count).reshape(draws.shape)
        self._finish(draws.index, array)
