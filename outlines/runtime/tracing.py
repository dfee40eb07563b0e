"""The ``Trace``: what evaluations did, recorded from their events.

``outlines.trace()`` installs a ``Trace`` in a context variable; every
evaluation started inside the block (sync, async, or on the helper thread of a
sync eval inside a running loop) adds its own listener (``Trace.for_eval``) to
its recorder (``outlines.runtime.events``): node start/end, batches sent to
backends, wire requests, cache hits and token usage. Times are seconds from the
start of the trace. A trace holds labels, reprs and numbers only: no values, no
prompts, no secrets. ``outlines.tracing`` is this module's public name.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterator, Sequence

from outlines.backends.usage import Price, reported
from outlines.graph.basic import Apply
from outlines.graph.protocols import model_call
from outlines.graph.traits import Run
from outlines.common.labels import apart, label_of
from outlines.runtime.events import NULL, Listener, Recorder

__all__ = [
    "BatchRecord",
    "IterationRecord",
    "ModelLoadRecord",
    "NodeRecord",
    "Recorder",
    "RequestRecord",
    "Trace",
    "active_recorder",
    "trace",
]


_active: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("outlines_trace", default=None)


def active_recorder() -> Recorder:
    """What an evaluation starting now reports to for the active ``trace()`` (``NULL`` outside one)."""
    trace = _active.get()
    return trace.for_eval() if trace is not None else NULL


def _first_line(error: Any) -> str | None:
    """``Type: first line of the message`` of an exception, or of a ``Failure``."""
    if error is None:
        return None
    kind, message = getattr(error, "error_type", None), getattr(error, "message", None)
    if kind is None or message is None:  # an exception rather than an outlines.Failure
        kind, message = type(error).__name__, str(error)
    lines = str(message).strip().splitlines()
    return f"{kind}: {lines[0]}" if lines else str(kind)


@dataclass(slots=True)
class NodeRecord:
    """What one node did in its latest evaluation, every run of it counted.

    A node runs once per evaluation, except in a loop body (once per
    iteration) and in a ``Program.stream`` (once per chunk): each run adds a
    span, and times, batches, cache hits and failures add up over the runs.
    """

    label: str
    op: str
    kind: str  # "input", "generate", "python" or "inline"
    backend: str | None = None
    start: float | None = None
    end: float | None = None
    batch_ids: list[int] = field(default_factory=list)
    cache_hits: int = 0
    cache_misses: int = 0
    error: str | None = None
    #: Elements that hold an ``outlines.Failure`` raised here (``errors="return"``).
    failures: int = 0
    #: Elements not computed because an input element had failed upstream.
    skipped: int = 0
    #: Seconds spent computing: for a model call, the union of its batches'
    #: intervals; ``None`` (unknown) means the whole duration.
    computing: float | None = None
    #: What the node computes from what (``drawing.structure_keys``): lets a
    #: picture of another build of the same graph find this record.
    structure: str | None = None
    #: ``(start, end)`` of each run (``end`` ``None`` while it runs); ``start``/``end`` span them all.
    spans: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def runs(self) -> int:
        """How many times the node ran (a loop body's node: once per iteration)."""
        return len(self.spans) or (1 if self.start is not None else 0)

    @property
    def intervals(self) -> list[tuple[float, float]]:
        """The finished runs as ``(start, end)`` (one interval for a record built without spans)."""
        if self.spans:
            return [(start, end) for start, end in self.spans if end is not None]
        return [(self.start, self.end)] if self.start is not None and self.end is not None else []

    @property
    def duration(self) -> float:
        """Seconds from ready (all inputs there) to finished, queueing included, over every run (overlaps once)."""
        return _union(self.intervals)

    @property
    def compute(self) -> float:
        """Seconds computing (see ``computing``)."""
        return self.duration if self.computing is None else min(self.computing, self.duration)

    @property
    def queued(self) -> float:
        """Seconds waiting for its batch to go out or for a request permit (``duration - compute``)."""
        return max(self.duration - self.compute, 0.0)

    @property
    def failed(self) -> int:
        """Failed elements (a whole-node error counts once)."""
        return self.failures or (1 if self.error else 0)


@dataclass(slots=True)
class BatchRecord:
    """One backend call: its size, when it ran, for which nodes, and its tokens."""

    id: int
    backend: str
    size: int
    start: float
    end: float | None = None
    nodes: list[str] = field(default_factory=list)
    worker: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Of the prompt tokens: read from a prompt cache (OpenAI's ``cached_tokens``,
    #: Anthropic's cache reads, a local model's shared prefill) and written to one.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    error: str | None = None
    #: Wire requests the backend reported (``BatchReport.request``); 0: not reported.
    requests: int = 0
    #: A fallback chain's batch: draws answered per model (``repr``); empty otherwise.
    answered_by: dict[str, int] = field(default_factory=dict)
    #: Job mode: the provider's ids of the jobs that answered it (its tokens cost the jobs' price).
    jobs: list[str] = field(default_factory=list)


@dataclass(slots=True)
class JobTraceRecord:
    """One provider batch job as a trace saw it: its id, sizes, state and waits.

    ``requests`` are its lines, ``draws`` the draws they answer, ``bytes`` its
    upload (0 for a job resumed from an earlier process), ``waited`` seconds
    from its creation to its last status read, ``resumed`` whether this run
    found it in the ledger instead of creating it.
    """

    id: str
    provider: str
    backend: str
    batch: int
    requests: int = 0
    draws: int = 0
    bytes: int = 0
    state: str = ""
    succeeded: int = 0
    failed: int = 0
    polls: int = 0
    waited: float = 0.0
    resumed: bool = False


@dataclass(slots=True)
class IterationRecord:
    """One iteration of a loop: how many elements were active, batches sent, when.

    ``batches`` counts every backend call the body made, those of a ``cond``
    or a nested loop inside it included.
    """

    loop: str
    iteration: int
    active: int
    batches: int
    start: float
    end: float


@dataclass(slots=True)
class RequestRecord:
    """One wire request of a batch (``batch`` is the BatchRecord's id)."""

    batch: int
    start: float
    end: float
    error: str | None = None
    #: The model asked (its repr): the batch's backend, or the member of a fallback chain.
    model: str | None = None


@dataclass(slots=True)
class ModelLoadRecord:
    """A local model load, apart from the batch that triggered it."""

    backend: str
    start: float
    end: float


class ErrorList(list[str]):
    """``Trace.errors``: a list of lines that is also callable (``t.errors()``), like ``summary()``."""

    def __call__(self) -> list[str]:
        return list(self)


@dataclass
class _Eval:
    start: float
    end: float | None = None
    labels: list[str] = field(default_factory=list)
    parents: list[list[int]] = field(default_factory=list)
    critical_path: float = 0.0
    critical_nodes: list[str] = field(default_factory=list)
    error: str | None = None


class Trace:
    """Per-node timings, batches, requests, cache hits, tokens and errors.

    Attributes
    ----------
    nodes
        ``label -> NodeRecord``, in the order nodes started.
    batches
        One ``BatchRecord`` per backend call, numbered across the trace.
    requests_per_backend
        ``repr(backend) -> number of backend calls`` (batches).
    http_requests_per_backend
        ``repr(backend) -> wire requests``, for backends that report them
        (one chat call is one request per prompt; retries count too).
    cache_hits, cache_misses
        Draws served from the cache / sent, summed over every evaluation.
    requests
        One ``RequestRecord`` per wire request a backend reported.
    model_loads
        One ``ModelLoadRecord`` per local model load.
    iterations
        One ``IterationRecord`` per iteration of every loop.
    loops_limited
        ``loop label -> {"stopped", "elements", "max_iter"}``: the elements
        of a loop that ran out of iterations (``max_iter``) with ``cond``
        not yet false, of how many (summed over evaluations).
    branches
        ``cond label -> counts`` of each ``cascade`` stage (``cascades()``).

    Notes
    -----
    ``summary()`` and ``errors()`` are both methods. ``errors`` also still reads
    as a list without the call (``t.errors == []``), as it did when it was a
    property.
    """

    def __init__(self) -> None:
        self.origin = time.perf_counter()
        self.nodes: dict[str, NodeRecord] = {}
        self.batches: list[BatchRecord] = []
        self.requests: list[RequestRecord] = []
        self.model_loads: list[ModelLoadRecord] = []
        self.requests_per_backend: dict[str, int] = {}
        self.cache_hits = 0
        self.cache_misses = 0
        self.evals: list[_Eval] = []
        self.iterations: list[IterationRecord] = []
        self.loops_limited: dict[str, dict[str, int]] = {}
        #: ``cond label -> counts`` of the counted conds (``cascade`` stages), summed over evaluations.
        self.branches: dict[str, dict[str, Any]] = {}
        self.jobs: list[JobTraceRecord] = []
        self.closed_at: float | None = None
        #: Wall-clock nanoseconds at ``origin`` (for exporters: ``outlines.otel``).
        self.origin_ns = time.time_ns()
        #: ``repr(backend) -> (model name, its own price or None)``, for ``cost``.
        self.models: dict[str, tuple[str, Any]] = {}
        #: ``repr(backend) -> the label it gives itself`` (``outlines.common.labels.label_of``), for pictures.
        self.labels: dict[str, str] = {}

    def for_eval(self) -> Recorder:
        """The listener one evaluation reports to (each evaluation has its own)."""
        return _EvalRecorder(self)

    def _time(self, t: float) -> float:
        return t - self.origin

    # -- derived figures ------------------------------------------------------------
    @property
    def wall(self) -> float:
        """Seconds during which at least one evaluation was running."""
        return sum(end - start for start, end, _ in self._clusters())

    @property
    def critical_path(self) -> float:
        """Seconds of the longest chain of dependent nodes (summed over sequential evals)."""
        return sum(longest.critical_path for _, _, longest in self._clusters())

    @property
    def critical_path_nodes(self) -> list[str]:
        """Labels along that chain, in order."""
        return [label for _, _, longest in self._clusters() for label in longest.critical_nodes]

    def _clusters(self) -> list[tuple[float, float, _Eval]]:
        """Overlapping evals merged: (start, end, the eval with the longest critical path)."""
        now = self._time(self.closed_at or time.perf_counter())
        merged: list[tuple[float, float, _Eval]] = []
        for record in sorted(self.evals, key=lambda e: e.start):
            end = record.end if record.end is not None else now
            if merged and record.start < merged[-1][1]:
                start, last, longest = merged[-1]
                longest = longest if longest.critical_path >= record.critical_path else record
                merged[-1] = (start, max(last, end), longest)
            else:
                merged.append((record.start, end, record))
        return merged

    @property
    def http_requests_per_backend(self) -> dict[str, int]:
        timed: dict[int, int] = {}
        for request in self.requests:
            timed[request.batch] = timed.get(request.batch, 0) + 1
        counts: dict[str, int] = {}
        for batch in self.batches:
            sent = max(batch.requests, timed.get(batch.id, 0))
            if sent:
                counts[batch.backend] = counts.get(batch.backend, 0) + sent
        return counts

    @property
    def tokens(self) -> tuple[int, int]:
        """(prompt tokens, completion tokens) reported by backends."""
        return (sum(b.prompt_tokens for b in self.batches), sum(b.completion_tokens for b in self.batches))

    @property
    def tokens_per_backend(self) -> dict[str, tuple[int, int]]:
        """``repr(backend) -> (prompt tokens, completion tokens)`` as reported."""
        return self._per_backend("prompt_tokens", "completion_tokens")

    @property
    def cached_tokens(self) -> tuple[int, int]:
        """(prompt tokens read from a prompt cache, prompt tokens written to one) reported by backends."""
        return (sum(b.cached_tokens for b in self.batches), sum(b.cache_write_tokens for b in self.batches))

    @property
    def cached_tokens_per_backend(self) -> dict[str, tuple[int, int]]:
        """``repr(backend) -> (cached, cache-write prompt tokens)`` as reported."""
        return self._per_backend("cached_tokens", "cache_write_tokens")

    def _per_backend(self, first: str, second: str) -> dict[str, tuple[int, int]]:
        """Two counts of the batches (``BatchRecord`` fields), summed per backend."""
        out: dict[str, tuple[int, int]] = {}
        for b in self.batches:
            a, c = out.get(b.backend, (0, 0))
            out[b.backend] = (a + getattr(b, first), c + getattr(b, second))
        return out

    def cost_per_backend(self, prices: Any = None) -> dict[str, float | None]:
        """``repr(backend) -> money`` spent, from reported usage: the model's ``price``, else ``prices[model name]``.

        ``None`` for a backend without a price, or that reported no usage
        (a ``from_function`` model): its cost is unknown, not zero. Cached
        prompt tokens cost the price's ``cached_input``, tokens written to a
        prompt cache its ``cache_write`` (each ``input`` when unset). Summed
        exactly, rounded up to a micro-unit (``outlines.backends.usage.reported``).
        """
        return {name: None if money is None else reported(money) for name, money in self._money(prices).items()}

    def cascades(self) -> list[dict[str, Any]]:
        """What each stage of the ``outlines.cascade``s traced did, summed over evaluations, in stage order.

        Returns
        -------
        list of dict
            One per stage: ``stage`` (its index), ``model``, ``backend``
            (its key in ``cost_per_backend``), ``reached``
            (elements that reached it), ``accepted`` (kept its answer:
            ``accept`` held), ``escalated`` (went on to the next stage),
            ``answered`` (answers of the last stage that ``accept`` did
            not hold for: the last model answers anyway), ``kept: budget``
            (the budget could not pay this stage: they kept an earlier
            answer), ``failed`` (no stage answered them).
        """
        return [dict(counts) for counts in self.branches.values()]

    def cost(self, prices: Any = None) -> float | None:
        """Money spent, from the usage backends reported (``None`` when a backend has no price)."""
        money = list(self._money(prices).values())
        return None if None in money else reported(sum((m for m in money if m is not None), Fraction(0)))

    def _money(self, prices: Any) -> dict[str, Fraction | None]:
        """``repr(backend) -> exact money`` spent (``Price.money``); see ``cost_per_backend``."""
        out: dict[str, Fraction | None] = {}
        for name, (prompt, completion) in self.tokens_per_backend.items():
            model, own = self.models.get(name, (name, None))
            price = own if own is not None else (prices or {}).get(model, (prices or {}).get(name))
            if price is None or not (prompt or completion):
                out[name] = None
                continue
            # Cached prompt tokens at the cached-input price, batches answered by provider jobs at
            # the jobs' price (``Price.job_discount``). Money is linear in the tokens of each kind:
            # they are added up per price (live, jobs) first, then priced once.
            price = Price.of(price)
            tokens = {False: [0, 0, 0, 0], True: [0, 0, 0, 0]}  # in jobs? -> plain, cached, written, completion
            for b in self.batches:
                if b.backend == name:
                    counts = tokens[bool(b.jobs)]
                    counts[0] += max(b.prompt_tokens - b.cached_tokens - b.cache_write_tokens, 0)
                    counts[1] += b.cached_tokens
                    counts[2] += b.cache_write_tokens
                    counts[3] += b.completion_tokens
            out[name] = sum((price.money(sum(c[:3]), c[3], cached_tokens=c[1], cache_write_tokens=c[2], jobs=jobs)
                             for jobs, c in tokens.items()), Fraction(0))
        return out

    @property
    def errors(self) -> ErrorList:
        """One line per failed node (with its count of failed elements) and per failed batch.

        With ``errors="return"`` a node whose elements hold ``outlines.Failure``
        values is listed even though the evaluation itself succeeded. Call it
        (``t.errors()``) or read it as a list (``t.errors``): both work.
        """
        lines = ErrorList()
        for n in self.nodes.values():
            if n.failures:
                first = f": first {n.error}" if n.error else ""
                lines.append(f"{n.label}: {n.failures} failed element(s){first}")
            elif n.error:
                lines.append(f"{n.label}: {n.error}")
        lines.extend(f"batch {b.id} ({b.backend}): {b.error}" for b in self.batches if b.error)
        return lines

    @property
    def failures(self) -> int:
        """Failed elements (or nodes) summed over the trace; upstream skips not counted."""
        return sum(n.failed for n in self.nodes.values())

    # -- output ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything as JSON-able data (the format of ``to_json``)."""
        prompt_tokens, completion_tokens = self.tokens
        return {
            "wall": self.wall,
            "critical_path": self.critical_path,
            "critical_path_nodes": self.critical_path_nodes,
            "requests_per_backend": dict(self.requests_per_backend),
            "http_requests_per_backend": self.http_requests_per_backend,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": self.cached_tokens[0],
            "cache_write_tokens": self.cached_tokens[1],
            "cost": self.cost(),
            "errors": list(self.errors),
            "nodes": [dict(asdict(n), queued=n.queued) for n in self.nodes.values()],
            "batches": [asdict(b) for b in self.batches],
            "iterations": [asdict(i) for i in self.iterations],
            "loops_limited": {loop: dict(counts) for loop, counts in self.loops_limited.items()},
            "cascades": self.cascades(),
            "jobs": [asdict(j) for j in self.jobs],
            "requests": [asdict(r) for r in self.requests],
            "model_loads": [asdict(m) for m in self.model_loads],
        }

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write ``to_dict()`` as JSON to ``path``."""
        with open(path, "w", encoding="utf-8") as file:
            json.dump(self.to_dict(), file, indent=1)

    def timeline(self, path: str | os.PathLike[str]) -> Any:
        """Write a self-contained HTML Gantt chart of what ran when."""
        from outlines.graph.viz.timeline import write_timeline

        return write_timeline(self, path)

    def summary(self, prices: Any = None) -> str:
        """A readable text table of the trace; ``prices``: model name -> (input, output) per 1M tokens."""
        lines = [f"outlines trace: {len(self.evals)} evaluation(s), {len(self.nodes)} node(s)"]
        kinds: dict[str, list[NodeRecord]] = {}
        for record in self.nodes.values():
            kinds.setdefault(record.kind, []).append(record)
        lines.append(f"  {'nodes':<12}{'count':>8}{'busy s':>10}{'compute s':>11}{'queued s':>10}{'errors':>8}")
        lines[-1] += f"{'runs':>7}"
        for kind in ("input", "inline", "python", "generate"):
            group = kinds.get(kind, [])
            if group:
                busy = _union(span for r in group for span in r.intervals)
                compute = self._compute_union(group)
                queued = sum(r.queued for r in group)
                failed = sum(r.failed for r in group)
                runs = sum(r.runs for r in group)
                lines.append(f"  {kind:<12}{len(group):>8}{busy:>10.3f}{compute:>11.3f}{queued:>10.3f}{failed:>8}{runs:>7}")
        lines.append("  (busy: time any node of the kind was running; compute: time a batch or call was")
        lines.append("   running; queued: summed per node, waiting to be sent; runs: a loop body's")
        lines.append("   nodes run once per iteration, every iteration counted)")
        names = self.backend_names()
        if self.model_loads:
            for load in self.model_loads:
                lines.append(f"  model load {names.get(load.backend, load.backend)}: {load.end - load.start:.3f} s")
        if self.batches:
            wire = self.http_requests_per_backend
            width = max([40] + [len(names.get(b, b)) + 2 for b in self.requests_per_backend])
            lines.append(f"  {'backend':<{width}}{'batches':>8}{'requests':>9}{'draws':>8}{'min/mean/max size':>19}")
            for backend, count in sorted(self.requests_per_backend.items(), key=lambda item: names.get(item[0], item[0])):
                sizes = [b.size for b in self.batches if b.backend == backend]
                spread = f"{min(sizes)}/{sum(sizes) / len(sizes):.1f}/{max(sizes)}"
                http = str(wire[backend]) if backend in wire else "-"
                lines.append(f"  {names.get(backend, backend):<{width}}{count:>8}{http:>9}{sum(sizes):>8}{spread:>19}")
        answered: dict[str, int] = {}
        for batch in self.batches:
            for model, count in batch.answered_by.items():
                answered[model] = answered.get(model, 0) + count
        if answered:
            lines.append("  fallback chains answered: " + ", ".join(f"{m} {n}" for m, n in answered.items()))
        loops: dict[str, list[IterationRecord]] = {}
        for iteration in self.iterations:
            loops.setdefault(iteration.loop, []).append(iteration)
        for loop, records in loops.items():
            active = " ".join(str(r.active) for r in records[:8]) + (" ..." if len(records) > 8 else "")
            lines.append(f"  {loop}: {len(records)} iteration(s), active elements {active}")
        for loop, counts in self.loops_limited.items():
            lines.append(f"  {loop}: {counts['stopped']} of {counts['elements']} stopped at "
                         f"max_iter={counts['max_iter']}")
        for stage in self.cascades():
            told = ", ".join(f"{key} {stage[key]}" for key in ("accepted", "escalated", "answered", "kept: budget",
                                                                "failed") if stage.get(key))
            lines.append(f"  cascade stage {stage['stage']} ({stage['model']}): reached {stage['reached']}"
                         + (f", {told}" if told else ""))
        prompt_tokens, completion_tokens = self.tokens
        lines.append(f"  cache: {self.cache_hits} hit(s), {self.cache_misses} miss(es)")
        read, written = self.cached_tokens
        cached = f" ({read} cached" + (f", {written} written to the prompt cache)" if written else ")") if read or written else ""
        lines.append(f"  tokens: {prompt_tokens} prompt{cached}, {completion_tokens} completion")
        per_backend = self.cached_tokens_per_backend
        for name, cost in self.cost_per_backend(prices).items():
            used = self.tokens_per_backend[name]
            shown = names.get(name, name)
            if cost is not None:
                part = f", {per_backend[name][0]} of them cached" if per_backend[name][0] else ""
                lines.append(f"  cost {shown}: {cost:.6g} ({used[0]} prompt{part} + {used[1]} completion tokens)")
            elif not any(used):
                lines.append(f"  cost {shown}: unknown (no usage reported)")
        wall, path = self.wall, self.critical_path
        ratio = f" ({wall / path:.2f}x)" if path > 0 else ""
        lines.append(f"  wall {wall:.3f} s, critical path {path:.3f} s{ratio}")
        errors = self.errors
        skipped = sum(n.skipped for n in self.nodes.values())
        if errors:
            lines.append(f"  errors ({self.failures} failed element(s) in {len(errors)} place(s)"
                         + (f", {skipped} element(s) skipped downstream" if skipped else "") + "):")
            lines.extend(f"    {_clip(e, 100)}" for e in errors[:10])
            if len(errors) > 10:
                lines.append(f"    ... and {len(errors) - 10} more")
        return "\n".join(lines)

    def backend_names(self) -> dict[str, str]:
        """``repr(backend) -> how the summary names it``: its label (``kind: model``) in full, told apart by number."""
        return apart({name: self.labels.get(name, name) for name in sorted(self.labels)})

    def _compute_union(self, group: list[NodeRecord]) -> float:
        """Seconds during which some node of ``group`` was computing (batch intervals for models)."""
        by_id = {b.id: b for b in self.batches}
        spans: list[tuple[float, float]] = []
        for record in group:
            if record.start is None or record.end is None:
                continue
            if record.kind == "generate":
                spans.extend((by_id[i].start, by_id[i].end or record.end) for i in record.batch_ids if i in by_id)
            else:
                spans.extend(record.intervals)
        return _union(spans)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from outlines.graph.viz.jupyter import trace_mimebundle

        return trace_mimebundle(self)

    def _repr_html_(self) -> str:
        from outlines.graph.viz.jupyter import trace_html

        return trace_html(self)

    def __repr__(self) -> str:
        return (
            f"Trace({len(self.nodes)} nodes, {len(self.batches)} batches, "
            f"wall={self.wall:.3f}s, critical_path={self.critical_path:.3f}s)"
        )


def _union(spans: Any) -> float:
    """Total length of the union of ``(start, end)`` intervals: overlaps count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class _EvalRecorder(Listener):
    """One evaluation's events, written into a shared Trace."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.eval = _Eval(start=0.0)
        self.batches: dict[int, BatchRecord] = {}
        self.index: dict[int, int] = {}  # id(node) -> position in the plan
        self.records: list[NodeRecord | None] = []
        self.structure: list[str] = []
        self.names: dict[int, str] = {}  # id(op or backend) -> its name, computed once
        self.inner: dict[int, NodeRecord] = {}  # id(node) -> record, for nodes of loop bodies and branches

    def eval_started(self, plan: Any, t: float) -> None:
        trace, now = self.trace, self.trace._time(t)
        record = self.eval = _Eval(start=now)
        trace.evals.append(record)
        record.labels = [node.label for node in plan.nodes]
        from outlines.graph.viz.drawing import structure_keys

        keys = structure_keys(plan.nodes)
        self.structure = [keys[id(node)] for node in plan.nodes]
        self.index = {id(node): i for i, node in enumerate(plan.nodes)}
        self.records = [None] * len(plan.nodes)
        record.parents = [[] for _ in plan.nodes]
        for parent, consumers in enumerate(plan.consumers):
            for consumer in consumers:
                record.parents[consumer].append(parent)
        for variable in plan.inputs:
            trace.nodes[variable.label] = NodeRecord(variable.label, "input", "input", None, now, now)

    def eval_finished(self, t: float, error: BaseException | None) -> None:
        self.eval.end = self.trace._time(t)
        self.eval.error = _first_line(error)
        self.eval.critical_path, self.eval.critical_nodes = _longest_chain(self.eval, self.records)

    def _name(self, thing: Any, name: Callable[[Any], str]) -> str:
        known = self.names.get(id(thing))
        if known is None:
            known = self.names[id(thing)] = name(thing)
        return known

    def _backend(self, backend: Any) -> str:
        """The backend's repr (what the trace keys it by); its label is kept beside it for pictures."""
        name = self._name(backend, repr)
        if name not in self.trace.labels:
            self.trace.labels[name] = label_of(backend)
        return name

    def _record(self, node: Apply) -> NodeRecord | None:
        position = self.index.get(id(node))
        if position is not None:
            return self.records[position]
        return self.inner.get(id(node)) or self.trace.nodes.get(node.label)

    def node_started(self, node: Apply, t: float) -> None:
        now = self.trace._time(t)
        record = self._record(node) if id(node) in self.inner or id(node) in self.index else None
        if record is not None:  # it runs again in this evaluation (a loop iteration, a stream chunk): one more span
            record.spans.append((now, None))
            self.trace.nodes[record.label] = record
            return
        op, position = node.op, self.index.get(id(node))
        label = self.eval.labels[position] if position is not None else node.label
        run = op.traits.run
        backend = model_call(op).backend if run is Run.GENERATE else None
        record = NodeRecord(
            label,
            self._name(op, lambda op: op.name),
            run.value,
            self._backend(backend) if backend is not None else None,
            now,
            spans=[(now, None)],
        )
        self.trace.nodes[label] = record
        if position is not None:
            self.records[position] = record
            record.structure = self.structure[position]
        else:
            self.inner[id(node)] = record

    def node_finished(self, node: Apply, t: float, error: BaseException | None = None) -> None:
        record = self._record(node)
        if record is not None:
            now = self.trace._time(t)
            record.end = now if record.end is None else max(record.end, now)
            for number, (start, end) in enumerate(record.spans):
                if end is None:  # runs of one node finish in any order; the sums do not depend on which closes
                    record.spans[number] = (start, now)
                    break
            record.error = record.error or _first_line(error)
            if record.kind == "generate" and record.start is not None and record.batch_ids:
                by_id = {b.id: b for b in self.batches.values()}
                spans = [(by_id[i].start, by_id[i].end or record.end) for i in record.batch_ids if i in by_id]
                record.computing = _union(spans)

    def node_failures(self, node: Apply, outputs: tuple[Any, ...]) -> None:
        record = self._record(node)
        if record is None:
            return
        own, skipped, first = 0, 0, None
        for failure in _failures(outputs):
            if failure.upstream is None:
                own += 1
                first = first or failure
            else:
                skipped += 1
        record.failures += own
        record.skipped += skipped
        if first is not None and record.error is None:
            record.error = _first_line(first)

    def node_cache(self, node: Apply, hits: int, misses: int) -> None:
        self.trace.cache_hits += hits
        self.trace.cache_misses += misses
        record = self._record(node)
        if record is not None:
            record.cache_hits += hits
            record.cache_misses += misses

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None:
        trace = self.trace
        name = self._backend(backend)
        labels = [n if isinstance(n, str) else n.label for n in nodes]
        record = BatchRecord(len(trace.batches) + 1, name, size, trace._time(t), nodes=labels)
        if name not in trace.models:
            trace.models[name] = (getattr(backend, "model_name", name), getattr(backend, "price", None))
        trace.batches.append(record)
        self.batches[batch_id] = record
        trace.requests_per_backend[name] = trace.requests_per_backend.get(name, 0) + 1
        for label in labels:
            node = trace.nodes.get(label)
            if node is not None:
                node.batch_ids.append(record.id)

    def job_event(self, batch_id: int, event: Any) -> None:
        batch = self.batches.get(batch_id)
        if batch is None:
            return
        status = event.status
        jobs = self.trace.jobs
        record = next((j for j in reversed(jobs) if j.id == status.id and j.batch == batch.id), None)
        if record is None:
            record = JobTraceRecord(status.id, event.provider, event.backend, batch.id, resumed=event.kind == "resumed")
            jobs.append(record)
            batch.jobs.append(status.id)
        if event.kind in ("created", "resumed"):
            record.requests, record.draws, record.bytes = event.requests, event.draws, event.bytes
        if event.kind == "status":
            record.polls += 1
        record.state = "collected" if event.kind == "collected" else status.state
        record.succeeded, record.failed = max(record.succeeded, status.succeeded), max(record.failed, status.failed)
        record.waited = max(record.waited, event.waited)

    def batch_finished(
        self,
        batch_id: int,
        t: float,
        error: BaseException | None,
        usage: Sequence[int],
        worker: str | None,
        requests: int = 0,
    ) -> None:
        record = self.batches.get(batch_id)
        if record is None:
            return
        record.end = self.trace._time(t)
        record.error = _first_line(error)
        record.prompt_tokens, record.completion_tokens = int(usage[0]), int(usage[1])
        if len(usage) > 3:
            record.cached_tokens, record.cache_write_tokens = int(usage[2]), int(usage[3])
        record.worker = worker
        record.requests = requests

    def request_finished(
        self, batch_id: int, start: float, end: float, error: BaseException | None = None, model: str | None = None
    ) -> None:
        record = self.batches.get(batch_id)
        if record is not None:
            trace = self.trace
            trace.requests.append(
                RequestRecord(record.id, trace._time(start), trace._time(end), _first_line(error), model or record.backend)
            )

    def draws_answered(self, batch_id: int, answered_by: dict[str, int]) -> None:
        record = self.batches.get(batch_id)
        if record is not None:
            record.answered_by = dict(answered_by)

    def model_loaded(self, backend: Any, start: float, end: float) -> None:
        trace = self.trace
        trace.model_loads.append(ModelLoadRecord(self._backend(backend), trace._time(start), trace._time(end)))

    def loop_iteration(self, node: Apply, iteration: int, active: int, batches: int, start: float, end: float) -> None:
        trace = self.trace
        trace.iterations.append(
            IterationRecord(node.label, iteration, active, batches, trace._time(start), trace._time(end))
        )

    def branch_counted(self, node: str, counts: dict[str, Any]) -> None:
        known = self.trace.branches.setdefault(node, {})
        for key, value in counts.items():
            summed = isinstance(value, int) and key != "stage"
            known[key] = known.get(key, 0) + value if summed else value

    def loop_limited(self, loop: str, stopped: int, elements: int, max_iter: int) -> None:
        counts = self.trace.loops_limited.setdefault(loop, {"stopped": 0, "elements": 0, "max_iter": max_iter})
        counts["stopped"] += stopped
        counts["elements"] += elements


def _failures(value: Any) -> Iterator[Any]:
    """The ``outlines.Failure`` elements in an output (scalar, object array or tuple of them)."""
    from outlines.common.errors import Failure

    if isinstance(value, Failure):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _failures(item)
    elif getattr(value, "dtype", None) == object:
        yield from (v for v in value.flat if isinstance(v, Failure))


def _longest_chain(record: _Eval, nodes: list[NodeRecord | None]) -> tuple[float, list[str]]:
    """Longest path through the plan's DAG, weighting each node by its duration."""
    finish = [0.0] * len(record.labels)
    best: list[int] = [-1] * len(record.labels)
    for i, node in enumerate(nodes):  # plan.nodes is topologically ordered
        parent = max(record.parents[i], key=finish.__getitem__, default=-1)
        finish[i] = (finish[parent] if parent >= 0 else 0.0) + (node.duration if node else 0.0)
        best[i] = parent
    if not finish:
        return 0.0, []
    end = max(range(len(finish)), key=finish.__getitem__)
    total, chain = finish[end], []
    while end >= 0:
        chain.append(record.labels[end])
        end = best[end]
    return total, chain[::-1]


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record every evaluation run inside the block.

    Returns
    -------
    Trace
        Filled in as evaluations run; read it after (or during) the block.

    Examples
    --------
    >>> import outlines
    >>> q = outlines.string("q")
    >>> with outlines.trace() as t:
    ...     _ = (q + "!").eval({"q": "hi"}, cache=False)
    >>> len(t.evals)
    1
    """
    recorder = Trace()
    token = _active.set(recorder)
    try:
        yield recorder
    finally:
        _active.reset(token)
        recorder.closed_at = time.perf_counter()
