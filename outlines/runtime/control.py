"""Evaluating control-flow nodes: each iteration or branch is one batched schedule.

The schedule that meets a ``WhileLoop`` or ``Cond`` node runs it as one task
(``run_control``), so independent work goes on meanwhile. A loop keeps its
state as flat arrays over the broadcast shape of its inputs; each iteration
plans nothing new: it evaluates the body's plan (made once, as ``eval``
plans: ``Plan``) on the still-active elements as ONE schedule of
the same evaluation (its cache, executor, limits, budget, error mode and
recorder), then ``cond`` on the new state decides who stays.
Draws inside a control node carry its iteration in their number
(``Evaluation.child``: the draw namespace), so a repeated prompt is a new draw
and a re-run replays finished iterations from the cache.

A stacked control node (``Plan.element_tags``: loops or conds of one
structure, stacked by the plan) runs the same way over the elements of all
its members, each element in its own loop's namespaces (``child`` of an array
of tags) and each failure named by the element's own loop and traced node
(the sub-plans' ``members``: ``_Elements``), as the members run one by one
would; a stacked cond runs its two branches as two schedules side by side.

A cond built with ``catch`` (``outlines.cascade``'s stages) runs its
branches as if under ``errors="return"`` whatever the evaluation's mode: a
failed draw (an error, or one the budget refused) is a ``Failure`` value the
branch's next steps read, not the end of the evaluation; a cond with a
``tally`` tells the recorder what its branch's elements did
(``branch_counted``). ``JobsRunning`` leaves any loop or cond as itself.

The elements a loop stops at ``max_iter`` rather than by ``cond`` are told to
the recorder (``loop_limited``, per loop: a stacked node's elements count for
their own loop); with ``on_max_iter="fail"`` they hold a ``MaxIterError``
``Failure`` or, under ``errors="raise"``, the evaluation raises.
"""
from __future__ import annotations

import asyncio
import copy
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from outlines.common.errors import Failure, JobsRunning, MaxIterError, NodeError
from outlines.graph.basic import Apply
from outlines.graph.control import Cond, Subgraph, WhileLoop, traced_nodes, truth
from outlines.graph.traits import Run
from outlines.runtime.events import Recorder
from outlines.runtime.plan import Plan
from outlines.runtime.session import Evaluation

__all__ = ["run_control"]


#: Runs a plan as one schedule of an evaluation: its outputs and the batches it sent
#: (``outlines.runtime.scheduler.schedule``, handed in by the scheduler that meets the node).
Schedule = Callable[[Plan, dict[int, Any], Evaluation], Awaitable[tuple[list[Any], int]]]


async def run_control(
    evaluation: Evaluation, node: Apply, inputs: list[Any], schedule: Schedule, first_tag: int | np.ndarray = 0,
    members: Sequence[Apply] | None = None,
) -> Any:
    """Evaluate a control node's output value(s) from its input values, each iteration run by ``schedule``.

    ``first_tag`` is the node's first namespace tag (``Plan.tag_offsets``);
    for a stacked node, the first tag of each element (``Plan.element_tags``)
    and ``members``, the loops (or conds) its elements stand for.
    """
    run = _Runner(evaluation, schedule, first_tag, members)
    if isinstance(node.op, WhileLoop):
        return await _run_loop(run, node, node.op, inputs)
    if isinstance(node.op, Cond):
        return await _run_cond(run, node, node.op, inputs)
    raise TypeError(f"{node.label}: {type(node.op).__name__} is not a control-flow op")


# -- plans --------------------------------------------------------------------------
def _plan(evaluation: Evaluation, op: Any, outputs: Sequence[Any]) -> Plan:
    """The plan of a sub-graph, built once per op and set of outputs (the process state's ``plans``)."""
    stack_min = evaluation.tuning.stack_min  # a plan stacks by the tuning it was built with: part of its key
    key = (stack_min, *(id(v) for v in outputs))
    plan: Plan = evaluation.state.plans.get(op, key, lambda: Plan(list(outputs), stack_min=stack_min))
    return plan


# -- one schedule -----------------------------------------------------------------
class _Runner:
    """Runs the sub-plans of one control node: the evaluation, and how to run a schedule of it.

    ``members``: for a stacked node, the node each element stands for
    (``first_tag`` then holds each element's first tag); ``None`` for one node.
    """

    def __init__(self, evaluation: Evaluation, schedule: Schedule, first_tag: int | np.ndarray = 0,
                 members: Sequence[Apply] | None = None) -> None:
        self.evaluation = evaluation
        self.schedule = schedule
        self.first_tag = first_tag
        self.members = members

    async def __call__(self, plan: Plan, values: dict[int, Any], tag: int, rows: np.ndarray) -> tuple[list[Any], int]:
        """Run ``plan`` over the elements ``rows`` in the draw namespace of ``tag``; (outputs, batches sent).

        ``tag`` (the iteration) joins the draw namespace of the enclosing
        control node (``Evaluation.child``), so a loop nested in a loop draws
        anew at each outer iteration; each element of a stacked node joins
        its own node's. The outputs are the sub-graph's own, in order: those
        the sub-plan stacked into an array node picked from it (``Plan.pick``).
        """
        constants = {id(c): c.value for c in plan.constants}
        if self.members is None:
            evaluation = self.evaluation.child(self.first_tag + tag)
            ran = plan
        else:
            tags = self.first_tag
            assert isinstance(tags, np.ndarray)  # a stacked node: a first tag per element
            evaluation = self.evaluation.child(tags[rows] + tag)
            ran = self._labelled(plan, rows)
        outputs, sent = await self.schedule(ran, {**constants, **values}, evaluation)
        return plan.pick(outputs), sent

    def _labelled(self, plan: Plan, rows: np.ndarray) -> Plan:
        """``plan`` whose nodes name, per element, the node traced by that element's own member.

        A node the sub-plan stacked itself (constants only: one element per
        node it stands for, the same for every element of the loop) keeps
        its own ``members``.
        """
        assert self.members is not None
        positions = {node.order: i for i, node in enumerate(traced_nodes(self.members[0].op))}
        labelled = copy.copy(plan)
        labelled.members = {id(node): _Elements(self.members, rows, positions[node.order])
                            for node in plan.nodes if node.order in positions and id(node) not in plan.members}
        labelled.members.update(plan.members)
        return labelled

    def catching(self) -> _Runner:
        """The same runner in an evaluation whose failed elements hold their ``Failure`` (``Cond.catch``)."""
        if self.evaluation.return_failures:
            return self
        options = self.evaluation.options.with_changes(errors="return")
        return _Runner(replace(self.evaluation, options=options), self.schedule, self.first_tag, self.members)

    def name(self, node: Apply, element: int) -> str:
        """Who an element's failure names: the node, or the member the element stands for."""
        return node.label if self.members is None else self.members[element].label

    def owner(self, node: Apply, error: NodeError) -> str:
        """The label of the control node an inner node's failure belongs to (for a stacked node: its member's)."""
        if self.members is not None:
            for member in self.members:
                if any(traced.label == error.node for traced in traced_nodes(member.op)):
                    return member.label
        return node.label


class _Elements(Sequence[Apply]):
    """The nodes one node of a stacked control node's sub-plan stands for, per element: each member's own."""

    def __init__(self, members: Sequence[Apply], rows: np.ndarray, position: int) -> None:
        self.members, self.rows, self.position = members, rows, position

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, element: Any) -> Any:
        if isinstance(element, slice):
            return [self[i] for i in range(len(self))[element]]
        return traced_nodes(self.members[self.rows[element]].op)[self.position]


# -- values -----------------------------------------------------------------------
def _shape(node: Apply, values: Sequence[Any]) -> tuple[int, ...]:
    shapes = [np.shape(v) if isinstance(v, np.ndarray) else () for v in values]
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            f"{node.label}: the state and the outer values it reads do not broadcast together: "
            + ", ".join(str(s) for s in shapes)
        ) from None


def _flat(value: Any, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return np.broadcast_to(value, shape).reshape(-1)
    out = np.empty(int(np.prod(shape, dtype=np.int64)), dtype=object)
    for index in range(out.size):  # element by element: a list value is one element, not a row
        out[index] = value
    return out


def _per_element(node: Apply, what: str, value: Any, count: int) -> np.ndarray:
    """``value`` as ``count`` elements, one per active element."""
    if not isinstance(value, np.ndarray):
        return _flat(value, (count,))
    if value.shape != (count,):
        raise ValueError(
            f"{node.label}: {what} has shape {value.shape} for {count} active element(s); it must give "
            f"one value per element, shape ({count},) (reduce a samples axis with an outlines.fn "
            "signature such as '(n)->()')"
        )
    return value


def _failed(arrays: Sequence[Any], size: int) -> np.ndarray:
    mask = np.zeros(size, dtype=bool)
    for array in arrays:
        if isinstance(array, np.ndarray):
            mask |= np.fromiter((isinstance(x, Failure) for x in array), dtype=bool, count=size)
        elif isinstance(array, Failure):
            mask[:] = True
    return mask


def _first_failure(arrays: Sequence[Any], index: Any) -> Failure:
    for array in arrays:
        value = array[index] if isinstance(array, np.ndarray) else array
        if isinstance(value, Failure):
            return value
    raise AssertionError("no failure at this element")


def _result(node: Apply, arrays: list[np.ndarray], shape: tuple[int, ...]) -> Any:
    outs = [a.reshape(shape) if shape else a[0] for a in arrays]
    return outs[0] if len(node.outputs) == 1 else tuple(outs)


# -- while_loop -------------------------------------------------------------------
async def _run_loop(run: _Runner, node: Apply, op: WhileLoop, inputs: list[Any]) -> Any:
    body = op.body
    count = len(body.parameters)
    shape = _shape(node, inputs)
    size = int(np.prod(shape, dtype=np.int64))
    state = [_flat(v, shape).copy() for v in inputs[:count]]
    captured = [_flat(v, shape) if isinstance(v, np.ndarray) else v for v in inputs[count:]]
    active = np.arange(size)
    failed = _failed([*state, *captured], size)
    if failed.any():  # an element whose inputs failed never enters the loop
        for index in np.flatnonzero(failed):
            failure = _first_failure([*state, *captured], index).skipped(node.label, op.name)
            for array in state:
                array[index] = failure
        active = active[~failed]

    def values(subgraph: Subgraph) -> dict[int, Any]:
        out = {id(p): s[active] for p, s in zip(subgraph.parameters, state)}
        for stand_in, value in zip(subgraph.stand_ins, captured):
            out[id(stand_in)] = value[active] if isinstance(value, np.ndarray) else value
        return out

    if active.size:
        check = _plan(run.evaluation, op, op.condition.outputs)
        schedule = run(check, values(op.condition), 0, active)
        (pred,), _ = await _guarded(run, node, "cond on the initial state", schedule)
        active = _stay(run, node, pred, active, state)
    # cond runs after the last iteration too: the elements it still holds for are the ones max_iter stopped
    step = _plan(run.evaluation, op, body.outputs)
    iteration = 0
    while active.size and iteration < op.max_iter:
        start = time.perf_counter()
        schedule = run(step, values(body), iteration + 1, active)
        results, batches = await _guarded(run, node, f"iteration {iteration + 1}", schedule)
        for position, array in enumerate(state):
            array[active] = _per_element(node, f"body output {position}", results[position], active.size)
        _record(run.evaluation.recorder, node, iteration + 1, int(active.size), batches, start)
        active = _stay(run, node, results[count], active, state)
        iteration += 1
    _limited(run, node, op, active, state, size)
    return _result(node, state, shape)


def _limited(run: _Runner, node: Apply, op: WhileLoop, stopped: np.ndarray, state: list[np.ndarray],
             size: int) -> None:
    """Report the elements ``stopped`` by ``max_iter``, per loop; with ``on_max_iter="fail"`` fail them."""
    if not stopped.size:
        return
    loops = [run.name(node, i) for i in range(size)]  # a stacked node's elements belong to their own loops
    counts: dict[str, list[int]] = {}
    for label in loops:
        counts.setdefault(label, [0, 0])[1] += 1
    for index in stopped:
        counts[loops[index]][0] += 1
    for label, (count, elements) in counts.items():
        if count:
            run.evaluation.recorder.loop_limited(label, count, elements, op.max_iter)
    if op.on_max_iter != "fail":
        return
    for index in stopped:
        label = loops[index]
        error = MaxIterError(f"cond still held after max_iter={op.max_iter} iteration(s) (on_max_iter='fail'); "
                             f"{counts[label][0]} of {counts[label][1]} element(s) of this loop")
        if run.evaluation.options.errors == "raise":
            raise NodeError(label, op.name, error)
        failure = Failure.from_exception(label, op.name, error)
        for array in state:
            array[index] = failure


async def _guarded(run: _Runner, node: Apply, what: str, schedule: Any) -> Any:
    try:
        return await schedule
    except JobsRunning:
        raise  # no failure: the evaluation stops while its jobs run on (a call again collects them)
    except NodeError as exc:
        raise NodeError(run.owner(node, exc), f"{node.op.name}, {what}", exc) from exc


def _stay(run: _Runner, node: Apply, pred: Any, active: np.ndarray, state: list[np.ndarray]) -> np.ndarray:
    """The active elements whose ``cond`` holds; a failed element leaves holding its Failure."""
    values = _per_element(node, "cond", pred, active.size).tolist()
    if all(type(v) is bool for v in values):  # the common case, in one pass
        keep = np.array(values, dtype=bool)
    else:
        keep = np.zeros(active.size, dtype=bool)
        for position, value in enumerate(values):
            if isinstance(value, Failure):
                for array in state:  # cond failed on this element: it leaves holding why
                    if not isinstance(array[active[position]], Failure):
                        array[active[position]] = value
            else:
                keep[position] = truth(f"{run.name(node, int(active[position]))}: cond", value)
    current = [array[active] for array in state]
    failed = _failed(current, active.size)  # the body failed on these: they leave holding the Failure
    return active[keep & ~failed]


def _record(recorder: Recorder, node: Apply, iteration: int, active: int, batches: int, start: float) -> None:
    recorder.loop_iteration(node, iteration, active, batches, start, time.perf_counter())


# -- cond -----------------------------------------------------------------------------
async def _run_cond(run: _Runner, node: Apply, op: Cond, inputs: list[Any]) -> Any:
    if op.catch:  # the branches' failures are values the graph reads (outlines.cascade's stages)
        run = run.catching()
    noperands = op.noperands
    true_branch, false_branch = op.branches
    ntrue = len(true_branch.captured)
    pred, operands = inputs[0], inputs[1 : 1 + noperands]
    captured_t = inputs[1 + noperands : 1 + noperands + ntrue]
    captured_f = inputs[1 + noperands + ntrue :]
    shape = _shape(node, inputs)
    size = int(np.prod(shape, dtype=np.int64))
    flat = [_flat(v, shape) if isinstance(v, np.ndarray) else v for v in inputs]
    failed = _failed(flat, size)
    pred_flat = _flat(pred, shape)
    chosen = np.zeros(size, dtype=bool)
    for index in np.flatnonzero(~failed):
        chosen[index] = truth(f"{run.name(node, int(index))}: pred", pred_flat[index])
    sides = [np.flatnonzero(chosen & ~failed), np.flatnonzero(~chosen & ~failed)]
    outputs: list[Any] = []
    values: dict[int, Any] = {}
    parts: list[tuple[list[Any], dict[int, Any], np.ndarray]] = []  # per branch that runs: outputs, values, rows
    for branch, captured, rows in zip(op.branches, (captured_t, captured_f), sides):
        if rows.size:
            part: dict[int, Any] = {}
            for parameter, operand in zip(branch.parameters, operands):
                part[id(parameter)] = _flat(operand, shape)[rows]
            for stand_in, value in zip(branch.stand_ins, captured):
                part[id(stand_in)] = _flat(value, shape)[rows] if isinstance(value, np.ndarray) else value
            outputs.extend(branch.outputs)
            values.update(part)
            parts.append((list(branch.outputs), part, rows))
    results: list[Any] = []
    if outputs and run.members is None:  # both branches in one schedule, in the node's namespace
        results, _ = await _guarded(run, node, "branches", run(_plan(run.evaluation, op, outputs), values, 0, sides[0]))
    elif outputs:  # stacked: each branch over its own elements, each in its own namespaces, side by side
        plans = [_plan(run.evaluation, op, outs) for outs, _, _ in parts]
        tasks = [asyncio.ensure_future(_guarded(run, node, "branches", run(plan, part, 0, rows)))
                 for plan, (_, part, rows) in zip(plans, parts)]
        try:
            for outs, _ in await asyncio.gather(*tasks):
                results.extend(outs)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
    merged = _merge(node, results, sides, size, len(node.outputs))
    if op.tally is not None and sides[0].size:  # a counted cond: what the elements of its branch did
        run.evaluation.recorder.branch_counted(node.label, op.tally(merged[0][sides[0]]))
    for index in np.flatnonzero(failed):
        failure = _first_failure(flat, index).skipped(node.label, op.name)
        for array in merged:
            array[index] = failure
    outs = [a.reshape(shape + a.shape[1:]) if shape else a[0] for a in merged]
    return outs[0] if len(outs) == 1 else tuple(outs)


def _merge(node: Apply, results: list[Any], sides: list[np.ndarray], size: int, count: int) -> list[np.ndarray]:
    """Each output's values from the branches that ran, scattered to their elements."""
    per_side: list[list[np.ndarray]] = []
    position = 0
    for rows in sides:
        if not rows.size:
            per_side.append([])
            continue
        side = []
        for value in results[position : position + count]:
            array = value if isinstance(value, np.ndarray) and value.ndim else _flat(value, (rows.size,))
            if array.shape[0] != rows.size:
                raise ValueError(f"{node.label}: a branch returned shape {array.shape} for {rows.size} element(s)")
            side.append(array)
        per_side.append(side)
        position += count
    trailing = [next((s[k].shape[1:] for s in per_side if s), ()) for k in range(count)]
    for k in range(count):
        shapes = {s[k].shape[1:] for s in per_side if s}
        if len(shapes) > 1:
            raise ValueError(f"{node.label}: the branches' output {k} differ in shape per element: {sorted(shapes)}")
    merged = [np.empty((size, *trailing[k]), dtype=object) for k in range(count)]
    for rows, side in zip(sides, per_side):
        for k, array in enumerate(side):
            merged[k][rows] = array
    return merged


def describe(node: Apply) -> str:
    """One line for ``explain``: the control node and the model calls of its body."""
    op = node.op
    if not isinstance(op, (WhileLoop, Cond)):
        raise TypeError(f"{node.label}: {type(op).__name__} is not a control-flow op")
    parts = []
    for role, subgraph in op.subgraphs:
        calls = [n.op.name for n in subgraph.nodes if n.op.traits.run is Run.GENERATE]
        called = ", ".join(dict.fromkeys(calls)) if calls else "no model calls"
        parts.append(f"{role}: {len(subgraph.nodes)} node(s), {called}")
    if isinstance(op, WhileLoop):
        head = f"{node.label} (max_iter={op.max_iter}): one batched schedule per iteration over active elements"
        return f"{head}; {'; '.join(parts)}; iterations unknown in advance"
    return f"{node.label}: each element runs one branch; {'; '.join(parts)}"
