"""``outlines.explain``: the batches an evaluation would send, without sending any.

The dry run walks the plan in order. Cheap text ops (``+``, templates) run on
the values the givens make known; user functions run only when declared
``pure=True`` and synchronous (a splitter that sizes a ragged fan-out), never
on unknown values; model calls turn
their known prompts into draws exactly as the scheduler does and look them up
in the cache with one ``get_many`` per node. A model call whose prompt is
computed from an unknown value (a model output, a user function) is counted by
shape when the shape is known, with an unknown cache status.

Batching follows the scheduler's grouping under equal latencies: draws of the
same (backend, params; draws differing only in their constraint count as one:
``batching.queue_key``) whose model calls sit at the same *level* (number of
model calls with misses along the longest chain above them, themselves
included) go out together, deduplicated, cache hits removed, split by the
backend's ``max_batch``; the deduplication, cache lookup and split are the
scheduler's own helpers (``outlines.runtime.batching``).

The prediction is exact when every prompt is known and no predicted batch
gathers model calls that wait on different Python steps (user functions run
off the loop for as long as they take): the scheduler holds a batch open only
for ``batch_window``, so a slow step can split it. ``Explanation.exact`` says
so, and ``timing_dependent`` names the model calls concerned.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from outlines import cache as cache_module
from outlines.backends.base import Draw
from outlines.backends.usage import PriceTable, price_of
from outlines.graph.basic import Variable
from outlines.graph.ops import Stack, broadcast_map
from outlines.graph.ragged import Ragged
from outlines.runtime.batching import BatchQueue, batch_sizes, lookup, queue_key, unique_draws
from outlines.runtime.session import Options
from outlines.runtime.plan import Plan, bind_givens

__all__ = ["Explanation", "PredictedBatch", "explain"]

@dataclass
class PredictedBatch:
    """One backend call the evaluation would make."""

    backend: str
    level: int
    size: int
    unknown: int  # prompts not known in advance (computed from model outputs)
    nodes: list[str] = field(default_factory=list)
    #: Prompt tokens of the known prompts (the backend's count: ``Backend.usage_bound``).
    prompt_tokens: int = 0
    #: The most completion tokens (``max_tokens`` per sample); ``None``: a call sets no ``max_tokens``.
    completion_tokens: int | None = 0
    #: Wire requests (a chat batch sends one per prompt); unknown prompts count one each.
    wire_requests: int = 1


@dataclass
class BackendUsage:
    """What one backend would be asked for: batches, requests, tokens and their cost."""

    batches: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    #: Upper bound (``max_tokens`` x samples); ``None`` where a call sets no ``max_tokens``.
    completion_tokens: int | None = 0
    #: Prompt tokens counted with the model's tokenizer (else the 4-characters estimate).
    exact: bool = True
    #: Prompts not known in advance (computed from model outputs): their tokens are not counted.
    unknown_prompts: int = 0
    #: Money, from the model's price or the ``prices`` table (``None``: no price).
    prompt_cost: float | None = None
    #: Upper bound of the completions' cost (``None``: no price or no bound).
    completion_cost: float | None = None

    @property
    def cost(self) -> float | None:
        """Upper bound of the whole cost (``None`` when unknown)."""
        if self.prompt_cost is None or self.completion_cost is None:
            return None
        return self.prompt_cost + self.completion_cost


@dataclass
class Explanation:
    """What evaluating some Variables would do; see ``explain``."""

    nodes_by_kind: dict[str, int]
    batches: list[PredictedBatch]
    draws: int
    cache_hits: int
    deduplicated: int  # known draws that share another draw's request
    unknown_draws: int
    unknown_nodes: list[str]
    #: model calls predicted in one batch although they wait on different Python steps
    timing_dependent: list[str] = field(default_factory=list)
    #: One line per loop or branch node: its body (not counted above: iterations are unknown in advance).
    control: list[str] = field(default_factory=list)
    #: ``repr(backend) -> BackendUsage``: tokens (after cache hits and dedup), requests, cost.
    usage: dict[str, BackendUsage] = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every predicted batch (known prompts)."""
        return sum(u.prompt_tokens for u in self.usage.values())

    @property
    def completion_tokens(self) -> int | None:
        """Upper bound of the completion tokens (``None``: some call sets no ``max_tokens``)."""
        bounds = [u.completion_tokens for u in self.usage.values()]
        return None if None in bounds else sum(b for b in bounds if b is not None)

    @property
    def cost(self) -> float | None:
        """Upper bound of the money spent (``None`` when a backend has no price or no bound)."""
        costs = [u.cost for u in self.usage.values()]
        return None if None in costs else sum(c for c in costs if c is not None)

    @property
    def requests(self) -> int:
        """Backend calls (batches) the evaluation would make."""
        return len(self.batches)

    @property
    def batching_exact(self) -> bool:
        """Whether the predicted batches hold whatever the timing of Python steps."""
        return not self.timing_dependent

    @property
    def requests_per_backend(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for batch in self.batches:
            counts[batch.backend] = counts.get(batch.backend, 0) + 1
        return counts

    @property
    def exact(self) -> bool:
        """Whether the run will send exactly these batches: prompts, cache status and timing known.

        Never with loops or branches: their bodies' calls are not counted.
        """
        return self.unknown_draws == 0 and not self.unknown_nodes and not self.control and self.batching_exact

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes_by_kind": dict(self.nodes_by_kind),
            "requests": self.requests,
            "requests_per_backend": self.requests_per_backend,
            "batches": [asdict(b) for b in self.batches],
            "draws": self.draws,
            "cache_hits": self.cache_hits,
            "deduplicated": self.deduplicated,
            "unknown_draws": self.unknown_draws,
            "unknown_nodes": list(self.unknown_nodes),
            "timing_dependent": list(self.timing_dependent),
            "exact": self.exact,
            "control": list(self.control),
            "usage": {name: dict(asdict(u), cost=u.cost) for name, u in self.usage.items()},
        }

    def summary(self) -> str:
        kinds = ", ".join(f"{count} {kind}" for kind, count in self.nodes_by_kind.items())
        lines = [f"outlines explain (dry run, nothing sent): {sum(self.nodes_by_kind.values())} nodes ({kinds})"]
        rows: dict[tuple[str, int], list[int]] = {}
        for batch in self.batches:
            rows.setdefault((batch.backend, batch.level), []).append(batch.size)
        if rows:
            lines.append(f"  {'backend':<44}{'level':>6}{'batches':>9}{'prompts':>9}  sizes")
        for (backend, level), sizes in rows.items():
            shown = " ".join(map(str, sizes[:6])) + (" ..." if len(sizes) > 6 else "")
            name = backend if len(backend) <= 43 else backend[:40] + "..."
            lines.append(f"  {name:<44}{level:>6}{len(sizes):>9}{sum(sizes):>9}  {shown}")
        per_backend = ", ".join(f"{b}: {n}" for b, n in self.requests_per_backend.items())
        lines.append(f"  requests: {self.requests}" + (f" ({per_backend})" if per_backend else ""))
        lines.append(
            f"  draws: {self.draws}; cache hits known in advance: {self.cache_hits}; "
            f"duplicates merged: {self.deduplicated}"
        )
        for name, usage in self.usage.items():
            bound = "unbounded (no max_tokens)" if usage.completion_tokens is None else f"<= {usage.completion_tokens}"
            counted = "exact" if usage.exact else "estimated: 4 characters a token"
            if usage.unknown_prompts:
                counted += f"; {usage.unknown_prompts} prompt(s) computed from model outputs not counted"
            cost = "" if usage.cost is None else f"; cost <= {usage.cost:.6g} (prompts {usage.prompt_cost:.6g})"
            name = name if len(name) <= 60 else name[:57] + "..."
            lines.append(
                f"  {name}: {usage.requests} request(s) in {usage.batches} batch(es); tokens: "
                f"{usage.prompt_tokens} prompt ({counted}), completion {bound}{cost}"
            )
        if self.unknown_draws:
            lines.append(
                f"  {self.unknown_draws} draw(s) have prompts computed from model outputs or functions: "
                "counted by shape, cache status unknown"
            )
        if self.unknown_nodes:
            lines.append(
                f"  {len(self.unknown_nodes)} model call(s) of unknown size (not counted): "
                + ", ".join(self.unknown_nodes[:5])
            )
        if self.timing_dependent:
            lines.append(
                f"  caveat: {len(self.timing_dependent)} model call(s) batched together here wait on different "
                "Python steps; a step slower than batch_window splits their batch: "
                + ", ".join(self.timing_dependent[:5])
            )
        lines.extend(f"  {line}" for line in self.control)
        lines.append("  prediction: " + ("exact" if self.exact else "an estimate (see the lines above)"))
        return "\n".join(lines)

    __str__ = summary

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from outlines.graph.viz.jupyter import text_mimebundle

        return text_mimebundle(self.summary(), "outlines-explain")

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()  # an element whose value a dry run cannot know


def _unknown(shape: tuple[int, ...]) -> Any:
    if not shape:
        return UNKNOWN
    array = np.empty(shape, dtype=object)
    array.fill(UNKNOWN)
    return array


def _flat(value: Any) -> list[Any]:
    if isinstance(value, Ragged):
        value = value.values
    return list(value.reshape(-1)) if isinstance(value, np.ndarray) else [value]


#: Draws of one model call that explain checks one by one (cache, dedup); a
#: bigger call is counted by shape only, so explain stays quick.
MAX_CHECKED_DRAWS = 100_000


class _DryRun:
    """The walk: each Variable's value (elements may be UNKNOWN), level and waits.

    A Variable whose shape cannot be known has no entry in ``values``.
    ``waits`` holds, per Variable, the Python steps (node positions) that run
    off the loop upstream of it: their durations decide when it is known.
    """

    def __init__(self, plan: Plan, cache: Any, values: dict[int, Any]) -> None:
        self.plan = plan
        self.cache = cache
        self.values = values
        self.levels: dict[int, int] = {}
        self.waits: dict[int, frozenset[int]] = {}
        self.queues: dict[tuple[int, Any, Any], BatchQueue] = {}
        # per queue: draws of unknown prompts, as runs of (draws per prompt, prompts)
        self.unknown: dict[tuple[int, Any, Any], list[tuple[int, int]]] = {}
        self.nodes: dict[tuple[int, Any, Any], list[tuple[str, frozenset[int]]]] = {}
        self.sent: dict[Draw, int] = {}  # level each draw is first sent at
        self.draws = self.hits = self.unknown_draws = 0
        self.unknown_nodes: list[str] = []
        self.current_waits: frozenset[int] = frozenset()

    def run(self) -> None:
        for position, node in enumerate(self.plan.nodes):
            waits: frozenset[int] = frozenset().union(*(self.waits.get(id(v), frozenset()) for v in node.inputs))
            if node.op.mode == "python" and getattr(getattr(node.op, "function", None), "blocking", None) is not False:
                waits = waits | {position}
            self.current_waits = waits
            level = max((self.levels.get(id(v), 0) for v in node.inputs), default=0)
            inputs = [self.values.get(id(v), None) for v in node.inputs]
            if any(id(v) not in self.values for v in node.inputs):
                results: list[Any] = [None] * len(node.outputs)
                if node.op.mode == "generate":
                    self.unknown_nodes.append(node.label)
                    level += 1
            elif node.op.mode == "generate":
                level, results = self.generate(node, level, inputs[0])
            else:
                results = self.compute(node, inputs)
            for output, value in zip(node.outputs, results):
                self.levels[id(output)] = level
                if waits:
                    self.waits[id(output)] = waits
                if value is not None:
                    self.values[id(output)] = value

    def compute(self, node: Any, inputs: list[Any]) -> list[Any]:
        """Run cheap inline ops on what is known; only shapes for user functions."""
        op = node.op
        partial = any(x is UNKNOWN for value in inputs for x in _flat(value))
        pure_python = op.mode == "python" and op.pure and not getattr(getattr(op, "function", None), "is_async", True)
        if (op.mode == "inline" or pure_python) and not partial:
            result = op.perform(*inputs)
            return list(result) if len(node.outputs) > 1 else [result]
        if op.mode == "inline" and getattr(op, "moves_unknown", False):
            return [op.perform(*inputs, unknown=UNKNOWN)]  # structural or template ops
        if op.mode == "inline" and (getattr(op, "elementwise", False) or isinstance(op, Stack)):
            perform = op.perform
            scalar = lambda *xs: UNKNOWN if any(x is UNKNOWN for x in xs) else perform(*xs)  # noqa: E731
            return [perform(*inputs) if isinstance(op, Stack) else broadcast_map(scalar, inputs)]
        shapes = _output_shapes(node, [x.shape if isinstance(x, np.ndarray) else () for x in inputs])
        return [None if shape is None else _unknown(shape) for shape in shapes]

    def generate(self, node: Any, level: int, prompt: Any) -> tuple[int, list[Any]]:
        op = node.op
        count = int(np.size(prompt)) * op.num_samples
        if count > MAX_CHECKED_DRAWS:  # too many to look up one by one: count them, cache unchecked
            self.draws += count
            self.unknown_draws += count
            self.queue(level + 1, op, node.label, (1 if op.params.deterministic else op.num_samples, int(np.size(prompt))))
            shape = np.shape(prompt) + ((op.num_samples,) if op.num_samples > 1 else ())
            return level + 1, [_unknown(shape)]
        elements = _flat(prompt)
        known = [x is not UNKNOWN for x in elements]
        texts = [x if ok else "" for x, ok in zip(elements, known)]
        value = np.array(texts, dtype=object).reshape(np.shape(prompt)) if np.ndim(prompt) else texts[0]
        shape, draws = op.draws(value, self.plan.draw_offsets.get(id(node), 0))
        k = op.num_samples
        self.draws += len(draws)
        mask = [known[i // k] for i in range(len(draws))]
        unique = unique_draws(d for d, ok in zip(draws, mask) if ok)
        found = lookup(self.cache, op.backend, unique, record=False)  # a dry run counts no hits
        # With a cache, a draw sent at an earlier level is stored by the time it recurs.
        earlier = self.sent if self.cache is not None else {}
        hit = {d for d in unique if d in found or earlier.get(d, level + 1) <= level}
        self.hits += sum(1 for d, ok in zip(draws, mask) if ok and d in hit)
        misses = [d for d in unique if d not in hit]
        unknown = known.count(False) * (1 if op.params.deterministic else k)
        self.unknown_draws += known.count(False) * k
        results = [found.get(d, UNKNOWN) if ok else UNKNOWN for d, ok in zip(draws, mask)]
        output = results[0] if not shape else np.array(results, dtype=object).reshape(shape)
        if not misses and not unknown:
            return level, [output]
        queue = self.queue(level + 1, op, node.label, (1 if op.params.deterministic else k, known.count(False)))
        for draw in misses:
            queue.pending[draw] = None
            self.sent.setdefault(draw, level + 1)
        return level + 1, [output]

    def queue(self, level: int, op: Any, label: str, unknown: tuple[int, int]) -> BatchQueue:
        """The predicted queue of ``op``'s backend and params at ``level``, with ``unknown`` prompts more.

        ``unknown`` is (draws per prompt, prompts): unknown prompts batch like known ones.
        """
        key = (level, *queue_key(op.backend, op.params))  # the scheduler's queues (constraints share one)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = BatchQueue(op.backend)
        self.nodes.setdefault(key, []).append((label, self.current_waits))
        self.unknown.setdefault(key, []).append(unknown)
        return queue

    def batches(self) -> list[PredictedBatch]:
        out: list[PredictedBatch] = []
        for key, queue in sorted(self.queues.items(), key=lambda item: item[0][0]):
            known = len(queue.pending)
            groups: dict[tuple[str, Any], int] = {}  # the known draws per prompt, as prompt_batches groups them
            for draw in queue.pending:
                groups[draw.prompt, draw.params] = groups.get((draw.prompt, draw.params), 0) + 1
            runs = [(size, 1) for size in groups.values()] + self.unknown[key]
            labels = [label for label, _ in self.nodes[key]]
            pending = list(queue.pending)
            backend, max_tokens = queue.backend, key[2].max_tokens
            start = 0
            for count in batch_sizes(runs, backend.max_batch):
                unknown = max(0, min(count, start + count - known))
                draws = pending[start : start + count - unknown]
                prompt_tokens, completion = backend.usage_bound(draws) if draws else (0, 0)
                if completion is not None and unknown:
                    completion = None if max_tokens is None else completion + max_tokens * unknown
                requests = backend.requests_for(draws) if draws else 0
                if unknown:  # an HTTP backend: one request per unknown prompt at most; others: one call
                    requests += unknown if backend.sends_requests else (0 if draws else 1)
                out.append(PredictedBatch(repr(backend), key[0], count, unknown, list(labels), prompt_tokens,
                                          completion, requests))
                start += count
        return out

    def usage(self, batches: list[PredictedBatch], prices: Any) -> dict[str, BackendUsage]:
        """Per backend: batches, requests, tokens and cost of ``batches``."""
        backends = {repr(queue.backend): queue.backend for queue in self.queues.values()}
        out: dict[str, BackendUsage] = {}
        for batch in batches:
            usage = out.setdefault(batch.backend, BackendUsage())
            usage.batches += 1
            usage.requests += batch.wire_requests
            usage.prompt_tokens += batch.prompt_tokens
            usage.exact = backends[batch.backend].tokens_exact
            usage.unknown_prompts += batch.unknown
            if usage.completion_tokens is not None:
                usage.completion_tokens = None if batch.completion_tokens is None else (
                    usage.completion_tokens + batch.completion_tokens)
        for name, usage in out.items():
            price = price_of(backends[name], prices)
            if price is not None:
                usage.prompt_cost = price.cost(usage.prompt_tokens, 0)
                if usage.completion_tokens is not None:
                    usage.completion_cost = price.cost(0, usage.completion_tokens)
        return dict(sorted(out.items()))

    def timing_dependent(self) -> list[str]:
        """Model calls sharing a predicted batch while waiting on different Python steps."""
        labels: list[str] = []
        for members in self.nodes.values():
            if len({waits for _, waits in members}) > 1:
                labels.extend(label for label, _ in members)
        return labels


_CORE = re.compile(r"\(([^()]*)\)")


def _output_shapes(node: Any, shapes: list[Any]) -> list[Any]:
    """Shapes of a node's outputs from its inputs' shapes (``None``: unknown)."""
    op, count = node.op, len(node.outputs)
    if any(s is None for s in shapes):
        return [None] * count
    function = getattr(op, "function", None)
    signature = getattr(function, "signature", None)
    try:
        if signature is not None:
            return _gufunc_shapes(signature, shapes)
        if function is not None or getattr(op, "elementwise", False):
            return [tuple(np.broadcast_shapes(*shapes))] * count
        if isinstance(op, Stack):
            return [tuple(np.broadcast_shapes(*shapes)) + (len(shapes),)]
    except ValueError:
        pass
    return [None] * count


def _gufunc_shapes(signature: str, shapes: list[tuple[int, ...]]) -> list[Any]:
    inputs, outputs = signature.split("->")
    cores = [[d for d in c.split(",") if d] for c in _CORE.findall(inputs)]
    sizes: dict[str, int] = {}
    loops = []
    for shape, core in zip(shapes, cores):
        loops.append(shape[: len(shape) - len(core)])
        for name, size in zip(core, shape[len(shape) - len(core) :]):
            sizes[name] = size
    loop = tuple(np.broadcast_shapes(*loops)) if loops else ()
    out_cores = [[d for d in c.split(",") if d] for c in _CORE.findall(outputs)]
    return [loop + tuple(sizes[d] for d in core) if all(d in sizes for d in core) else None for core in out_cores]


def explain(
    *variables: Variable,
    givens: Mapping[Any, Any] | None = None,
    cache: Any = True,
    prices: PriceTable | None = None,
    **options: Any,
) -> Explanation:
    """A dry-run plan of evaluating ``variables``: sends nothing.

    Parameters
    ----------
    *variables
        The Variables an ``eval`` would compute.
    givens
        Values of the free inputs (as for ``eval``). Unbound inputs make the
        model calls that depend on them of unknown size.
    cache
        As for ``eval``: hits known in advance are not counted as requests.
    prices
        A price table, model name -> ``(input_per_1M, output_per_1M)``, for
        models without their own ``price=`` (``outlines.backends.usage``).
    **options
        Other evaluation options (accepted for symmetry with ``eval``).

    Returns
    -------
    Explanation
        ``nodes_by_kind``, ``batches`` (backend, level, size), ``requests``,
        ``requests_per_backend``, ``cache_hits``, ``unknown_draws``,
        ``timing_dependent`` and ``exact`` (the run will send exactly these
        batches); ``usage`` per backend: batches, wire requests, prompt
        tokens (after cache hits and dedup; exact with the model's tokenizer,
        else estimated), completion tokens as an upper bound (``max_tokens``
        x samples) and cost where a price is known, with the totals
        ``prompt_tokens``, ``completion_tokens`` and ``cost``; ``summary()``
        (with a caveat line when timing can split a batch) and ``to_dict()``.

    Examples
    --------
    >>> import outlines
    >>> llm = outlines.models.from_function(lambda ps: ps, batched=True)
    >>> q = outlines.string("q")
    >>> outlines.explain(llm(llm(q)), givens={"q": ["a", "b"]}, cache=False).requests
    2
    """
    if not variables:
        raise TypeError("explain needs at least one Variable")
    Options.check(options)
    plan = Plan(variables)
    run = _DryRun(plan, cache_module.resolve(cache), bind_givens(plan, givens, partial=True))
    run.run()
    kinds = {"input": len(plan.inputs), "inline": 0, "python": 0, "generate": 0}
    for node in plan.nodes:
        kinds[node.op.mode] = kinds.get(node.op.mode, 0) + 1
    batches = run.batches()
    usage = run.usage(batches, prices)
    sent = sum(len(queue.pending) for queue in run.queues.values())
    merged = run.draws - run.unknown_draws - run.hits - sent
    from outlines.runtime.control import describe

    control = [describe(node) for node in plan.nodes if node.op.mode == "control"]
    return Explanation(
        kinds,
        batches,
        run.draws,
        run.hits,
        merged,
        run.unknown_draws,
        run.unknown_nodes,
        run.timing_dependent(),
        control,
        usage,
    )
