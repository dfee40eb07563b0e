"""``outlines.explain``: the batches an evaluation would send, without sending any.

The dry run walks the very plan ``eval`` runs (``Plan``: sibling
calls stacked into array nodes, each stacked node counted for the calls it
stands for) in order, dispatching each node by its kind as the scheduler does
(``outlines.runtime.scheduler.walker``). Cheap text ops (``+``,
templates) run on the values the givens make known; user functions run only
when declared ``pure=True`` and synchronous (a splitter that sizes a ragged
fan-out), never on unknown values; model calls turn their known prompts into
draws exactly as the scheduler does and look them up in the cache with the
batcher's own step (``batching.batcher.cached_values``, counting no hits). A
model call whose prompt is computed from an unknown value (a model output, a
user function) is counted by shape when the shape is known (the shapes the
op infers, ``outlines.graph.shapes.propagate``), with an unknown cache status.

Batching follows the scheduler's grouping under equal latencies: draws whose
model calls share a queue (``batching.queue.queue_key``: backend and params,
the constraint aside) and sit at the same *level* (number of model calls with
misses along the longest chain above them, themselves included) join one of
the batcher's own ``BatchQueue``s, deduplicated there, cache hits removed;
the batches are the batcher's own ``Batch`` records (``batching.batches.pack_draws``
on what the queue's ``take`` gives), so explain reads the plan the batcher
would make rather than a copy of its rules.

Words: a *draw* is one sample of one prompt, a *batch* one backend call, a
*request* one wire request (a chat batch sends one per prompt; a local model
or a batched function receives its batch as one).

The prediction is exact when every prompt is known and no predicted batch
gathers model calls that wait on different Python steps (user functions run
off the loop for as long as they take): the scheduler holds a batch open only
for ``batch_window``, so a slow step can split it. ``Explanation.exact`` says
so, and ``timing_dependent`` names the model calls concerned.

A ``while_loop`` runs its body an unknown number of times, so its calls are
given as a range (``LoopEstimate``): the body is dry-run once over all the
loop's elements (one iteration: its draws, requests, tokens and cost per
backend, the prompts it computes from the state counted by shape, the cache
not consulted), and the range goes from that iteration to ``max_iter`` times
it. ``draws_range`` and ``requests_range`` add the loops to the rest.
An ``outlines.cascade`` escalates an unknown share of its elements, so its
cost is a range too (``CascadeEstimate``): each stage (a counted ``cond``)
is dry-run over every element, the cache not consulted; the range goes from
every element accepted at the first stage to every element escalated to the
last.

``draw_numbers`` gives each sampling model call its draw numbers. They count
the calls on the same prompt (same backend and params) among the Variables
evaluated together, in creation order: ``b.eval()`` alone draws 0 where
``outlines.eval(a, b)`` gives ``b`` draw 1 when ``a`` is the same call built
first (see docs/guides/cache.md, "What a draw number depends on").

Cached prompt tokens are an estimate (``_estimated_cached``), never part of an
exact prediction: per prefix group of a predicted batch
(``outlines.draws.prefix_groups``), its shared head for each prompt but the
one that first carries it. A provider keeps a head cached across batches (the
warm-up sends one request per head first), a local model only within one.
What a provider really caches depends on its own rules (OpenAI's 128-token
steps, eviction after minutes), so the run's trace reports the real counts.

Costs are upper bounds, priced the way a ``Budget`` prices each batch: every
prompt token at the input price (the estimated cached ones too: their
discount, ``BackendUsage.cache_saving``, is not promised), completions at
``max_tokens``, provider jobs at the batch price. Money is summed exactly and
reported rounded up to a micro-unit (``outlines.backends.usage.reported``),
so ``Budget(cost=explain(...).cost)`` admits the run it estimates.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Mapping, Sequence, cast

import numpy as np

from outlines.backends.base import Backend
from outlines.draws import DrawColumns, Slot, prefix_groups
from outlines.backends.usage import Price, PriceTable, price_of, reported
from outlines.common.errors import GraphBuildError
from outlines.graph.basic import Apply, Variable
from outlines.graph.control import Cond, Subgraph, WhileLoop
from outlines.graph.protocols import ModelCall, model_call, python_step
from outlines.graph.traits import Run
from outlines.common.labels import apart, label_of
from outlines.graph.ops import Stack, broadcast_map, scalar_or_array
from outlines.graph.ragged import Ragged
from outlines.graph.shapes import propagate, shape_of
from outlines.runtime.batching.batcher import cached_values
from outlines.runtime.batching.batches import pack_draws
from outlines.runtime.batching.queue import BatchQueue, queue_key
from outlines.backends.jobs import job_client
from outlines.runtime.jobs import has_jobs
from outlines.runtime.session import Evaluation, Options
from outlines.runtime.control import _shape as loop_shape, describe
from outlines.runtime.plan import Plan, bind_givens, check_shapes
from outlines.runtime.scheduler import walker

__all__ = ["BackendUsage", "CascadeEstimate", "Explanation", "LoopEstimate", "PredictedBatch", "explain"]


@dataclass
class PredictedBatch:
    """One batch (one backend call) the evaluation would make: a ``Batch`` record, described."""

    backend: str
    level: int
    #: Draws in the batch.
    size: int
    #: Draws of prompts not known in advance (computed from model outputs).
    unknown: int
    nodes: list[str] = field(default_factory=list)
    #: Prompt tokens of the known prompts (the backend's count: ``Backend.usage_bound``).
    prompt_tokens: int = 0
    #: The most completion tokens (``max_tokens`` per sample); ``None``: a call sets no ``max_tokens``.
    completion_tokens: int | None = 0
    #: Wire requests (a chat batch sends one per prompt); unknown prompts count one each.
    #: In batch mode, the requests (lines) its jobs hold.
    wire_requests: int = 1
    #: Of ``prompt_tokens``: an estimate of those a prompt cache or shared prefill serves (``_estimated_cached``).
    cached_tokens: int = 0
    #: Batch mode: the provider jobs that send it (split at the provider's request limit); 0: live.
    jobs: int = 0


@dataclass
class BackendUsage:
    """What one backend would be asked for: batches, requests, tokens and their cost."""

    batches: int = 0
    #: Draws sent (after cache hits and dedup).
    draws: int = 0
    requests: int = 0
    prompt_tokens: int = 0
    #: Of ``prompt_tokens``: an estimate of those read from a prompt cache (or a shared prefill).
    cached_tokens: int = 0
    #: Upper bound (``max_tokens`` x samples); ``None`` where a call sets no ``max_tokens``.
    completion_tokens: int | None = 0
    #: Prompt tokens counted with the model's tokenizer (else the 4-characters estimate).
    exact: bool = True
    #: Prompts not known in advance (computed from model outputs): their tokens are not counted.
    unknown_prompts: int = 0
    #: The model's price, or its entry of the ``prices`` table (``None``: no price, no cost).
    price: Price | None = None
    #: What is known of the server (``outlines.backends.quirks``: noted by earlier runs, on disk):
    #: the requests above follow it (one per sample where the server ignores ``n``).
    quirks: list[str] = field(default_factory=list)
    #: Batch mode: provider jobs (their tokens cost the batch price) and the rounds they go in.
    jobs: int = 0
    rounds: int = 0
    #: Batch mode: of ``prompt_tokens`` and ``completion_tokens``, those sent in jobs (at the batch price);
    #: the rest go live (draws whose constraint no job line can carry).
    job_prompt_tokens: int = 0
    job_completion_tokens: int = 0
    #: Batch mode: how each constraint of its calls travels, and what a draw that breaks it costs.
    constraints: list[str] = field(default_factory=list)

    @property
    def money(self) -> Fraction | None:
        """The upper bound of the cost, exact (``None``: no price or no bound); ``cost`` reports it."""
        if self.price is None or self.completion_tokens is None:
            return None
        return self._money(self.prompt_tokens, self.completion_tokens)

    def _money(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Fraction:
        """Exact money of these tokens: those in jobs at the batch price, the rest (and cached ones) live."""
        assert self.price is not None
        job_prompt = min(self.job_prompt_tokens, prompt_tokens) if prompt_tokens else 0
        job_completion = min(self.job_completion_tokens, completion_tokens) if completion_tokens else 0
        live = self.price.money(prompt_tokens - job_prompt, completion_tokens - job_completion,
                                cached_tokens=min(cached_tokens, prompt_tokens - job_prompt))
        return live + self.price.money(job_prompt, job_completion, jobs=True)

    @property
    def cost(self) -> float | None:
        """Upper bound of the whole cost (``None`` when unknown), rounded up to a micro-unit."""
        money = self.money
        return None if money is None else reported(money)

    @property
    def prompt_cost(self) -> float | None:
        """The prompts' cost, every token at the input price (``None``: no price)."""
        return None if self.price is None else reported(self._money(self.prompt_tokens, 0))

    @property
    def completion_cost(self) -> float | None:
        """Upper bound of the completions' cost (``None``: no price or no bound)."""
        if self.price is None or self.completion_tokens is None:
            return None
        return reported(self._money(0, self.completion_tokens))

    @property
    def cache_saving(self) -> float | None:
        """An estimate of what the prompt cache may take off ``cost`` (``cached_tokens`` at the cached price)."""
        if self.price is None:
            return None
        full = self._money(self.prompt_tokens, 0)
        return reported(full - self._money(self.prompt_tokens, 0, self.cached_tokens))

    def to_dict(self) -> dict[str, Any]:
        """The fields, and the costs as reported."""
        return dict(asdict(self), prompt_cost=self.prompt_cost, completion_cost=self.completion_cost,
                    cost=self.cost, cache_saving=self.cache_saving)


@dataclass
class LoopEstimate:
    """A ``while_loop``'s model calls: one iteration's (``iteration``) up to ``max_iter`` times that.

    One iteration is the body over every element of the loop (an element
    that has left sends less); its prompts come from the state, so their
    tokens are counted by shape only and the cache is not consulted.
    """

    loop: str
    max_iter: int
    #: Elements the loop runs over (the broadcast shape of its inputs).
    elements: int
    #: ``repr(backend) -> BackendUsage`` of one iteration.
    iteration: dict[str, BackendUsage] = field(default_factory=dict)

    def draws(self, backend: str) -> tuple[int, int]:
        """(fewest, most) draws sent to ``backend``: one iteration, ``max_iter`` iterations."""
        usage = self.iteration.get(backend)
        return (0, 0) if usage is None else (usage.draws, usage.draws * self.max_iter)

    def requests(self, backend: str) -> tuple[int, int]:
        """(fewest, most) wire requests to ``backend``."""
        usage = self.iteration.get(backend)
        return (0, 0) if usage is None else (usage.requests, usage.requests * self.max_iter)

    def cost(self, backend: str) -> tuple[float, float] | None:
        """(one iteration's, ``max_iter`` iterations') upper bound of the cost; ``None`` when unknown."""
        usage = self.iteration.get(backend)
        money = None if usage is None else usage.money
        return None if money is None else (reported(money), reported(money * self.max_iter))

    def lines(self, names: Mapping[str, str] | None = None) -> list[str]:
        """The summary's lines for this loop (``names``: how to print each backend)."""
        names = names or {}
        out = [f"{self.loop}: 1 to {self.max_iter} iteration(s) over {self.elements} element(s); per backend "
               "(one iteration to max_iter; prompts from the state counted by shape):"]
        for name in self.iteration:
            draws, requests, cost = self.draws(name), self.requests(name), self.cost(name)
            money = "" if cost is None else f", cost <= {cost[0]:.6g} to {cost[1]:.6g}"
            out.append(f"  {names.get(name, name)}: {draws[0]} to {draws[1]} draw(s), {requests[0]} to {requests[1]} request(s){money}")
        if not self.iteration:
            out.append("  no model calls")
        return out


@dataclass
class CascadeEstimate:
    """An ``outlines.cascade``'s model calls: from every element accepted at stage 0 to every one escalated.

    Each stage is its branch dry-run over every element of the cascade
    (the cache not consulted); a stage that votes (``max_samples``) counts
    its loop from one iteration to ``max_iter``. A verifier's calls are
    not counted.
    """

    #: The label of the first stage's cond.
    cascade: str
    #: Elements the cascade runs over.
    elements: int
    #: Per stage: ``repr(backend) -> BackendUsage`` over every element (a voting stage: one iteration).
    stages: list[dict[str, BackendUsage]] = field(default_factory=list)
    #: Per stage: the ``LoopEstimate``s of its voting loops.
    stage_loops: list[list[LoopEstimate]] = field(default_factory=list)

    def stage_cost(self, stage: int) -> tuple[float, float] | None:
        """(fewest, most) of one stage over every element; ``None`` where a model has no price or bound."""
        low, high = self._money(stage)
        return None if low is None or high is None else (reported(low), reported(high))

    def _money(self, stage: int) -> tuple[Fraction | None, Fraction | None]:
        moneys = [usage.money for usage in self.stages[stage].values()]
        if any(m is None for m in moneys):
            return None, None
        low = high = sum((m for m in moneys if m is not None), Fraction(0))
        for loop in self.stage_loops[stage]:
            for usage in loop.iteration.values():
                if usage.money is None:
                    return None, None
                low += usage.money
                high += usage.money * loop.max_iter
        return low, high

    @property
    def cost(self) -> tuple[float, float] | None:
        """(every element accepted at stage 0, every element escalated to the last stage); ``None``: unknown."""
        moneys = [self._money(stage) for stage in range(len(self.stages))]
        if not moneys or any(low is None or high is None for low, high in moneys):
            return None
        low = moneys[0][0]
        high = sum((m[1] for m in moneys if m[1] is not None), Fraction(0))
        assert low is not None
        return reported(low), reported(high)

    def expected_cost(self, calibration: Any) -> float | None:
        """The cost to expect once a calibration has run: each stage's (upper bound) times the share reaching it.

        ``calibration``: an ``outlines.voting.Calibration`` of this cascade
        (its ``reached``: the share of the examples that reached each stage
        at the chosen threshold). ``None`` where a model has no price.
        """
        shares = list(calibration.reached)
        if len(shares) != len(self.stages):
            raise ValueError(f"{self.cascade}: the calibration has {len(shares)} stage(s), the cascade {len(self.stages)}")
        moneys = [self._money(stage)[1] for stage in range(len(self.stages))]
        if any(m is None for m in moneys):
            return None
        return float(sum(share * float(m) for share, m in zip(shares, moneys) if m is not None))

    def lines(self, names: Mapping[str, str] | None = None) -> list[str]:
        """The summary's lines for this cascade (``names``: how to print each backend)."""
        names = names or {}
        cost = self.cost
        money = "" if cost is None else f"; cost {cost[0]:.6g} (all accepted at stage 0) to {cost[1]:.6g} (all escalated)"
        out = [f"cascade {self.cascade}: {len(self.stages)} stage(s) over {self.elements} element(s){money}"]
        for stage, usage in enumerate(self.stages):
            parts = [f"{names.get(name, name)}: {u.draws} draw(s)" for name, u in usage.items()]
            parts += [f"{names.get(name, name)}: {loop.draws(name)[0]} to {loop.draws(name)[1]} draw(s)"
                      for loop in self.stage_loops[stage] for name in loop.iteration]
            spent = self.stage_cost(stage)
            out.append(f"  stage {stage}, if every element reaches it: " + (", ".join(parts) or "no model calls")
                       + ("" if spent is None else f", cost <= {spent[1]:.6g}"))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"cascade": self.cascade, "elements": self.elements, "cost": self.cost,
                "stages": [{name: u.to_dict() for name, u in usage.items()} for usage in self.stages]}


@dataclass
class Explanation:
    """What evaluating some Variables would do; see ``explain``."""

    #: Nodes of the plan the run uses, by kind: a stacked node counts once, as the run's trace counts it.
    nodes_by_kind: dict[str, int]
    batches: list[PredictedBatch]
    draws: int
    cache_hits: int
    deduplicated: int  # known draws that another draw of the same prompt and number answers
    unknown_draws: int
    unknown_nodes: list[str]
    #: model calls predicted in one batch although they wait on different Python steps
    timing_dependent: list[str] = field(default_factory=list)
    #: One line per loop or branch node: its body (not counted above: iterations are unknown in advance).
    control: list[str] = field(default_factory=list)
    #: ``repr(backend) -> BackendUsage``: tokens (after cache hits and dedup), requests, cost.
    usage: dict[str, BackendUsage] = field(default_factory=dict)
    #: One ``LoopEstimate`` per ``while_loop`` node of the plan (loops that stack: one over all their
    #: elements, as the run iterates them): its calls as a range (not counted above).
    loops: list[LoopEstimate] = field(default_factory=list)
    #: One ``CascadeEstimate`` per ``outlines.cascade``: its cost as a range (not counted above).
    cascades: list[CascadeEstimate] = field(default_factory=list)
    #: ``label -> (first, last)`` draw number of each sampling model call (greedy calls are
    #: one draw, 0): they depend on the calls on the same prompt evaluated with it.
    draw_numbers: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: ``repr(backend) -> how the summary names it`` (``kind: model`` in full, told apart by number).
    names: dict[str, str] = field(default_factory=dict)

    @property
    def draws_range(self) -> tuple[int, int]:
        """(fewest, most) draws, loops included (``draws`` when there is no loop)."""
        low = sum(loop.draws(name)[0] for loop in self.loops for name in loop.iteration)
        high = sum(loop.draws(name)[1] for loop in self.loops for name in loop.iteration)
        return self.draws + low, self.draws + high

    @property
    def requests_range(self) -> tuple[int, int]:
        """(fewest, most) wire requests, loops included (``requests`` when there is no loop)."""
        low = sum(loop.requests(name)[0] for loop in self.loops for name in loop.iteration)
        high = sum(loop.requests(name)[1] for loop in self.loops for name in loop.iteration)
        return self.requests + low, self.requests + high

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of every predicted batch (known prompts)."""
        return sum(u.prompt_tokens for u in self.usage.values())

    @property
    def cached_tokens(self) -> int:
        """An estimate of the prompt tokens a prompt cache or a shared prefill will serve (see the module docstring)."""
        return sum(u.cached_tokens for u in self.usage.values())

    @property
    def completion_tokens(self) -> int | None:
        """Upper bound of the completion tokens (``None``: some call sets no ``max_tokens``)."""
        bounds = [u.completion_tokens for u in self.usage.values()]
        return None if None in bounds else sum(b for b in bounds if b is not None)

    @property
    def cost(self) -> float | None:
        """Upper bound of the money spent (``None`` when a backend has no price or no bound)."""
        money = [u.money for u in self.usage.values()]
        return None if None in money else reported(sum((m for m in money if m is not None), Fraction(0)))

    @property
    def requests(self) -> int:
        """Wire requests the batches would send (a chat batch sends one per prompt; a local call is one)."""
        return sum(batch.wire_requests for batch in self.batches)

    @property
    def batching_exact(self) -> bool:
        """Whether the predicted batches hold whatever the timing of Python steps."""
        return not self.timing_dependent

    @property
    def batches_per_backend(self) -> dict[str, int]:
        """``repr(backend) -> batches`` (backend calls)."""
        counts: dict[str, int] = {}
        for batch in self.batches:
            counts[batch.backend] = counts.get(batch.backend, 0) + 1
        return counts

    @property
    def requests_per_backend(self) -> dict[str, int]:
        """``repr(backend) -> wire requests``."""
        counts: dict[str, int] = {}
        for batch in self.batches:
            counts[batch.backend] = counts.get(batch.backend, 0) + batch.wire_requests
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
            "batches_per_backend": self.batches_per_backend,
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
            "usage": {name: u.to_dict() for name, u in self.usage.items()},
            "loops": [dict(asdict(loop), iteration={name: u.to_dict() for name, u in loop.iteration.items()})
                      for loop in self.loops],
            "draw_numbers": {label: list(span) for label, span in self.draw_numbers.items()},
            "draws_range": list(self.draws_range),
            "requests_range": list(self.requests_range),
            "cascades": [cascade.to_dict() for cascade in self.cascades],
        }

    def summary(self) -> str:
        kinds = ", ".join(f"{count} {kind}" for kind, count in self.nodes_by_kind.items())
        lines = [f"outlines explain (dry run, nothing sent): {sum(self.nodes_by_kind.values())} nodes ({kinds})"]
        rows: dict[tuple[str, int], list[int]] = {}
        for batch in self.batches:
            rows.setdefault((batch.backend, batch.level), []).append(batch.size)
        names = self.names
        width = max([44] + [len(names.get(backend, backend)) + 2 for backend, _ in rows])
        if rows:
            lines.append(f"  {'backend':<{width}}{'level':>6}{'batches':>9}{'draws':>9}  sizes")
        for (backend, level), sizes in rows.items():
            shown = " ".join(map(str, sizes[:6])) + (" ..." if len(sizes) > 6 else "")
            lines.append(f"  {names.get(backend, backend):<{width}}{level:>6}{len(sizes):>9}{sum(sizes):>9}  {shown}")
        per_backend = ", ".join(f"{names.get(b, b)}: {n}" for b, n in self.batches_per_backend.items())
        requests, draws = self.requests_range, self.draws_range
        looped = " (loops: 1 to max_iter iterations)" if self.loops else ""
        lines.append(f"  batches: {len(self.batches)}" + (f" ({per_backend})" if per_backend else "")
                     + f"; requests: {_span(requests)}{looped}")
        for name, usage in self.usage.items():
            if usage.jobs:
                mixed = any(b.backend == name and not b.jobs for b in self.batches)
                live = ", the draws below live" if mixed else ", no live request"
                lines.append(f"  batch mode: {name}: {usage.rounds} round(s), {usage.jobs} provider job(s) "
                             f"at the batch price{live}")
            elif usage.constraints:
                lines.append(f"  batch mode: {name}: no provider job, every draw live")
            lines.extend(f"    {note}" for note in usage.constraints)
        lines.append(
            f"  draws: {_span(draws)}; cache hits known in advance: {self.cache_hits}; "
            f"duplicates merged: {self.deduplicated}"
        )
        for name, usage in self.usage.items():
            bound = "unbounded (no max_tokens)" if usage.completion_tokens is None else f"<= {usage.completion_tokens}"
            counted = "exact" if usage.exact else "estimated: 4 characters a token"
            if usage.unknown_prompts:
                counted += f"; {usage.unknown_prompts} prompt(s) computed from model outputs not counted"
            cost = "" if usage.cost is None else f"; cost <= {usage.cost:.6g} (prompts {usage.prompt_cost:.6g})"
            if usage.quirks:
                cost += f"; server quirks known: {', '.join(usage.quirks)} (requests counted with them)"
            cached = f", about {usage.cached_tokens} of them cached (an estimate" if usage.cached_tokens else ""
            if cached:
                saving = usage.cache_saving
                cached += ")" if not saving else f": the cost would be about {saving:.6g} less)"
            lines.append(
                f"  {names.get(name, name)}: {usage.requests} request(s) in {usage.batches} batch(es); tokens: "
                f"{usage.prompt_tokens} prompt ({counted}){cached}, completion {bound}{cost}"
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
        lines.extend(f"  {line}" for loop in self.loops for line in loop.lines(names))
        lines.extend(f"  {line}" for cascade in self.cascades for line in cascade.lines(names))
        shifted = [(label, span) for label, span in self.draw_numbers.items() if span[0] > 0]
        if shifted:
            shown = ", ".join(f"{label} {_span(span).replace(' to ', '-')}" for label, span in shifted[:6])
            lines.append(f"  draw numbers: {shown}{' ...' if len(shifted) > 6 else ''} (after earlier calls on the "
                         "same prompt evaluated with them: evaluated alone, a call starts at draw 0)")
        lines.append("  prediction: " + ("exact" if self.exact else "an estimate (see the lines above)"))
        return "\n".join(lines)

    __str__ = summary

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from outlines.graph.viz.writers import text_mimebundle

        return text_mimebundle(self.summary(), "outlines-explain")

    def _repr_html_(self) -> str:
        return self._repr_mimebundle_()["text/html"]


def _span(bounds: tuple[int, int]) -> str:
    """``3`` or ``3 to 15``."""
    return str(bounds[0]) if bounds[0] == bounds[1] else f"{bounds[0]} to {bounds[1]}"


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


def _partial(inputs: list[Any]) -> bool:
    """Whether some input element is unknown."""
    return any(x is UNKNOWN for value in inputs for x in _flat(value))


def _perform(node: Apply, inputs: list[Any]) -> list[Any]:
    result = node.op.perform(*inputs)
    return list(result) if len(node.outputs) > 1 else [result]


def _shapes_only(node: Apply, inputs: list[Any], members: Sequence[Apply] | None = None) -> list[Any]:
    """Outputs of unknown elements, of the shapes the op infers from its inputs' (``None``: not even that).

    The shapes ``outlines.graph.shapes.propagate`` gives, as every entry
    point checks them; a pairing it refuses is the run's error to raise.
    A stacked node (``members``: the nodes it stands for) gives its
    members' outputs along a new leading axis, whatever its op can infer
    (a loop over many elements cannot: over one each, its members can).
    """
    if members is not None:
        shapes = [None if v.shape is None else (len(members), *v.shape) for v in members[0].outputs]
    else:
        try:
            found = propagate([node], {id(v): shape_of(value) for v, value in zip(node.inputs, inputs)})
        except GraphBuildError:
            return [None] * len(node.outputs)
        shapes = [found.get(id(v), v.shape) for v in node.outputs]
    return [_unknown(cast("tuple[int, ...]", shape)) if shape is not None and None not in shape else None
            for shape in shapes]


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
    Predicted queues are the batcher's own ``BatchQueue``, one per (level,
    backend, params less the constraint); ``unknown`` holds, per queue, the
    draws per prompt of each prompt that cannot be known.
    """

    def __init__(self, plan: Plan, cache: Any, values: dict[int, Any], jobs: Any = None) -> None:
        self.plan = plan
        self.jobs = jobs  # batch mode's ``Jobs`` (None: live)
        self.cache = cache
        self.values = values
        self.levels: dict[int, int] = {}
        self.waits: dict[int, frozenset[int]] = {}
        self.queues: dict[tuple[int, Any, Any], BatchQueue] = {}
        self.unknown: dict[tuple[int, Any, Any], list[int]] = {}
        self.nodes: dict[tuple[int, Any, Any], list[tuple[str, frozenset[int]]]] = {}
        self.constraints: dict[Any, dict[Any, None]] = {}  # backend -> the constraints of its calls, in order
        self.sent: dict[Slot, dict[Any, int]] = {}  # per slot, prompt -> level its draw is first sent at
        self.draws = self.hits = self.unknown_draws = 0
        self.unknown_nodes: list[str] = []
        self.loops: list[tuple[str, int, int, _DryRun]] = []  # (label, max_iter, elements, one iteration's run)
        self.stages: list[tuple[Any, str, int, _DryRun]] = []  # (tally, label, elements, the stage's run): cascades
        self.current_waits: frozenset[int] = frozenset()
        self.level = 0  # the level of the node being walked (a model call with misses adds one)

    def run(self) -> None:
        steps, scatter = walker(self), self.plan.scatter
        for position, node in enumerate(self.plan.nodes):
            waits: frozenset[int] = frozenset().union(*(self.waits.get(id(v), frozenset()) for v in node.inputs))
            run = node.op.traits.run
            if run is Run.PYTHON and python_step(node.op).function.blocking is not False:
                waits = waits | {position}  # it may run in the thread pool, for as long as it takes
            self.current_waits = waits
            self.level = max((self.levels.get(id(v), 0) for v in node.inputs), default=0)
            inputs = [self.values.get(id(v), None) for v in node.inputs]
            if any(id(v) not in self.values for v in node.inputs) and not _cascade_stage(node):
                results: list[Any] = [None] * len(node.outputs)
                if run is Run.GENERATE:
                    self.unknown_nodes.extend(self.labels(node))
                    self.level += 1
            else:
                results = steps[run](position, node, inputs)
            for output, value in zip(node.outputs, results):
                self._store(output, value, waits)
            if scatter and id(node) in scatter:  # a stacked node: the elements that nodes left out read
                whole = results[0]
                for variable, element in scatter[id(node)]:
                    value = scalar_or_array(whole[element]) if isinstance(whole, np.ndarray) else whole
                    self._store(variable, value, waits)

    def _store(self, variable: Variable, value: Any, waits: frozenset[int]) -> None:
        """Note ``variable``'s level, waits and value (``None``: not even its shape is known)."""
        self.levels[id(variable)] = self.level
        if waits:
            self.waits[id(variable)] = waits
        if value is not None:
            self.values[id(variable)] = value

    def labels(self, node: Any) -> list[str]:
        """The calls ``node`` stands for, by label: itself, or each member of a stacked node (``Plan.members``)."""
        members = self.plan.members.get(id(node))
        return [node.label] if members is None else [member.label for member in members]

    # -- each kind of node (the scheduler's dispatch: ``outlines.runtime.scheduler.walker``) --
    def inline(self, index: int, node: Apply, inputs: list[Any]) -> list[Any]:
        """Cheap ops run on what is known; structural and elementwise ones carry UNKNOWN elements along."""
        op = node.op
        if not _partial(inputs):
            return _perform(node, inputs)
        if op.traits.moves_unknown:
            return [op.perform(*inputs, unknown=UNKNOWN)]  # structural or template ops
        if op.traits.elementwise or isinstance(op, Stack):
            perform = op.perform
            scalar = lambda *xs: UNKNOWN if any(x is UNKNOWN for x in xs) else perform(*xs)  # noqa: E731
            return [perform(*inputs) if isinstance(op, Stack) else broadcast_map(scalar, inputs)]
        return _shapes_only(node, inputs, self.plan.members.get(id(node)))

    def python(self, index: int, node: Apply, inputs: list[Any]) -> list[Any]:
        """User functions run only when declared pure and synchronous, on known values; else shapes."""
        step = python_step(node.op)
        if step.traits.pure and not step.function.is_async and not _partial(inputs):
            return _perform(node, inputs)
        return _shapes_only(node, inputs, self.plan.members.get(id(node)))

    def control(self, index: int, node: Apply, inputs: list[Any]) -> list[Any]:
        """Loops and branches: their iterations are unknown in advance; a loop's body is dry-run once (``LoopEstimate``)."""
        if isinstance(node.op, WhileLoop):
            self.iteration(node, node.op, inputs)
        elif _cascade_stage(node):
            self.stage(node, cast(Cond, node.op), inputs)
            if any(id(v) not in self.values for v in node.inputs):  # after an earlier stage: nothing known
                return [None] * len(node.outputs)
        return _shapes_only(node, inputs, self.plan.members.get(id(node)))

    def iteration(self, node: Apply, op: WhileLoop, inputs: list[Any]) -> None:
        """Dry-run one iteration of a loop's body (the run's body plan) over all its elements, the cache unconsulted."""
        try:
            shape = loop_shape(node, inputs)
        except ValueError:
            return  # eval raises it, naming the loop
        size, run = _dry_run(op.body, inputs[len(op.body.parameters):], shape, None)
        self.loops.append((node.label, op.max_iter, size, run))

    def stage(self, node: Apply, op: Cond, inputs: list[Any]) -> None:
        """Dry-run a cascade stage's branch over every element of the cascade (the cache unconsulted)."""
        try:
            shape = loop_shape(node, inputs)
        except ValueError:
            return  # eval raises it, naming the cond
        branch = op.branches[0]
        captured = inputs[1 + op.noperands : 1 + op.noperands + len(branch.captured)]
        size, run = _dry_run(branch, captured, shape, self.jobs)
        self.stages.append((op.tally, node.label, size, run))

    def generate(self, index: int, node: Apply, inputs: list[Any]) -> list[Any]:
        """A model call's draws: cache hits known now, misses queued at the next level, unknown prompts counted."""
        op: ModelCall[Backend] = model_call(node.op)
        prompt, level = inputs[0], self.level
        per_prompt = 1 if op.params.deterministic else op.num_samples
        count = int(np.size(prompt)) * op.num_samples
        if count > MAX_CHECKED_DRAWS * len(self.plan.members.get(id(node), (node,))):
            # too many to look up one by one (per call: a stacked node stands for many): count them, cache unchecked
            self.draws += count
            self.unknown_draws += count
            self.queue(level + 1, op, self.labels(node), [per_prompt] * int(np.size(prompt)))
            self.level = level + 1
            shape = np.shape(prompt) + ((op.num_samples,) if op.sample_axis else ())
            return [_unknown(shape)]
        elements = _flat(prompt)
        known = [x is not UNKNOWN for x in elements]
        texts = [x if ok else "" for x, ok in zip(elements, known)]
        value = np.array(texts, dtype=object).reshape(np.shape(prompt)) if np.ndim(prompt) else texts[0]
        shape, texts, numbers = op.columns(value, self.plan.draw_offsets.get(id(node), 0))
        k = len(numbers)
        self.draws += len(texts) * k
        unique = list(dict.fromkeys(t for t, ok in zip(texts, known) if ok))
        results: list[Any] = [UNKNOWN] * (len(texts) * k)
        misses: dict[Slot, list[Any]] = {}
        looked: dict[Slot, tuple[dict[Any, Any], set[Any]]] = {}
        for j, number in enumerate(numbers):
            slot = Slot(op.params, number)
            if slot not in looked:  # a greedy call's draw numbers are all 0: one slot, looked up once
                batch = DrawColumns.in_slot(slot, unique)
                values = cached_values(self.cache, op.backend, batch, record=False)  # a dry run counts no hits
                found = {p: v for p, v in zip(unique, values) if v is not None}
                # With a cache, a draw sent at an earlier level is stored by the time it recurs.
                earlier = self.sent.get(slot, {}) if self.cache is not None else {}
                hit = {p for p in unique if p in found or earlier.get(p, level + 1) <= level}
                looked[slot] = (found, hit)
                misses[slot] = [p for p in unique if p not in hit]
            found, hit = looked[slot]
            self.hits += sum(1 for t, ok in zip(texts, known) if ok and t in hit)
            for element, (text, ok) in enumerate(zip(texts, known)):
                if ok:
                    results[element * k + j] = found.get(text, UNKNOWN)
        unknown = known.count(False)
        self.unknown_draws += unknown * k
        output = results[0] if not shape else np.array(results, dtype=object).reshape(shape)
        if not any(misses.values()) and not unknown:
            return [output]
        queue = self.queue(level + 1, op, self.labels(node), [per_prompt] * unknown)
        for slot, prompts in misses.items():
            queue.slot(slot).add(dict.fromkeys(prompts))
            sent = self.sent.setdefault(slot, {})
            for prompt in prompts:
                sent.setdefault(prompt, level + 1)
        self.level = level + 1
        return [output]

    def queue(self, level: int, op: ModelCall[Backend], labels: list[str], unknown: list[int]) -> BatchQueue:
        """The predicted queue of ``op``'s backend and params at ``level``, with groups of ``unknown`` draws more.

        ``labels``: the model calls that add their draws (those of a stacked node: each it stands for).
        """
        key = (level, *queue_key(op.backend, op.params))  # the scheduler's queues (constraints share one)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = BatchQueue(op.backend)
        self.nodes.setdefault(key, []).extend((label, self.current_waits) for label in labels)
        self.unknown.setdefault(key, []).extend(unknown)
        if op.params.constraint is not None:
            self.constraints.setdefault(op.backend, {})[op.params.constraint] = None
        return queue

    def batches(self) -> list[PredictedBatch]:
        """The batches of every predicted queue: the batcher's own packing (``pack_draws``) of its draws."""
        out: list[PredictedBatch] = []
        for key, queue in sorted(self.queues.items(), key=lambda item: item[0][0]):
            labels = [label for label, _ in self.nodes[key]]
            backend, max_tokens = queue.backend, key[2].max_tokens
            draws, _ = queue.take()
            warm: set[str] = set()  # heads a provider holds from an earlier batch of this queue
            as_jobs = self.jobs is not None and has_jobs(backend)
            per_job = job_client(backend, **self.jobs.limits()).limits.requests if as_jobs else 0
            for batch in pack_draws(backend, draws, self.unknown[key], jobs=as_jobs):
                known, unknown = batch.draws, batch.unknown
                prompt_tokens, completion = backend.usage_bound(known) if known else (0, 0)
                if completion is not None and unknown:
                    completion = None if max_tokens is None else completion + max_tokens * unknown
                requests = backend.requests_for(known) if known else 0
                if unknown:  # an HTTP backend: one request per unknown prompt at most; others: one call
                    requests += unknown if backend.sends_requests else (0 if known else 1)
                jobs = -(-requests // per_job) if batch.jobs else 0
                out.append(PredictedBatch(repr(backend), key[0], batch.size, unknown, list(labels), prompt_tokens,
                                          completion, requests, _estimated_cached(backend, known, warm), jobs))
        return out

    def usage(self, batches: list[PredictedBatch], prices: Any) -> dict[str, BackendUsage]:
        """Per backend: batches, requests, tokens and cost of ``batches``."""
        backends = {repr(queue.backend): queue.backend for queue in self.queues.values()}
        out: dict[str, BackendUsage] = {}
        for batch in batches:
            usage = out.setdefault(batch.backend, BackendUsage())
            usage.batches += 1
            usage.draws += batch.size
            usage.requests += batch.wire_requests
            usage.prompt_tokens += batch.prompt_tokens
            usage.cached_tokens += batch.cached_tokens
            usage.exact = backends[batch.backend].tokens_exact
            usage.unknown_prompts += batch.unknown
            usage.jobs += batch.jobs
            if batch.jobs:
                usage.job_prompt_tokens += batch.prompt_tokens
                usage.job_completion_tokens += batch.completion_tokens or 0
            if usage.completion_tokens is not None:
                usage.completion_tokens = None if batch.completion_tokens is None else (
                    usage.completion_tokens + batch.completion_tokens)
        for name, usage in out.items():
            usage.quirks = sorted(getattr(backends[name], "known_quirks", ()))
            usage.rounds = len({b.level for b in batches if b.backend == name and b.jobs})
            if self.jobs is not None and has_jobs(backends[name]):  # batch mode, live-routed draws included
                usage.constraints = [_job_constraint(backends[name], c)
                                     for c in self.constraints.get(backends[name], ())]
            usage.price = price_of(backends[name], prices)
        return dict(sorted(out.items()))

    def timing_dependent(self) -> list[str]:
        """Model calls sharing a predicted batch while waiting on different Python steps.

        The calls of one stacked node wait as that node does, on every step
        its array waits on: they are sent together, however many there are.
        """
        labels: list[str] = []
        for calls in self.nodes.values():
            if len({waits for _, waits in calls}) > 1:
                labels.extend(label for label, _ in calls)
        return labels

def _dry_run(graph: Subgraph, captured: Sequence[Any], shape: tuple[int, ...], jobs: Any) -> tuple[int, _DryRun]:
    """Dry-run a loop's body or a cond's branch once over its ``shape`` of elements, the cache unconsulted.

    Its parameters are unknown, its stand-ins take the ``captured`` values
    (broadcast to ``shape`` and flattened); it is planned as the run plans
    it (``runtime.control._plan``), uncached. Returns the element count and
    the finished dry run.
    """
    size = int(np.prod(shape, dtype=np.int64))
    plan = Plan(list(graph.outputs))
    values: dict[int, Any] = {id(c): c.value for c in plan.constants}
    for parameter in graph.parameters:
        values[id(parameter)] = _unknown((size,))
    for stand_in, value in zip(graph.stand_ins, captured):
        values[id(stand_in)] = np.broadcast_to(value, shape).reshape(-1) if isinstance(value, np.ndarray) else value
    run = _DryRun(plan, None, values, jobs)
    run.run()
    return size, run



def _estimated_cached(backend: Backend, draws: DrawColumns, warm: set[str]) -> int:
    """Prompt tokens of one batch that a prompt cache or a shared prefill would serve: an estimate.

    Each prefix group's head (``Backend.prefix_min_head`` characters or more,
    and ``cache_min_tokens`` tokens where the backend has such a minimum) is
    paid by its first prompt and served to the others; a provider
    (``sends_requests``) also serves it to the first prompt once an earlier
    batch of the queue carried it (``warm``, updated here).
    """
    min_head = backend.prefix_min_head
    if min_head is None or not draws:
        return 0
    prompts = list(dict.fromkeys(draws.prompts))  # a prompt's samples read its head once it is there
    try:
        found = prefix_groups(prompts, min_head)
    except TypeError:  # prompts that are not all text: no head to estimate
        return 0
    least = getattr(backend, "cache_min_tokens", 1)
    cached = 0
    for head, members in found.groups():
        text = prompts[members[0]][:head]
        if head < min_head or not isinstance(text, str):
            continue
        tokens = backend.count_tokens(text)
        if tokens < least:
            continue
        cached += tokens * (len(members) - (0 if text in warm else 1))
        if backend.sends_requests:
            warm.add(text)
    return cached


def _job_constraint(backend: Backend, constraint: Any) -> str:
    """How ``constraint`` travels in ``backend``'s job lines, and what a draw that breaks it costs."""
    from outlines.backends.hosted import HostedBackend

    field = backend.constraint_field(constraint, job=True) if isinstance(backend, HostedBackend) else None
    retries = backend.max_retries
    if field is None:
        return (f"{constraint.kind}=: not expressible in the provider's job requests: these draws run live, "
                f"checked here, a draw that breaks it asked again at once, up to {retries} "
                "more")
    return (f"{constraint.kind}=: sent as {field} (the provider enforces it); a draw that still breaks it is asked "
            f"again in a new job round, up to {retries} more (each may take the provider's 24 h): call it live "
            "(jobs=False) to retry at once")


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
        As for ``eval``: draws the cache holds are not sent.
    prices
        A price table, model name -> ``(input_per_1M, output_per_1M)``, for
        models without their own ``price=`` (``outlines.backends.usage``).
    **options
        Other evaluation options (as for ``eval``); with ``jobs=True`` (or
        ``jobs=Jobs(...)``) the OpenAI and Anthropic calls are predicted as
        provider jobs: one batch per round, its ``jobs`` (split at the
        provider's request limit) and the batch price.

    Returns
    -------
    Explanation
        ``nodes_by_kind``, ``batches`` (backend, level, size: one per
        backend call), ``batches_per_backend``, ``requests`` and
        ``requests_per_backend`` (wire requests), ``cache_hits``, ``unknown_draws``,
        ``timing_dependent`` and ``exact`` (the run will send exactly these
        batches); ``usage`` per backend: batches, wire requests, prompt
        tokens (after cache hits and dedup; exact with the model's tokenizer,
        else estimated), completion tokens as an upper bound (``max_tokens``
        x samples) and cost where a price is known, with the totals
        ``prompt_tokens``, ``completion_tokens`` and ``cost``;
        ``summary()`` (with a caveat line when timing can split a batch) and
        ``to_dict()``.

    Raises
    ------
    GraphBuildError
        When the givens' shapes cannot pair somewhere in the graph, as ``eval``
        raises it (naming the node and both shapes).

    Examples
    --------
    >>> import outlines
    >>> llm = outlines.models.from_function(lambda ps: ps, batched=True)
    >>> q = outlines.string("q")
    >>> len(outlines.explain(llm(llm(q)), givens={"q": ["a", "b"]}, cache=False).batches)
    2
    """
    if not variables:
        raise TypeError("explain needs at least one Variable")
    evaluation = Evaluation.open(Options.check({**options, "cache": cache}))
    plan = Plan(variables)  # the very plan eval runs: sibling calls stacked into array nodes
    values = bind_givens(plan, givens, partial=True)
    check_shapes(plan, values)  # as every entry point: a pairing that cannot work raises before anything
    run = _DryRun(plan, evaluation.cache, values, evaluation.jobs)
    run.run()
    kinds = _kinds(plan)
    sent = sum(queue.pending for queue in run.queues.values())
    merged = run.draws - run.unknown_draws - run.hits - sent
    batches = run.batches()
    usage = run.usage(batches, prices)
    control = [describe(node) for node in plan.nodes if node.op.traits.run is Run.CONTROL]
    loops = [LoopEstimate(label, max_iter, size, body.usage(body.batches(), prices))
             for label, max_iter, size, body in run.loops]
    cascades = _cascades(run, prices)
    runs = [run, *(body for *_, body in run.loops), *(stage for *_, stage in run.stages),
            *(body for *_, stage in run.stages for *_, body in stage.loops)]
    backends = {repr(q.backend): q.backend for r in runs for q in r.queues.values()}
    names = apart({name: label_of(backends[name]) for name in sorted(backends)})
    spans = plan.draw_numbers()  # by creation order, each call a stacked node stands for too
    calls = (call for node in plan.nodes for call in plan.members.get(id(node), (node,)))
    numbers = {call.label: spans[call.order] for call in calls if call.order in spans}
    return Explanation(kinds, batches, run.draws, run.hits, merged, run.unknown_draws, run.unknown_nodes,
                       run.timing_dependent(), control, usage, loops, cascades, numbers, names)


def _cascade_stage(node: Apply) -> bool:
    """Whether ``node`` is a stage of an ``outlines.cascade`` (a counted cond): dry-run even when its input is unknown."""
    return isinstance(node.op, Cond) and node.op.tally is not None


def _cascades(run: _DryRun, prices: Any) -> list[CascadeEstimate]:
    """The cascades of a dry run: its stages grouped by cascade (``tally.group``), in stage order."""
    groups: dict[int, list[tuple[Any, str, int, _DryRun]]] = {}
    for entry in run.stages:
        groups.setdefault(id(entry[0].group), []).append(entry)
    found: list[CascadeEstimate] = []
    for entries in groups.values():
        entries.sort(key=lambda entry: entry[0].index)
        estimate = CascadeEstimate(entries[0][1], entries[0][2])
        found.append(estimate)
        for _, _, _, stage in entries:
            estimate.stages.append(stage.usage(stage.batches(), prices))
            estimate.stage_loops.append([LoopEstimate(loop, max_iter, elements, body.usage(body.batches(), prices))
                                         for loop, max_iter, elements, body in stage.loops])
    return found


def _kinds(plan: Plan) -> dict[str, int]:
    """The plan's nodes by kind, as a run's trace counts them."""
    kinds = {"input": len(plan.inputs), "inline": 0, "python": 0, "generate": 0}
    for node in plan.nodes:
        kind = node.op.traits.run.value
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds
