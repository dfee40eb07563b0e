"""The ``Batcher``: one schedule's model calls, from ready nodes to finished ones.

Its state, besides the queues (``outlines.runtime.batching.queue``) and the
Waits (``outlines.runtime.batching.waiting``): ``routes`` (each Generate op's
queue, looked up once per op), ``running`` and ``sent`` (batches in flight,
and sent so far), ``refused`` (a batch the budget refused: raised once the
batches in flight have ended) and ``timer`` (an open gathering window).

The path of a draw, one method per step:

1. ``start``: a ready Generate node becomes a ``Wait`` whose draws join its
   queue's slots; a node whose draws the cache's memory holds whole finishes
   at once (``_from_memory``).
2. ``flush``, after each round of dispatching: each queue whose gathering
   window is over goes out (``_send``): its draws are taken, the cache answers
   what it holds (``_from_cache``), the rest is packed into ``Batch`` records
   (``outlines.runtime.batching.batches.pack_draws``: where a ready batch of
   draws is packed), and each record the budget admits (``_admit``) is handed
   to its backend (``_dispatch``: a live call through the executor).
3. ``_call`` runs one batch: the evaluation's bounds, the executor's
   ``generate`` (constrained draws checked and retried), each finished draw
   cached as its backend reports it.
4. ``_batch_done``: values and failures go back to the Waits
   (``_hand_over``); a complete Wait finishes its node (``_finish``).

The batcher talks to the schedule that owns it through the ``Schedule``
protocol (``finish``, ``fail``, ``spawn``, ``wake``) and reads everything
else from the ``Evaluation``.
"""
from __future__ import annotations

import asyncio
import functools
import time
from typing import Any, Callable, Coroutine, Protocol, Sequence

import numpy as np

from outlines.backends.base import Backend, BackendError, BatchReport
from outlines.draws import DrawColumns
from outlines.draws.packing import full_batches
from outlines.backends.constraints import generate_valid
from outlines.common.threads import FOREGROUND
from outlines.common.errors import Failure, JobsRunning
from outlines.graph.basic import Apply
from outlines.graph.ops import all_text
from outlines.graph.protocols import ModelCall, model_call
from outlines.graph.traits import Run
from outlines.runtime.batching.batches import Batch, pack_draws
from outlines.runtime.batching.queue import BatchQueue, SlotQueue, queue_key
from outlines.runtime.batching.waiting import Wait, NodeParts
from outlines.runtime.jobs import JobEvent, generate_as_jobs, has_jobs
from outlines.runtime.plan import Plan
from outlines.runtime.session import Evaluation

__all__ = ["Batcher", "Schedule", "cached_values"]


class Schedule(Protocol):
    """What the batcher needs from the schedule that owns it (``outlines.runtime.scheduler.Scheduler``)."""

    def finish(self, index: int, result: Any) -> None:
        """Node ``index`` of the plan computed ``result``."""

    def fail(self, index: int, exc: BaseException, label: str | None = None) -> None:
        """Node ``index`` failed (``label``: the call a stacked node's failing element stands for)."""

    def spawn(self, coroutine: Coroutine[Any, Any, Any], on_done: Callable[[asyncio.Task[Any]], None]) -> None:
        """Run ``coroutine`` as a task of the schedule, then ``on_done(task)``."""

    def wake(self) -> None:
        """Wake the schedule's loop (a gathering window closed)."""


def cached_values(
    cache: Any, backend: Backend, draws: DrawColumns, *, record: bool = True, members: Any = None
) -> list[Any]:
    """The cached text of each draw (``None``: a miss): the step before a batch is packed.

    A fallback chain's draws are looked up under each of its models'
    identities in turn (``backend.cache_identities``, its primary first). A
    backend that is not ``cacheable`` (its identity holds an object id) never
    reads the cache. ``record=False`` (a dry run) counts no hits; ``members``:
    see ``Cache.get_draws``.
    """
    if cache is None or not draws or not backend.cacheable:
        return [None] * len(draws)
    identities = backend.cache_identities
    values: list[Any] = cache.get_draws(identities[0], draws, record=record, members=members)
    for identity in identities[1:]:
        missing = [i for i, value in enumerate(values) if value is None]
        if not missing:
            break
        for i, value in zip(missing, cache.get_draws(identity, draws.take(missing), record=record)):
            values[i] = value
    return values


class Batcher:
    """Queues, Waits and cache lookups of one schedule's model calls; see the module docstring.

    Parameters
    ----------
    plan
        The schedule's plan.
    evaluation
        The evaluation it belongs to: cache, executor, limits, budget,
        recorder, error mode, gathering window and draw namespace.
    schedule
        The schedule that owns this batcher.
    """

    def __init__(self, plan: Plan, evaluation: Evaluation, schedule: Schedule) -> None:
        self.plan = plan
        self.evaluation = evaluation
        self.schedule = schedule
        self.cache = evaluation.cache
        self.recorder = evaluation.recorder
        self.return_failures = evaluation.return_failures
        #: A model call with at least this many draws asks the cache's memory for all of them before it
        #: joins its queue (a warm re-run then skips the queue); a smaller one is looked up at the flush.
        self.peek_min = evaluation.tuning.peek_min
        self.queues: dict[tuple[Backend, Any], BatchQueue] = {}
        self.routes: dict[int, BatchQueue] = {}  # id(Generate op) -> its queue
        self.running = 0  # batches in flight
        self.sent = 0
        self.refused: tuple[int, BaseException] | None = None  # (node, error) raised once the running end
        self.timer: asyncio.TimerHandle | None = None
        self.jobs = evaluation.jobs
        self.as_jobs: dict[Backend, bool] = {}  # backend -> its draws go as provider batch jobs
        for node in plan.nodes:
            if node.op.traits.run is Run.GENERATE:
                self._route(model_call(node.op)).unready += 1

    def _route(self, op: ModelCall[Backend]) -> BatchQueue:
        """The queue of a Generate op (looked up once per op)."""
        queue = self.routes.get(id(op))
        if queue is None:
            key = queue_key(op.backend, op.params)
            queue = self.queues.get(key)
            if queue is None:
                queue = self.queues[key] = BatchQueue(op.backend)
                self.evaluation.uses(op.backend)
            self.routes[id(op)] = queue
        return queue

    def _as_jobs(self, backend: Backend) -> bool:
        """Whether ``backend``'s draws go as provider batch jobs (batch mode, and a provider that has them)."""
        if self.jobs is None:
            return False
        known = self.as_jobs.get(backend)
        if known is None:
            known = self.as_jobs[backend] = has_jobs(backend)
        return known

    def queued_draws(self) -> int:
        """Draws waiting in the queues, not sent yet."""
        return sum(queue.pending for queue in self.queues.values())

    @property
    def window_open(self) -> bool:
        """Whether a gathering window will wake the scheduler later."""
        return self.timer is not None

    # -- 1. draws in ------------------------------------------------------------------
    def start(self, index: int, node: Apply, prompt: Any, failed_input: bool) -> None:
        """Turn a ready Generate node into a Wait on its queue (``failed_input``: its prompt holds Failures)."""
        op: ModelCall[Backend] = model_call(node.op)
        queue = self._route(op)
        queue.unready -= 1
        if isinstance(prompt, Failure):
            self.schedule.finish(index, prompt.skipped(node.label, op.name))
            return
        settled: dict[int, Any] = {}
        if isinstance(prompt, np.ndarray) and (self.return_failures or id(node) in self.plan.members):
            settled = self._settled(node, prompt, failed_input)
            if settled and not self.return_failures:  # errors="raise": the first element's own call fails
                element = min(settled)
                failure = settled[element]
                self.schedule.fail(index, TypeError(failure.message), failure.node)
                return
            if settled:
                flat = prompt.reshape(-1).copy()
                flat[list(settled)] = ""  # a placeholder: settled elements are never drawn
                prompt = flat.reshape(prompt.shape)
        first, shift = self.plan.draw_offsets.get(id(node), 0), self.evaluation.draw_shift
        if isinstance(shift, np.ndarray):  # each element in a namespace of its own (a stacked loop's body)
            if not op.params.deterministic:
                self._start_elements(index, node, queue, prompt, settled, first, shift)
                return
            shift = 0  # greedy draws are all number 0, in any namespace
        shape, prompts, numbers = op.columns(prompt, first + shift)
        slots = [queue.slot_of(op.params, number) for number in numbers]
        wait = Wait(index, shape, prompts, [slot.waiters for slot in slots], settled)
        if not queue.pending:
            queue.since = time.perf_counter()
        peek = len(numbers) == 1 and not settled and len(prompts) >= self.peek_min
        if peek and self._from_memory(op, wait, slots[0]):
            return
        _join(wait, slots, prompts, settled)
        if not wait.missing:
            self._finish(wait)

    def _start_elements(self, index: int, node: Apply, queue: BatchQueue, prompt: Any, settled: dict[int, Any],
                        first: int, shifts: np.ndarray) -> None:
        """``start`` for a node whose elements (rows of its prompt) draw in namespaces of their own.

        Element ``e`` draws numbers ``first + shifts[e] + j``: the elements
        of one namespace are one ``Wait``, a part of the node's ``NodeParts``.
        """
        op = model_call(node.op)
        count = len(shifts)
        if not isinstance(prompt, np.ndarray) or prompt.ndim == 0 or prompt.shape[0] != count:
            got = f"shape {prompt.shape}" if isinstance(prompt, np.ndarray) else "one value"
            raise ValueError(f"{node.label}: its {count} element(s) each draw in a namespace of their own, so its "
                             f"prompt needs one row per element; it has {got}")
        shape, prompts, numbers = op.columns(prompt, 0)
        inner = len(prompts) // count if count else 0  # prompts per element
        namespaces: dict[int, list[int]] = {}
        for element, shift in enumerate(shifts.tolist()):
            namespaces.setdefault(shift, []).append(element)
        whole = NodeParts(index, shape, len(prompts), len(numbers), settled)
        if not queue.pending:
            queue.since = time.perf_counter()
        for shift, elements in namespaces.items():
            positions = elements if inner == 1 else [e * inner + i for e in elements for i in range(inner)]
            own = {j: settled[p] for j, p in enumerate(positions) if p in settled} if settled else {}
            slots = [queue.slot_of(op.params, first + shift + j) for j in numbers]
            part = Wait(index, (len(positions),), [prompts[p] for p in positions], [slot.waiters for slot in slots], own)
            whole.add(part, positions)
            _join(part, slots, part.prompts, own)
        done = [part for part in whole.parts if not part.missing]
        if not whole.parts:  # no element at all
            self._finish_node(index, shape, [], 0, 0)
        for part in done:
            self._finish(part)

    def _settled(self, node: Apply, prompt: np.ndarray, failed_input: bool) -> dict[int, Failure]:
        """The elements of ``prompt`` that fail before anything is sent, by flat index.

        An element whose input failed upstream is skipped; one that is not
        text fails alone, naming its index and type: the others are drawn.
        """
        values = prompt.reshape(-1).tolist()
        if not failed_input and all_text(values):  # the usual prompt: one C-speed pass
            return {}
        op = node.op
        members = self.plan.members.get(id(node))  # a stacked node: each element stands for a call
        settled: dict[int, Failure] = {}
        for element, value in enumerate(values):
            if isinstance(value, str):
                continue
            label = members[element].label if members else node.label
            if isinstance(value, Failure):
                settled[element] = value.skipped(label, op.name)
                continue
            if members:  # an element of a stacked call is its own call's one prompt: said as that call says it
                error = TypeError(f"the prompt must be text, got {type(value).__name__} {value!r:.60}")
            else:
                where = np.unravel_index(element, prompt.shape)
                at = where[0] if len(where) == 1 else tuple(int(i) for i in where)
                error = TypeError(f"the prompt at index {at} must be text, got {type(value).__name__} {value!r:.60}")
            settled[element] = Failure.from_exception(label, op.name, error)
        return settled

    def _from_memory(self, op: ModelCall[Backend], wait: Wait, slot: SlotQueue) -> bool:
        """Finish ``wait`` from the cache's memory when it holds every one of its draws."""
        backend = op.backend
        if self.cache is None or not backend.cacheable:
            return False
        values = self.cache.peek_draws(backend.cache_identities[0], DrawColumns.in_slot(slot.slot, wait.prompts))
        if values is None:
            return False
        self._finish(wait, values)
        return True

    # -- 2. batches out ---------------------------------------------------------------
    def flush(self, others_running: bool) -> None:
        """Send what is queued, unless a queue may still fill while ``others_running``."""
        now = time.perf_counter()
        window = self.evaluation.options.batch_window
        wait_until = None
        for queue in self.queues.values():
            pending = queue.pending
            if not pending:
                continue
            max_batch = None if self._as_jobs(queue.backend) else queue.backend.max_batch
            deadline = queue.since + window
            if queue.unready and others_running and now < deadline:
                if max_batch is not None and pending >= max_batch:  # send the whole batches now
                    self._send(queue, whole=True)
                if queue.pending:  # the remainder may still fill up
                    wait_until = deadline if wait_until is None else min(wait_until, deadline)
                continue
            self._send(queue)
        if wait_until is not None and self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(max(0.0, wait_until - now), self._window_closed)

    def _window_closed(self) -> None:
        self.timer = None
        self.schedule.wake()

    def close(self) -> None:
        """Stop the window timer (the evaluation closes the backends, at its end)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _send(self, queue: BatchQueue, whole: bool = False) -> None:
        """Take a queue's draws, answer what the cache holds, pack the rest and hand each batch over."""
        backend = queue.backend
        draws, members = queue.take()
        if whole:  # only full batches: the rest stays queued
            draws, rest = full_batches(draws, backend.max_batch, backend.prefix_min_head)
            queue.requeue(rest)
        draws = self._from_cache(queue, draws, members)
        for batch in pack_draws(backend, draws, jobs=self._as_jobs(backend)):
            if self.evaluation.budget is None:
                self._dispatch(queue, batch, None)
                continue
            for part in self._within_budget(queue, batch):  # what fits goes out, the rest is refused
                ticket = self._admit(queue, part)
                if ticket != -1:
                    self._dispatch(queue, part, ticket)

    def _from_cache(self, queue: BatchQueue, draws: DrawColumns, members: Any) -> DrawColumns:
        """Hand the cached draws over; the draws left to send."""
        if self.cache is None or not queue.backend.cacheable or not draws:
            return draws
        values = cached_values(self.cache, queue.backend, draws, members=members)
        misses = values.count(None)
        if misses == len(values):
            return draws
        if not misses:
            self._hand_over(queue, draws, values, hit=True)
            return draws[0:0]
        hits = [i for i, value in enumerate(values) if value is not None]
        self._hand_over(queue, draws.take(hits), [values[i] for i in hits], hit=True)
        return draws.take([i for i, value in enumerate(values) if value is None])

    def _within_budget(self, queue: BatchQueue, batch: Batch) -> list[Batch]:
        """``batch``, or split in two: the leading draws the budget has room for, and the rest (then refused)."""
        budget = self.evaluation.budget
        assert budget is not None
        try:
            fit = budget.fitting(queue.backend, batch.draws, batch=batch.jobs)
        except Exception:  # noqa: BLE001 - ``_admit`` fails the draws with it
            return [batch]
        if fit in (0, len(batch.draws)):
            return [batch]
        return [Batch(batch.backend, batch.draws[:fit], jobs=batch.jobs),
                Batch(batch.backend, batch.draws[fit:], jobs=batch.jobs)]

    def _admit(self, queue: BatchQueue, batch: Batch) -> int:
        """The budget's ticket for sending ``batch``, or -1: refused (its draws fail)."""
        budget = self.evaluation.budget
        assert budget is not None
        wait = self._slot(queue, batch.draws, 0).waiters.first(batch.draws.prompts[0])
        node = wait.index if wait is not None else 0
        try:
            return budget.admit(queue.backend, batch.draws, self.plan.nodes[node].label,
                                batch=batch.jobs)
        except Exception as exc:  # noqa: BLE001 - the refused draws fail with it
            if self.return_failures:
                for index in range(len(batch.draws)):
                    self._fail_draw(queue, batch.draws, index, exc)
            elif self.refused is None:
                self.refused = (node, exc)
                self._raise_refusal()
            return -1

    def _raise_refusal(self) -> None:
        """Fail the evaluation for the refused batch once no batch is in flight (theirs get cached first)."""
        if self.refused is not None and self.running == 0:
            self.schedule.fail(*self.refused)

    def _dispatch(self, queue: BatchQueue, batch: Batch, ticket: int | None) -> None:
        """Hand one packed batch to its backend: a live call, run as a task of the schedule."""
        self.running += 1
        self.sent += 1
        batch_id = self.evaluation.batch_id()
        backend, draws = queue.backend, batch.draws
        cached = self.cache is not None and backend.cacheable

        def on_result(index: int, text: str) -> None:
            if cached and 0 <= index < len(draws):
                answered = report.answered_by.get(index)  # a fallback's draw: under the model that answered
                identity = backend.cache_identities[0] if answered is None else answered.identity
                self.cache.put_draws(identity, draws[index : index + 1], [text])

        def on_failure(index: int, error: BaseException) -> None:
            if not self.return_failures and 0 <= index < len(draws):
                self._fail_draw(queue, draws, index, error)

        report = BatchReport(
            on_result=on_result,
            on_failure=on_failure,
            on_request=lambda start, end, error, model: self.recorder.request_finished(
                batch_id, start, end, error, model=model
            ),
            on_model_loaded=lambda start, end: self.recorder.model_loaded(backend, start, end),
            request_limit=self.evaluation.request_limit if backend.sends_requests else None,
        )
        self.schedule.spawn(
            self._call(batch_id, queue, draws, cached, report, ticket, batch.jobs),
            lambda task: self._batch_done(queue, draws, task, report),
        )

    # -- 3. one batch -----------------------------------------------------------------
    async def _call(
        self, batch_id: int, queue: BatchQueue, draws: DrawColumns, cached: bool, report: BatchReport,
        ticket: int | None, as_jobs: bool,
    ) -> list[str]:
        backend, evaluation = queue.backend, self.evaluation
        limit = evaluation.limit_for(backend)
        # A backend that sends its own requests takes one of the evaluation's permits per request.
        whole = evaluation.request_limit if not backend.sends_requests else None
        if limit is not None:
            await limit.acquire()
        if whole is not None:
            await whole.acquire()
        nodes: list[str] = []
        if evaluation.listening:  # who waits for each draw: only when someone listens
            waits = {id(w): w for slot, prompts in self._by_slot(queue, draws) for w in slot.waiters.wanting(prompts)}
            nodes = sorted(self.plan.nodes[w.index].label for w in waits.values())
        self.recorder.batch_started(batch_id, backend, nodes, len(draws), time.perf_counter())
        error: BaseException | None = None
        worker = None
        try:
            generate: Any = evaluation.executor.generate
            if as_jobs:
                generate = functools.partial(self._jobs_generate, batch_id)
            # Constrained draws are checked, and retried while they break their constraint.
            if queue.constrained:
                texts, worker = await generate_valid(generate, backend, draws, report)
            else:
                texts, worker = await generate(backend, draws, report)
            if not isinstance(texts, list) or len(texts) != len(draws):
                raise BackendError(f"{backend!r} returned {len(texts)} completions for {len(draws)} prompts")
            if cached:  # what the backend did not report (and cache) already
                with FOREGROUND:  # a burst of the event loop's: the writer waits (see Foreground)
                    identity = backend.cache_identities[0]
                    reported = report.results.keys() | report.failures.keys()
                    if not reported:
                        self.cache.put_draws(identity, draws, texts)
                    else:
                        rest = [i for i in range(len(texts)) if i not in reported]
                        if rest:
                            self.cache.put_draws(identity, draws.take(rest), [texts[i] for i in rest])
            return texts
        except BaseException as exc:
            error = exc
            raise
        finally:
            usage = tuple(report.tokens)  # prompt, completion, cached, written to a prompt cache
            if ticket is not None and evaluation.budget is not None:
                evaluation.budget.settle(ticket, backend, usage, failed=error is not None, batch=as_jobs)
            if report.answered_by:  # a fallback chain: which model answered how many draws
                answered: dict[str, int] = {}
                for member in report.answered_by.values():
                    answered[repr(member)] = answered.get(repr(member), 0) + 1
                self.recorder.draws_answered(batch_id, answered)
            self.recorder.batch_finished(batch_id, time.perf_counter(), error, usage, worker, requests=report.requests)
            if whole is not None:
                whole.release()
            if limit is not None:
                limit.release()

    async def _jobs_generate(
        self, batch_id: int, backend: Any, draws: Sequence[Any], report: BatchReport
    ) -> tuple[list[str], Any]:
        """``executor.generate``'s shape, in batch mode: the draws asked in provider jobs, here on the loop."""
        assert self.jobs is not None

        def on_job(event: JobEvent) -> None:
            self.recorder.job_event(batch_id, event)

        texts = await generate_as_jobs(self.jobs, self.cache, backend, DrawColumns.of(draws), report, on_job)
        return texts, None

    # -- 4. results back --------------------------------------------------------------
    def _batch_done(self, queue: BatchQueue, draws: DrawColumns, task: asyncio.Task[Any], report: BatchReport) -> None:
        self.running -= 1
        try:
            self._batch_results(queue, draws, task, report)
        finally:
            self._raise_refusal()

    def _batch_results(self, queue: BatchQueue, draws: DrawColumns, task: asyncio.Task[Any], report: BatchReport) -> None:
        exc = task.exception()
        failures, results = report.failures, report.results
        if exc is None:
            texts = task.result()
            if not failures and not results:  # the common case
                self._hand_over(queue, draws, texts, hit=False)
                return
            done = [i for i in range(len(draws)) if i not in failures]
            self._hand_over(queue, draws.take(done), [results.get(i, texts[i]) for i in done], hit=False)
            for index, error in failures.items():
                self._fail_draw(queue, draws, index, error)
            return
        if isinstance(exc, JobsRunning):  # no draw failed: the evaluation stops while its jobs run on
            self.schedule.fail(0, exc)
            return
        if not self.return_failures:
            self._fail_draw(queue, draws, 0, exc)
            return
        # What finished before the failure is kept; each reported failure is its own.
        done = [i for i in range(len(draws)) if i in results]
        self._hand_over(queue, draws.take(done), [results[i] for i in done], hit=False)
        for index in range(len(draws)):
            if index not in results:
                self._fail_draw(queue, draws, index, failures.get(index, exc))

    def _by_slot(self, queue: BatchQueue, draws: DrawColumns) -> list[tuple[SlotQueue, list[Any]]]:
        """The draws of a batch per slot queue, as that queue's prompts."""
        return [(queue.slot(slot), draws.prompts if positions is None else [draws.prompts[i] for i in positions])
                for slot, positions in draws.by_slot()]

    def _slot(self, queue: BatchQueue, draws: DrawColumns, index: int) -> SlotQueue:
        return queue.slot_of(draws.params[index], draws.numbers[index])

    def _hand_over(self, queue: BatchQueue, draws: DrawColumns, values: list[Any], *, hit: bool) -> None:
        """Give the Waits the values of these draws; finish the nodes they complete."""
        for slot, positions in draws.by_slot():
            if positions is None:
                prompts, given = draws.prompts, values
            else:
                prompts, given = [draws.prompts[i] for i in positions], [values[i] for i in positions]
            for wait in queue.slot(slot).waiters.hand_over(prompts, given, hit):
                self._finish(wait)

    def _fail_draw(self, queue: BatchQueue, draws: DrawColumns, index: int, exc: BaseException) -> None:
        waiters, prompt = self._slot(queue, draws, index).waiters, draws.prompts[index]
        if not self.return_failures:
            first = waiters.first(prompt)
            if first is None:
                self.schedule.fail(0, exc)
            else:
                self.schedule.fail(first.index, exc, self._label(first, prompt))
            return
        for wait in waiters.pop(prompt):
            failure = Failure.from_exception(self._label(wait, prompt), self.plan.nodes[wait.index].op.name, exc)
            wait.receive_one(waiters, prompt, failure, hit=False)
            if not wait.missing:
                self._finish(wait)

    def _label(self, wait: Wait, prompt: Any) -> str:
        """Who a draw's failure names: its node, or for a stacked node the call it stands for."""
        node = self.plan.nodes[wait.index]
        members = self.plan.members.get(id(node))
        if members is None:
            return node.label
        element, size = wait.element_of(prompt), len(wait.prompts)
        if wait.parent is not None:  # a part of a node: the element's place in the whole node
            element, size = wait.parent.position(wait, element), wait.parent.size
        per_member = max(1, size // len(members))  # elements per call
        return members[min(len(members) - 1, element // per_member)].label

    def _finish(self, wait: Wait, values: list[Any] | None = None) -> None:
        """A complete Wait: its node's value (``values``: all from the cache's memory), once all its parts are."""
        whole = wait.parent
        if whole is not None:
            whole.left -= 1
            if not whole.left:
                results = whole.results()
                self._finish_node(whole.index, whole.shape, results, whole.cache_hits(), len(whole.settled))
            return
        results = wait.results() if values is None else values
        hits = wait.cache_hits() if values is None else len(results)
        self._finish_node(wait.index, wait.shape, results, hits, len(wait.settled or ()))

    def _finish_node(self, index: int, shape: tuple[int, ...], results: list[Any], hits: int, settled: int) -> None:
        """Node ``index`` has ``results`` (element-major), ``hits`` of them from the cache."""
        count = len(results)
        # An element settled by its failed input was never looked up (as its own unstacked call is not).
        self.recorder.node_cache(self.plan.nodes[index], hits, count - hits - settled)
        if not shape:
            self.schedule.finish(index, results[0])
            return
        array = np.fromiter(results, dtype=object, count=count).reshape(shape)
        self.schedule.finish(index, array)


def _join(wait: Wait, slots: list[SlotQueue], prompts: list[Any], settled: dict[int, Any]) -> None:
    """``wait`` waits for the draws of its prompts (but the settled elements') in each of its slots."""
    active = [p for e, p in enumerate(prompts) if e not in settled] if settled else prompts
    if active:
        unique = dict.fromkeys(active)
        joined: set[int] = set()
        for slot in slots:  # a greedy call's draw numbers are all 0: one slot, joined once
            if id(slot) not in joined:
                slot.join(wait, unique if not joined else dict(unique))  # each slot keeps its own table
                joined.add(id(slot))
