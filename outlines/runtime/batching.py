"""Model calls inside a schedule: draws, per-backend queues, batches, the cache.

A ready ``Generate`` node turns into draws that join the ``BatchQueue`` of its
(backend, params less the constraint: ``queue_key``). Inside the batcher a draw
is a plain tuple ``(prompt, draw number, params number in its queue)``, which
hashes in C; ``Draw`` objects are made only for what a backend is sent, as a
column-wise ``DrawBatch``. After each dispatch round the scheduler flushes the
``Batcher``: queued draws are deduplicated (the queue's waiters, by that tuple),
looked up in the cache by slot and prompt (``Cache.get_draws``), split by the backend's
``max_batch`` at prompt boundaries (``prompt_batches``: the samples of one
prompt travel in one batch, so an HTTP backend sends them as one prompt with
``n``) and sent as batch tasks, at most
``max_concurrency`` per backend. A queue stays open for a short gathering
window while other nodes that feed it are still running; a full queue sends
its whole batches at once and keeps the remainder open. Each finished draw is
cached as soon as its backend reports it; constrained draws are checked first
and retried while they break their constraint (``constraints.generate_valid``).

Large prompt arrays (a Program's, or a stacked family of chains: ``Plan``)
take C-speed steps only: a node whose draws the cache's memory holds whole is
finished before it is queued (``Cache.peek_draws``); one that shares no draw
with the queue is a *segment* of it (its distinct draws and itself) instead of
one waiter entry per draw, and a batch that is exactly one segment is handed
back in one piece.

The scheduler and the ``Batcher`` talk through the callbacks given to the
constructor (``finish``, ``fail``, ``spawn``, ``wake``) and the methods
``start``, ``flush`` and ``close``. The pure helpers are shared with
``outlines.runtime.explain``.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from collections import deque
from itertools import repeat
from operator import is_, itemgetter
from typing import Any, Callable, Coroutine, Hashable, Iterable, Iterator, Protocol, Sequence, TypeVar

import numpy as np

from outlines.backends.base import Backend, BackendError, BatchReport, Draw, DrawBatch, GenerationParams
from outlines.backends.constraints import generate_valid
from outlines.cache.disk import FOREGROUND
from outlines.errors import Failure
from outlines.graph.basic import Apply
from outlines.runtime.plan import Plan
from outlines.runtime.session import Evaluation

__all__ = [
    "BatchQueue",
    "Batcher",
    "NodeDraws",
    "batch_sizes",
    "lookup",
    "pack_groups",
    "prompt_batches",
    "queue_key",
    "unique_draws",
]


T = TypeVar("T")


# -- pure helpers (explain uses them too) ------------------------------------------
def queue_key(backend: Backend, params: GenerationParams) -> tuple[Backend, GenerationParams]:
    """The ``BatchQueue`` a model call's draws join.

    Draws that differ only in their constraint share a queue, so a batch
    (issue 13): a local model masks each row under its own constraint in one
    forward pass, and each draw keeps its params (so its cache key).
    """
    return backend, (params if params.constraint is None else replace(params, constraint=None))


def unique_draws(draws: Iterable[Draw]) -> list[Draw]:
    """``draws`` without repeats, in first-seen order."""
    return list(dict.fromkeys(draws))


def batch_sizes(runs: Iterable[tuple[int, int]], max_batch: int | None) -> list[int]:
    """Sizes of the batches ``pack_groups`` makes of groups given as runs ``(group size, how many)``.

    The arithmetic twin of ``pack_groups`` for ``explain``, which knows how
    many draws each prompt has but not always the prompts.

    Examples
    --------
    >>> batch_sizes([(3, 200)], 128)
    [126, 126, 126, 126, 96]
    >>> batch_sizes([(1, 7)], 3), batch_sizes([(5, 1), (1, 1)], 2)
    ([3, 3, 1], [2, 2, 2])
    """
    sizes: list[int] = []
    current = 0
    for size, count in runs:
        if size <= 0 or count <= 0:
            continue
        if max_batch is None:
            current += size * count
            continue
        if size > max_batch:  # cut anyway: its pieces fill the current batch, then whole ones
            full, current = divmod(current + size * count, max_batch)
            sizes.extend([max_batch] * full)
            continue
        take = min((max_batch - current) // size, count)
        current += take * size
        count -= take
        if count:
            sizes.append(current)
            per_batch = max_batch // size
            full, left = divmod(count, per_batch)
            sizes.extend([per_batch * size] * full)
            current = left * size
            if not left:
                current = sizes.pop()
    if current:
        sizes.append(current)
    return sizes


def pack_groups(groups: Sequence[Sequence[T]], max_batch: int | None) -> list[list[T]]:
    """Batches of at most ``max_batch`` items that never split a group between two batches.

    Groups are packed in order, a batch closing when the next group does not
    fit. A group larger than ``max_batch`` is the one exception: it has to be
    cut anyway, so it fills the room left in the current batch, then whole
    batches, and its remainder starts the next one.

    Examples
    --------
    >>> pack_groups([[1, 1, 1], [2, 2, 2], [3, 3, 3]], 7)
    [[1, 1, 1, 2, 2, 2], [3, 3, 3]]
    >>> pack_groups([[1] * 5, [2]], 2)
    [[1, 1], [1, 1], [1, 2]]
    >>> pack_groups([[1] * 3, [2] * 3], 2)
    [[1, 1], [1, 2], [2, 2]]
    """
    batches: list[list[T]] = []
    current: list[T] = []
    for group in groups:
        if max_batch is not None and len(group) > max_batch:  # cut anyway: its pieces fill what is left
            rest = list(group)
            while rest:
                room = max_batch - len(current)
                current.extend(rest[:room])
                rest = rest[room:]
                if len(current) == max_batch:
                    batches.append(current)
                    current = []
            continue
        if current and max_batch is not None and len(current) + len(group) > max_batch:
            batches.append(current)
            current = []
        current.extend(group)
    if current:
        batches.append(current)
    return batches


def _prompt_and_params(draw: Draw) -> tuple[str, GenerationParams]:
    return draw.prompt, draw.params


def prompt_batches(
    draws: Sequence[T], max_batch: int | None, group: Callable[[T], Hashable] = _prompt_and_params  # type: ignore[assignment]
) -> list[list[T]]:
    """``draws`` split into batches of at most ``max_batch``, each prompt's draws together.

    Draws of one prompt (and params: ``group``) are its samples: a backend asks
    for them at once (``n`` on the wire, one encoded prompt in a local model),
    so splitting them would cost a request and a prompt more. A prompt with
    more samples than ``max_batch`` is the exception: it goes in pieces that
    fill the batches (``pack_groups``); the OpenAI backends offset the seed of
    each piece, so the pieces stay independent draws.
    """
    if max_batch is None or len(draws) <= max_batch:  # one batch: nothing to cut, order kept
        return [list(draws)] if draws else []
    groups: dict[Hashable, list[T]] = {}
    for draw in draws:
        groups.setdefault(group(draw), []).append(draw)
    return pack_groups(list(groups.values()), max_batch)


def _positions(keys: Sequence[DrawKey], max_batch: int | None) -> list[range] | list[list[int]]:
    """The positions of ``keys`` (a queue's draws) in each batch: ``prompt_batches`` of the draws they stand for."""
    count = len(keys)
    if max_batch is None or count <= max_batch:
        return [range(count)] if count else []
    if not set(map(type, keys)) - {str}:  # short keys: one draw per prompt, nothing to keep together
        return [range(start, min(start + max_batch, count)) for start in range(0, count, max_batch)]
    return prompt_batches(range(count), max_batch, lambda i: _prompt_of(keys[i]))


def lookup(
    cache: Any,
    backend: Backend,
    draws: Sequence[Draw],
    *,
    record: bool = True,
    identities: Sequence[Any] | None = None,
) -> dict[Draw, Any]:
    """The cached texts of ``draws`` (one ``get_draws`` per identity); ``record=False`` counts no hits.

    A backend that is not ``cacheable`` (its identity holds an object id) never
    reads the disk; a stored value that is not text is a miss. A fallback
    chain looks under each model's identity in turn (``identities``, default
    ``backend.cache_identities``).
    """
    if cache is None or not draws or not backend.cacheable:
        return {}
    out: dict[Draw, Any] = {}
    for identity in backend.cache_identities if identities is None else identities:
        rest = [d for d in draws if d not in out] if out else list(draws)
        if not rest:
            break
        values = cache.get_draws(identity, DrawBatch.of(rest), record=record)
        out.update((d, v) for d, v in zip(rest, values) if v is not None)
    return out


# -- state --------------------------------------------------------------------------
class NodeDraws:
    """The outstanding draws of one running Generate node.

    A node waits per element (``results[position]``, ``remaining`` counts
    positions) or, for a large prompt array, in bulk: ``keys`` holds the draw
    of each position, ``found`` the values of its distinct draws as they
    arrive, ``remaining`` counts distinct draws, and the results are read out
    of ``found`` in one pass at the end.
    """

    __slots__ = ("index", "shape", "results", "remaining", "hits", "keys", "found", "hit_keys", "first")

    def __init__(self, index: int, shape: tuple[int, ...], count: int) -> None:
        self.index = index
        self.shape = shape
        self.results: list[Any] = [None] * count
        self.remaining = count
        self.hits = 0
        self.keys: list[Any] | None = None
        self.found: dict[Any, Any] = {}
        self.hit_keys: set[Any] = set()
        self.first: dict[Any, int] | None = None  # bulk: the first position of each draw (built on a failure)

    def position_of(self, key: Any, position: int) -> int:
        """The element position of a draw: ``position``, or for a bulk wait the first one holding ``key``."""
        if position != BULK or self.keys is None:
            return max(position, 0)
        if self.first is None:
            self.first = {}
            for number, each in enumerate(self.keys):
                self.first.setdefault(each, number)
        return self.first.get(key, 0)


#: Prompt arrays of at least this many elements wait in bulk (see ``NodeDraws``).
BULK_MIN = 64
#: The position a bulk node waits at in a shared waiter list.
BULK = -1


_first, _second, _third = itemgetter(0), itemgetter(1), itemgetter(2)


def _pairs(entry: Any) -> list[tuple[NodeDraws, int]]:
    """The (node, position) pairs of a waiter entry: a list of them, or a bulk node alone."""
    if entry is None:
        return []
    if entry.__class__ is NodeDraws:
        return [(entry, BULK)]
    return entry  # type: ignore[no-any-return]


def _waiting_nodes(entry: Any) -> list[NodeDraws]:
    return [node for node, _ in _pairs(entry)]


#: A draw inside the batcher: ``(prompt, draw number, index of its params in
#: BatchQueue.params)``, or the prompt itself when it is a ``str`` and both numbers
#: are 0 (most draws: a string's hash is cached, a tuple's is not). A tuple key is
#: always the long form, so the two never collide.
DrawKey = Any


def _prompt_of(key: DrawKey) -> tuple[Any, int]:
    """The (prompt, params number) a draw key belongs to: what ``prompt_batches`` keeps together."""
    return (key[0], key[2]) if key.__class__ is tuple else (key, 0)


def _key(text: Any, number: int, params_id: int) -> DrawKey:
    if number == 0 and params_id == 0 and isinstance(text, str):  # np.str_ equals and hashes as its str
        return text
    return (text, number, params_id)
Waiters = list[tuple[NodeDraws, int]]


class BatchQueue:
    """Draws waiting to be sent to one backend with one set of params (constraints aside).

    ``pending`` holds the draws not sent yet, in arrival order; ``waiters``
    maps each draw in flight or pending to the (node, position) pairs that
    want its text; ``params`` numbers the params of the queue's draws
    (several only when constraints differ). A bulk node whose draws share
    nothing with the queue's is a *segment* (its distinct draws and itself)
    until something needs the map: then ``waiters`` writes the segments into
    it. A Program's model call over 100,000 inputs never does.
    """

    __slots__ = ("backend", "pending", "since", "unready", "_waiters", "segments", "params", "param_ids")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.pending: dict[Any, None] = {}  # never mutated when it is a segment's table (see own_pending)
        self.since = 0.0
        self.unready = 0  # Generate nodes of this queue not dispatched yet
        self._waiters: dict[DrawKey, Waiters | NodeDraws] = {}  # a bulk node alone: itself (see NodeDraws)
        self.segments: list[tuple[dict[DrawKey, None], NodeDraws]] = []
        self.params: list[GenerationParams] = []
        self.param_ids: dict[GenerationParams, int] = {}

    @property
    def waiters(self) -> dict[DrawKey, Waiters | NodeDraws]:
        """Draw -> who waits for it, the segments written in."""
        if self.segments:
            for table, node in self.segments:
                self._waiters.update(zip(table, repeat(node)))
            self.segments.clear()
        return self._waiters

    def disjoint(self, unique: dict[DrawKey, None]) -> bool:
        """Whether no draw of ``unique`` is queued or in flight already."""
        return self._waiters.keys().isdisjoint(unique) and all(t.keys().isdisjoint(unique) for t, _ in self.segments)

    def own_pending(self) -> dict[Any, None]:
        """``pending``, safe to add to (a copy when it is a segment's table)."""
        if self.segments and any(table is self.pending for table, _ in self.segments):
            self.pending = dict(self.pending)
        return self.pending

    def param_id(self, params: GenerationParams) -> int:
        """The number of ``params`` in this queue (added on first use)."""
        number = self.param_ids.get(params)
        if number is None:
            number = self.param_ids[params] = len(self.params)
            self.params.append(params)
        return number

    def batch(self, keys: Sequence[DrawKey]) -> DrawBatch:
        """The ``DrawBatch`` of ``keys``."""
        if not keys:
            return DrawBatch([], [], [])
        if not set(map(type, keys)) - {str}:  # all short keys: the prompts themselves
            return DrawBatch(list(keys), [self.params[0]] * len(keys), [0] * len(keys))
        long = [k if k.__class__ is tuple else (k, 0, 0) for k in keys]
        prompts = list(map(_first, long))
        numbers = list(map(_second, long))
        if len(self.params) == 1:
            params = [self.params[0]] * len(keys)
        else:
            params = [self.params[i] for i in map(_third, long)]
        return DrawBatch(prompts, params, numbers)

    @property
    def constrained(self) -> bool:
        """Whether any of the queue's draws carries a constraint (then texts are checked)."""
        return any(p.constraint is not None for p in self.params)


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


class Batcher:
    """Queues, waiters and cache lookups of one schedule's model calls.

    Parameters
    ----------
    plan
        The schedule's plan.
    evaluation
        The evaluation it belongs to: cache, executor, limits, budget,
        recorder, error mode, gathering window and draw namespace.
    schedule
        The schedule that owns this batcher: it is told when nodes finish or
        fail, runs the batches' tasks and is woken when a window closes.
    """

    def __init__(self, plan: Plan, evaluation: Evaluation, schedule: Schedule) -> None:
        self.plan = plan
        self.evaluation = evaluation
        self.schedule = schedule
        self.cache = evaluation.cache
        self.recorder = evaluation.recorder
        self.return_failures = evaluation.return_failures
        self.running = 0  # batches in flight
        self.sent = 0  # batches sent
        self.refused: tuple[int, BaseException] | None = None  # (node, error) raised once the running end
        self.queues: dict[tuple[Backend, Any], BatchQueue] = {}
        self.routes: dict[int, tuple[BatchQueue, int]] = {}  # id(Generate op) -> its queue, params number
        self.timer: asyncio.TimerHandle | None = None
        for node in plan.nodes:
            if node.op.mode == "generate":
                self._queue(node).unready += 1

    def queued_draws(self) -> int:
        """Draws waiting in the queues, not sent yet."""
        return sum(len(queue.pending) for queue in self.queues.values())

    @property
    def window_open(self) -> bool:
        """Whether a gathering window will wake the scheduler later."""
        return self.timer is not None

    def _queue(self, node: Apply) -> BatchQueue:
        return self._route(node.op)[0]

    def _route(self, op: Any) -> tuple[BatchQueue, int]:
        """The queue of a Generate op and its params' number there (looked up once per op)."""
        route = self.routes.get(id(op))
        if route is None:
            key = queue_key(op.backend, op.params)
            queue = self.queues.get(key)
            if queue is None:
                queue = self.queues[key] = BatchQueue(op.backend)
                self.evaluation.uses(op.backend)
            route = self.routes[id(op)] = (queue, queue.param_id(op.params))
        return route

    # -- draws in ------------------------------------------------------------------
    def start(self, index: int, node: Apply, prompt: Any, failed_input: bool) -> None:
        """Turn a ready Generate node into queued draws (``failed_input``: its prompt holds Failures)."""
        op: Any = node.op
        queue, params_id = self._route(op)
        queue.unready -= 1
        if isinstance(prompt, Failure):
            self.schedule.finish(index, prompt.skipped(node.label, op.name))
            return
        failed: list[Failure | None] = []
        if self.return_failures and isinstance(prompt, np.ndarray) and failed_input:
            failed = [x if isinstance(x, Failure) else None for x in prompt.reshape(-1)]
            prompt = np.where(np.vectorize(lambda x: isinstance(x, Failure), otypes=[bool])(prompt), "", prompt)
        shape, texts, numbers = op.columns(prompt, self.plan.draw_offsets.get(id(node), 0) + self.evaluation.draw_shift)
        outstanding = NodeDraws(index, shape, len(texts) * len(numbers))
        if not queue.pending:
            queue.since = time.perf_counter()
        if len(numbers) == 1 and not failed and len(texts) >= BULK_MIN:
            if self._cached_whole(op, texts, numbers[0], outstanding):
                return
            if numbers[0] == 0 and params_id == 0 and not set(map(type, texts)) - {str}:
                keys = texts  # short keys: the prompts themselves
            else:
                keys = [_key(text, numbers[0], params_id) for text in texts]
            unique = dict.fromkeys(keys)
            if queue.disjoint(unique):  # nothing shared with draws already queued: C-speed steps only
                outstanding.keys, outstanding.remaining = keys, len(unique)
                queue.segments.append((unique, outstanding))
                if queue.pending:
                    queue.own_pending().update(unique)
                else:  # its distinct draws, in order, are what the queue has to send: no second table
                    queue.pending = unique
                return
        waiters, pending = queue.waiters, queue.own_pending()
        entries: Iterable[tuple[int, DrawKey]]
        if len(numbers) == 1 and not failed:  # one draw per element
            number = numbers[0]
            entries = ((position, _key(text, number, params_id)) for position, text in enumerate(texts))
        else:
            entries = self._sampled(node, outstanding, texts, numbers, params_id, failed, self.plan.members.get(id(node)))
        for position, key in entries:
            waiting = waiters.get(key)
            if waiting is None:
                waiters[key] = [(outstanding, position)]
                pending[key] = None
            elif isinstance(waiting, list):
                waiting.append((outstanding, position))
            else:  # a bulk node's draw, now shared
                waiters[key] = [(waiting, BULK), (outstanding, position)]
        if outstanding.remaining == 0:
            self._finish_node(outstanding)

    def _cached_whole(self, op: Any, texts: list[Any], number: int, outstanding: NodeDraws) -> bool:
        """Finish a bulk node from the cache's memory when it holds every one of its draws."""
        backend = op.backend
        if self.cache is None or not backend.cacheable:
            return False
        draws = DrawBatch(texts, [op.params] * len(texts), [number] * len(texts))
        values = self.cache.peek_draws(backend.cache_identities[0], draws)
        if values is None:
            return False
        outstanding.results, outstanding.remaining, outstanding.hits = values, 0, len(values)
        self._finish_node(outstanding)
        return True

    @staticmethod
    def _sampled(
        node: Apply, outstanding: NodeDraws, texts: list[Any], numbers: list[int], params_id: int,
        failed: list[Failure | None], members: list[Apply] | None = None,
    ) -> Iterator[tuple[int, DrawKey]]:
        """(position, key) of each draw to wait for, element-major; a failed input's positions are settled here."""
        op: Any = node.op
        position = 0
        for element, text in enumerate(texts):
            upstream = failed[element] if failed else None
            for number in numbers:
                if upstream is not None:
                    label = members[element].label if members else node.label  # a stacked node: its call
                    outstanding.results[position] = upstream.skipped(label, op.name)
                    outstanding.remaining -= 1
                else:
                    yield position, _key(text, number, params_id)
                position += 1

    # -- batches out ---------------------------------------------------------------
    def flush(self, others_running: bool) -> None:
        """Send what is queued, unless a queue may still fill while ``others_running``."""
        now = time.perf_counter()
        wait_until = None
        for queue in self.queues.values():
            if not queue.pending:
                continue
            full = queue.backend.max_batch is not None and len(queue.pending) >= queue.backend.max_batch
            deadline = queue.since + self.evaluation.options.batch_window
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
        self.schedule.wake()

    def close(self) -> None:
        """Stop the window timer (the evaluation closes the backends, at its end)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _send(self, queue: BatchQueue, whole_batches: bool = False) -> None:
        backend = queue.backend
        sent = queue.pending
        keys = list(sent)
        queue.pending = {}  # a new table: the old one may be a segment's
        if whole_batches:
            batches = _positions(keys, backend.max_batch)
            if len(batches[-1]) < (backend.max_batch or 0):  # the remainder may still fill up
                queue.pending.update(dict.fromkeys(keys[i] for i in batches.pop()))
            keys = [keys[i] for batch in batches for i in batch]
        draws = queue.batch(keys)
        cached = self.cache is not None and backend.cacheable
        if cached:  # a fallback chain's first lookup is its primary's own entries (cache_identities[0])
            # Short keys are the prompts: the sent table holds them all (a superset with whole_batches).
            members = sent.keys() if draws.numbers.count(0) == len(draws) and len(queue.params) == 1 else None
            values = self.cache.get_draws(backend.cache_identities[0], draws, record=True, members=members)
            misses = values.count(None)
            if not misses:  # all cached
                self._resolve_many(queue, keys, values, hit=True)
                keys, draws = [], queue.batch([])
            elif misses < len(values):
                hits = [i for i, v in enumerate(values) if v is not None]
                self._resolve_many(queue, [keys[i] for i in hits], [values[i] for i in hits], hit=True)
                keys = [k for k, v in zip(keys, values) if v is None]
                draws = queue.batch(keys)
        if cached and keys and len(backend.cache_identities) > 1:  # a fallback chain: its other models' entries
            others = lookup(self.cache, backend, list(draws), identities=backend.cache_identities[1:])
            if others:
                rest = [i for i, d in enumerate(draws) if d not in others]
                self._resolve_many(queue, [keys[i] for i, d in enumerate(draws) if d in others],
                                   [others[d] for d in draws if d in others], hit=True)
                keys = [keys[i] for i in rest]
                draws = queue.batch(keys)
        batches = _positions(keys, backend.max_batch)
        for positions in batches:
            if len(batches) == 1:
                batch_keys, batch = keys, draws
            elif isinstance(positions, range):
                first, last = positions.start, positions.stop
                batch_keys, batch = keys[first:last], draws[first:last]
            else:
                batch_keys = [keys[i] for i in positions]
                batch = queue.batch(batch_keys)
            ticket = self._admit(queue, batch_keys, batch) if self.evaluation.budget is not None else None
            if ticket != -1:
                self._start_batch(queue, batch_keys, batch, cached, ticket)

    def _admit(self, queue: BatchQueue, keys: list[DrawKey], draws: DrawBatch) -> int:
        """The budget's ticket for sending ``draws``, or -1: refused (their draws fail)."""
        budget = self.evaluation.budget
        assert budget is not None
        waiting = _waiting_nodes(queue.waiters.get(keys[0]))
        node = waiting[0].index if waiting else 0
        try:
            return budget.admit(queue.backend, draws, self.plan.nodes[node].label)
        except Exception as exc:  # noqa: BLE001 - the refused draws fail with it
            if self.return_failures:
                for key in keys:
                    self._fail_draw(queue, key, exc)
            elif self.refused is None:
                self.refused = (node, exc)
                self._raise_refusal()
            return -1

    def _raise_refusal(self) -> None:
        """Fail the evaluation for the refused batch once no batch is in flight (theirs get cached first)."""
        if self.refused is not None and self.running == 0:
            self.schedule.fail(*self.refused)

    def _start_batch(
        self, queue: BatchQueue, keys: list[DrawKey], draws: DrawBatch, cached: bool, ticket: int | None = None
    ) -> None:
        """Send one batch; ``cached``: its texts are stored in the cache."""
        self.running += 1
        self.sent += 1
        batch_id = self.evaluation.batch_id()
        backend = queue.backend

        def on_result(index: int, text: str) -> None:
            if cached and 0 <= index < len(draws):
                answered = report.answered_by.get(index)  # a fallback's draw: under the model that answered
                identity = backend.cache_identities[0] if answered is None else answered.identity
                self.cache.put_draws(identity, draws[index : index + 1], [text])

        def on_failure(index: int, error: BaseException) -> None:
            if not self.return_failures and 0 <= index < len(keys):
                self._fail_draw(queue, keys[index], error)

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
            self._run_batch(batch_id, queue, keys, draws, cached, report, ticket),
            lambda task: self._batch_done(queue, keys, task, report),
        )

    async def _run_batch(
        self, batch_id: int, queue: BatchQueue, draw_keys: list[DrawKey], draws: DrawBatch, cached: bool,
        report: BatchReport, ticket: int | None = None,
    ) -> list[str]:
        backend = queue.backend
        limit = self.evaluation.limit_for(backend)
        # A backend that sends its own requests takes one of the evaluation's permits per request.
        whole = self.evaluation.request_limit if not backend.sends_requests else None
        if limit is not None:
            await limit.acquire()
        if whole is not None:
            await whole.acquire()
        nodes: list[str] = []
        if self.evaluation.listening:  # a waiter lookup per draw: only when someone listens
            indices = {d.index for key in draw_keys for d in _waiting_nodes(queue.waiters.get(key))}
            nodes = sorted(self.plan.nodes[i].label for i in indices)
        self.recorder.batch_started(batch_id, backend, nodes, len(draws), time.perf_counter())
        error: BaseException | None = None
        worker = None
        try:
            # Constrained draws are checked, and retried while they break their constraint.
            if queue.constrained:
                texts, worker = await generate_valid(self.evaluation.executor.generate, backend, draws, report)
            else:
                texts, worker = await self.evaluation.executor.generate(backend, draws, report)
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
                            self.cache.put_draws(identity, queue.batch([draw_keys[i] for i in rest]), [texts[i] for i in rest])
            return texts
        except BaseException as exc:
            error = exc
            raise
        finally:
            usage = (report.tokens[0], report.tokens[1])
            if ticket is not None and self.evaluation.budget is not None:
                self.evaluation.budget.settle(ticket, backend, usage, failed=error is not None)
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

    # -- results back -------------------------------------------------------------
    def _batch_done(self, queue: BatchQueue, keys: list[DrawKey], task: asyncio.Task[Any], report: BatchReport) -> None:
        self.running -= 1
        try:
            self._batch_results(queue, keys, task, report)
        finally:
            self._raise_refusal()

    def _batch_results(
        self, queue: BatchQueue, keys: list[DrawKey], task: asyncio.Task[Any], report: BatchReport
    ) -> None:
        exc = task.exception()
        if exc is None:
            texts = task.result()
            failures, results = report.failures, report.results
            if not failures and not results:  # the common case
                self._resolve_many(queue, keys, texts, hit=False)
                return
            for index, key in enumerate(keys):
                if index in failures:
                    self._fail_draw(queue, key, failures[index])
                else:
                    self._resolve(queue, key, results.get(index, texts[index]), hit=False)
            return
        if not self.return_failures:
            self._fail_draw(queue, keys[0], exc)
            return
        # What finished before the failure is kept; each reported failure is its own.
        for index, key in enumerate(keys):
            if index in report.results:
                self._resolve(queue, key, report.results[index], hit=False)
            else:
                self._fail_draw(queue, key, report.failures.get(index, exc))

    def _fail_draw(self, queue: BatchQueue, key: DrawKey, exc: BaseException) -> None:
        if not self.return_failures:
            pairs = _pairs(queue.waiters.get(key))
            if not pairs:
                self.schedule.fail(0, exc)
                return
            outstanding, position = pairs[0]
            self.schedule.fail(outstanding.index, exc, self._label(outstanding, position, key))
            return
        for outstanding, position in _pairs(queue.waiters.pop(key, None)):
            node = self.plan.nodes[outstanding.index]
            label = self._label(outstanding, position, key)
            self._resolve_one(outstanding, position, key, Failure.from_exception(label, node.op.name, exc))

    def _label(self, outstanding: NodeDraws, position: int, key: DrawKey) -> str:
        """Who a draw's failure names: its node, or for a stacked node the call it stands for."""
        node = self.plan.nodes[outstanding.index]
        members = self.plan.members.get(id(node))
        if members is None:
            return node.label
        numbers = max(1, len(outstanding.results) // max(1, len(members)))  # positions per element
        return members[min(len(members) - 1, outstanding.position_of(key, position) // numbers)].label

    def _resolve(self, queue: BatchQueue, key: DrawKey, value: Any, *, hit: bool) -> None:
        for outstanding, position in _pairs(queue.waiters.pop(key, None)):
            if hit:
                outstanding.hits += 1
                if position == BULK:
                    outstanding.hit_keys.add(key)
            self._resolve_one(outstanding, position, key, value)

    def _resolve_many(self, queue: BatchQueue, keys: list[DrawKey], values: list[Any], *, hit: bool) -> None:
        """Resolve distinct draws; a batch that only one bulk node waits for is handed over in C-speed steps."""
        if not keys:
            return
        segments = queue.segments
        if len(segments) == 1 and not queue._waiters and len(segments[0][0]) == len(keys) and list(segments[0][0]) == keys:
            # The batch is one segment's draws, in order: nothing else waits for them.
            self._finish_bulk(segments.pop()[1], keys, values, hit)
            return
        waiters = queue.waiters
        owner = waiters.get(keys[0])
        if owner.__class__ is NodeDraws and all(map(is_, map(waiters.get, keys), repeat(owner))):
            bulk: NodeDraws = owner  # type: ignore[assignment]
            if len(waiters) == len(keys):  # each entry is one of these keys (checked above)
                waiters.clear()
            else:
                deque(map(waiters.pop, keys), maxlen=0)
            self._finish_bulk(bulk, keys, values, hit)
            return
        for key, value in zip(keys, values):
            self._resolve(queue, key, value, hit=hit)

    def _finish_bulk(self, bulk: NodeDraws, keys: list[DrawKey], values: list[Any], hit: bool) -> None:
        """Hand a bulk node the values of some of its distinct draws (no one else waits for them)."""
        if bulk.remaining == len(keys) and not bulk.found and keys == bulk.keys:
            # One batch holds every draw of the node, in its order, without repeats: the values are its results.
            bulk.results, bulk.keys, bulk.remaining = list(values), None, 0
            bulk.hits = len(keys) if hit else 0
            self._finish_node(bulk)
            return
        bulk.found.update(zip(keys, values))
        if hit:
            bulk.hit_keys.update(keys)
        bulk.remaining -= len(keys)
        if bulk.remaining == 0:
            self._finish_node(bulk)

    def _resolve_one(self, outstanding: NodeDraws, position: int, key: DrawKey, value: Any) -> None:
        if position == BULK:
            outstanding.found[key] = value
        else:
            outstanding.results[position] = value
        outstanding.remaining -= 1
        if outstanding.remaining == 0:
            self._finish_node(outstanding)

    def _finish_node(self, outstanding: NodeDraws) -> None:
        node = self.plan.nodes[outstanding.index]
        count = len(outstanding.results)
        hits = outstanding.hits
        if outstanding.keys is not None:  # bulk: one pass over the positions; hits count positions too
            outstanding.results = list(map(outstanding.found.__getitem__, outstanding.keys))
            hit_keys = outstanding.hit_keys
            if not hit_keys:
                hits = 0
            elif len(hit_keys) == len(outstanding.found):
                hits = count
            else:
                hits = sum(map(hit_keys.__contains__, outstanding.keys))
        self.recorder.node_cache(node, hits, count - hits)
        if not outstanding.shape:
            self.schedule.finish(outstanding.index, outstanding.results[0])
            return
        array = np.fromiter(outstanding.results, dtype=object, count=count).reshape(outstanding.shape)
        self.schedule.finish(outstanding.index, array)
