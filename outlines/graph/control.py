"""Control flow as graph nodes: ``while_loop``, ``cond`` and ``where``.

``WhileLoop`` and ``Cond`` hold sub-graphs traced once from Python functions.
Tracing calls the function on fresh parameter Variables; the nodes it creates
form the sub-graph, and the outer Variables it reads (inputs, earlier results)
are *captured*: they become inputs of the loop's (or branch's) Apply node and
*stand-ins* inside the sub-graph, so the outer schedule computes them once
and the runtime (``outlines.runtime.control``) hands each iteration only the
elements still active. ``Where`` is the eager elementwise select.
"""
from __future__ import annotations

import inspect
import itertools
from typing import Any, Callable, Sequence

import numpy as np

from outlines.common.errors import GraphBuildError
from outlines.graph import basic
from outlines.graph.basic import Apply, Constant, Op, SymbolicValueError, Variable, as_variable
from outlines.graph.ops import Stack, broadcast_map
from outlines.graph.protocols import model_call
from outlines.graph.shapes import propagate
from outlines.graph.traits import Run, Traits
from outlines.graph.traversal import ancestors, toposort

__all__ = ["Cond", "Subgraph", "WhileLoop", "Where", "cond", "traced_nodes", "truth", "where", "while_loop"]

_serials = itertools.count(1)


class Subgraph:
    """A function traced once: ``parameters`` -> ``outputs``, cut at outer Variables.

    Attributes
    ----------
    parameters
        Fresh free Variables the function was called on.
    outputs
        What it returned, as Variables over a private copy of its nodes.
    captured
        The outer Variables the nodes read, in first-use order.
    stand_ins
        The stand-ins of ``captured`` inside ``outputs``' graph.
    """

    def __init__(self, parameters: Sequence[Variable], outputs: Sequence[Variable], captured: Sequence[Variable],
                 stand_ins: Sequence[Variable]) -> None:
        self.parameters = tuple(parameters)
        self.outputs = tuple(outputs)
        self.captured = tuple(captured)
        self.stand_ins = tuple(stand_ins)

    @property
    def nodes(self) -> list[Apply]:
        return toposort(self.outputs)


def _parameters(fn: Callable[..., Any], count: int, default: str) -> list[Variable]:
    try:
        names = [p.name for p in inspect.signature(fn).parameters.values() if p.kind <= p.POSITIONAL_OR_KEYWORD]
    except (TypeError, ValueError):
        names = []
    names = names[:count] if len(names) >= count else [f"{default}{i}" for i in range(count)]
    return [Variable(name=name) for name in names]


def _call(where: str, role: str, fn: Callable[..., Any], args: Sequence[Variable]) -> Any:
    if not callable(fn):
        raise GraphBuildError(f"{where}: {role} must be a function, got {type(fn).__name__} {fn!r:.60}")
    try:
        return fn(*args)
    except SymbolicValueError as exc:
        raise GraphBuildError(
            f"{where}: {role} {getattr(fn, '__name__', fn)!s} is traced once over symbolic values and cannot "
            f"branch on them in Python ({exc}); use outlines.fn, outlines.where or outlines.cond for "
            "per-element logic"
        ) from exc
    except TypeError as exc:
        if "positional argument" in str(exc):
            raise GraphBuildError(f"{where}: {role} is called with {len(args)} argument(s): {exc}") from exc
        raise


def _structure(where: str, role: str, result: Any, count: int | None) -> tuple[Variable, ...]:
    """``result`` as a tuple of Variables; ``count`` is the structure it must have."""
    items = tuple(result) if isinstance(result, (tuple, list)) and not isinstance(result, str) else (result,)
    if count is not None and len(items) != count:
        raise GraphBuildError(
            f"{where}: {role} returned {len(items)} value(s); it must return {count} "
            f"(the same structure as the state{'' if count == 1 else ': a tuple'})"
        )
    out = []
    for position, item in enumerate(items):
        if isinstance(item, (tuple, list)) and any(isinstance(v, Variable) for v in item):
            raise GraphBuildError(f"{where}: {role} output {position} is a nested {type(item).__name__}; "
                                  "return a flat tuple of Variables")
        out.append(as_variable(item))
    return tuple(out)


def _captured(outputs: Sequence[Variable], parameters: Sequence[Variable], start: int) -> list[Variable]:
    """Outer Variables the traced nodes read: created before ``start``, or free inputs not parameters."""
    params = {id(p) for p in parameters}
    found: dict[int, Variable] = {}
    seen: set[int] = set()
    stack = list(reversed(outputs))
    while stack:
        variable = stack.pop()
        if id(variable) in seen or id(variable) in params:
            continue
        seen.add(id(variable))
        owner = variable.owner
        if owner is None:
            if not isinstance(variable, Constant) or _is_array(variable.value):
                found[id(variable)] = variable  # arrays are sliced to the active elements
        elif owner.order < start:
            found[id(variable)] = variable
        else:
            stack.extend(reversed(owner.inputs))
    return sorted(found.values(), key=_first_use(outputs))


def _first_use(outputs: Sequence[Variable]) -> Callable[[Variable], int]:
    order = {id(v): i for i, v in enumerate(ancestors(outputs))}
    return lambda v: order.get(id(v), 0)


def _is_array(value: Any) -> bool:
    return getattr(value, "ndim", 0) > 0


def clone(outputs: Sequence[Variable], replace: dict[int, Variable]) -> list[Variable]:
    """Copies of ``outputs`` whose graph reads ``replace[id(v)]`` wherever it read ``v``.

    Only the nodes between ``outputs`` and the replaced Variables are copied.
    """
    mapped: dict[int, Variable] = dict(replace)
    for node in _between(outputs, replace):
        inputs = [mapped.get(id(v), v) for v in node.inputs]
        if all(a is b for a, b in zip(inputs, node.inputs)):
            continue
        new = Apply(node.op, inputs, len(node.outputs))
        for old, out in zip(node.outputs, new.outputs):
            out.name = old.name
            mapped[id(old)] = out
    return [mapped.get(id(v), v) for v in outputs]


def _between(outputs: Sequence[Variable], stop: dict[int, Variable]) -> list[Apply]:
    """Apply nodes reachable from ``outputs`` without passing through ``stop``, in creation order."""
    found: dict[int, Apply] = {}
    stack = [v for v in outputs if id(v) not in stop and v.owner is not None]
    while stack:
        node = stack.pop().owner
        if node is None or id(node) in found:
            continue
        found[id(node)] = node
        stack.extend(v for v in node.inputs if id(v) not in stop and v.owner is not None)
    return sorted(found.values(), key=lambda n: n.order)


def trace_subgraph(where: str, parts: Sequence[tuple[str, Callable[..., Any], Sequence[Variable], int | None]]
                   ) -> tuple[list[tuple[Variable, ...]], list[Variable], list[Variable]]:
    """Trace functions once and cut them from the outer graph together.

    ``parts`` holds ``(role, fn, parameters, count)``. Returns each part's
    outputs over private nodes (reading ``stand_ins`` instead of the captured
    Variables), the captured Variables, and their stand-ins.
    """
    start = next(basic._creation_order)
    raw = [_structure(where, role, _call(where, role, fn, params), count) for role, fn, params, count in parts]
    flat = [v for outs in raw for v in outs]
    parameters = [p for _, _, params, _ in parts for p in params]
    captured = _captured(flat, parameters, start)
    stand_ins = [Variable(name=v.label) for v in captured]
    cut = clone(flat, {id(v): s for v, s in zip(captured, stand_ins)}) if captured else flat
    outs, position = [], 0
    for outputs in raw:
        outs.append(tuple(cut[position : position + len(outputs)]))
        position += len(outputs)
    return outs, captured, stand_ins


def _check_boolean(where: str, what: str, variable: Variable) -> None:
    """Reject conditions that are text by construction (a model call, a prompt, ``+``, a string)."""
    owner = variable.owner
    if isinstance(variable, Constant) and not isinstance(variable.value, (bool, np.bool_, np.ndarray)):
        found = f"the constant {variable.value!r:.40}"
    elif owner is not None and (owner.op.traits.run is Run.GENERATE or type(owner.op).__name__ in ("Concat", "Render")):
        found = f"text from {owner.op.name}"
    else:
        return
    raise GraphBuildError(f"{where}: {what} must be a boolean per element, but it is {found}; "
                          "compute a boolean from it with an outlines.fn")


def _check_per_element(where: str, outputs: Sequence[Variable]) -> None:
    """Reject state components that add an axis by construction (samples, a stack)."""
    for position, variable in enumerate(outputs):
        op = variable.owner.op if variable.owner is not None else None
        call = model_call(op) if op is not None and op.traits.run is Run.GENERATE else None
        if (call is not None and call.sample_axis) or isinstance(op, Stack):
            what = f"num_samples={call.num_samples}" if call is not None else "a stack"
            raise GraphBuildError(f"{where}: body output {position} adds an axis ({what}); the state needs one "
                                  "value per element: reduce it with an outlines.fn signature such as '(n)->()'")


def _depends_on(outputs: Sequence[Variable], parameters: Sequence[Variable]) -> bool:
    params = {id(p) for p in parameters}
    return any(id(v) in params for v in ancestors(outputs))


def traced_nodes(op: Any) -> list[Apply]:
    """The nodes a control op traced, over all its sub-graphs, in creation order (found once per op).

    Two loops (or conds) traced from the same Python code have their nodes
    in the same order: position ``i`` of one is position ``i`` of the other.
    """
    found: list[Apply] | None = op.__dict__.get("_traced")
    if found is None:
        found = op.__dict__["_traced"] = toposort([v for _, subgraph in op.traced for v in subgraph.outputs])
    return found


def _signature(op: Any) -> tuple[Any, ...] | None:
    """What two control ops must share to compute the same thing per element: their structure.

    Per traced node (``traced_nodes``): its op (equal by parameters) and
    where each input comes from: a parameter, a stand-in (a captured outer
    Variable), an earlier traced node's output, or a constant's value; then
    where each sub-graph's outputs come from. ``None`` when the op must run
    alone: a nested control node, an op that never stacks (samples) or an
    impure step (kept to one loop per element, as built),
    a model call whose prompt does not read the state (it would draw one
    scalar prompt per member), a constant that is an array or unhashable.
    """
    nodes = traced_nodes(op)
    where: dict[int, tuple[Any, ...]] = {}
    stateful: set[int] = set()  # what reads the state
    for _, subgraph in op.traced:
        for number, parameter in enumerate(subgraph.parameters):
            where[id(parameter)] = ("p", number)
            stateful.add(id(parameter))
        for number, stand_in in enumerate(subgraph.stand_ins):
            where[id(stand_in)] = ("s", number)
    parts: list[Any] = [type(op).__name__, op._structure]
    for position, node in enumerate(nodes):  # one pass: each node's inputs come before it
        inner, inputs = node.op, node.inputs
        run = inner.traits.run
        if run is Run.CONTROL or inner.stacked() is None or not (inner.traits.pure or run is Run.GENERATE):
            return None
        if run is Run.GENERATE and id(inputs[0]) not in stateful:
            return None
        refs = []
        reads = False
        for variable in inputs:
            ref = where.get(id(variable))
            if ref is None:
                if not isinstance(variable, Constant) or _is_array(variable.value):
                    return None
                ref = ("c", type(variable.value), variable.value)
            elif id(variable) in stateful:
                reads = True
            refs.append(ref)
        for index, output in enumerate(node.outputs):
            where[id(output)] = ("n", position, index)
            if reads:
                stateful.add(id(output))
        parts.append((inner, len(node.outputs), tuple(refs)))
    for _, subgraph in op.traced:
        parts.append(tuple(where.get(id(v)) or ("c", type(v), getattr(v, "value", None)) for v in subgraph.outputs))
    signature = tuple(parts)
    try:
        hash(signature)
    except TypeError:  # an unhashable constant or op parameter
        return None
    return signature


class _Control(Op):
    """What loops and conds share: traced sub-graphs, and stacking by structure.

    A control op's identity is its serial (each ``while_loop`` call is its
    own op), but its *kin* (``Op.kin``) is its structure (``_signature``):
    loops traced from the same code on members of one family stack into one
    loop over their arrays (``outlines.runtime.plan``), each element keeping
    its own loop's draw namespace (``outlines.runtime.control``). Their
    uses join build-time families by that structure (``outlines.graph.families``).
    """

    __props__ = ("serial",)
    traits = Traits(run=Run.CONTROL, pure=False)

    @property
    def traced(self) -> list[tuple[str, Subgraph]]:
        """The sub-graphs whose nodes the op traced (a loop's condition and body, a cond's branches)."""
        raise NotImplementedError

    @property
    def _structure(self) -> Any:
        raise NotImplementedError

    @property
    def kin(self) -> Any:
        """Its structure when it can stack, else itself (see ``_signature``)."""
        signature = self.__dict__.get("_signature", False)
        if signature is False:
            signature = self.__dict__["_signature"] = _signature(self)
        return self if signature is None else signature

    def stacked(self) -> Op | None:
        """Itself, over the stacked arrays, when its structure allows (``_signature``); else ``None``."""
        return None if self.kin is self else self


def _scalars(shapes: list[Any]) -> bool:
    return all(shape == () for shape in shapes)


class WhileLoop(_Control):
    """Repeat ``body`` on each element while ``cond`` holds; see ``while_loop``.

    The Apply's inputs are the initial state, then the captured Variables;
    its outputs are the final state.
    """

    def __init__(self, where: str, condition: Subgraph, body: Subgraph, max_iter: int,
                 on_max_iter: str = "keep") -> None:
        self.serial = next(_serials)
        self.where = where
        self.condition = condition  # cond(state)
        self.body = body  # body(state) + cond(body(state)), sharing parameters and stand-ins
        self.max_iter = max_iter
        self.on_max_iter = on_max_iter

    @property
    def name(self) -> str:
        return "while_loop"

    @property
    def subgraphs(self) -> list[tuple[str, Subgraph]]:
        return [("body", self.body)]

    @property
    def traced(self) -> list[tuple[str, Subgraph]]:
        return [("cond", self.condition), ("body", self.body)]

    @property
    def _structure(self) -> Any:
        return self.max_iter, self.on_max_iter

    def infer_shapes(self, shapes: list[Any], noutputs: int) -> list[Any]:
        """A loop over scalars gives scalars (one element); otherwise unknown until it runs."""
        return [() if _scalars(shapes) else None] * noutputs

    def describe(self) -> dict[str, Any]:
        limit = f"max_iter={self.max_iter}" + (", on_max_iter=fail" if self.on_max_iter == "fail" else "")
        return {"kind": "op", "title": "while_loop", "lines": [limit]}

    def argument_name(self, position: int, ninputs: int) -> str:
        count = len(self.body.parameters)
        if position < count:
            return self.body.parameters[position].name or f"state {position}"
        return "captured"


class Cond(_Control):
    """Per element, evaluate one of two branches; see ``cond``.

    The Apply's inputs are the predicate, the operands, then the captured
    Variables of both branches.
    """

    def __init__(self, branches: tuple[Subgraph, Subgraph], noperands: int, catch: bool = False,
                 tally: Callable[[np.ndarray], dict[str, Any]] | None = None) -> None:
        self.serial = next(_serials)
        self.branches = branches
        self.noperands = noperands
        #: The branches run as if under ``errors="return"`` whatever the evaluation's mode: a failed element
        #: (an error, a draw the budget refused) holds its ``Failure`` for the graph to read (``outlines.cascade``).
        self.catch = catch
        #: ``tally(outputs of the true branch) -> counts``, reported to the trace after each run
        #: (``Recorder.branch_counted``): what a cascade stage's elements did. Its ``group`` (shared by
        #: the stages of one cascade) and ``index`` (the stage's) let ``explain`` range the cascade's cost.
        self.tally = tally

    @property
    def name(self) -> str:
        return "cond"

    @property
    def subgraphs(self) -> list[tuple[str, Subgraph]]:
        return [("if true", self.branches[0]), ("if false", self.branches[1])]

    @property
    def traced(self) -> list[tuple[str, Subgraph]]:
        return self.subgraphs

    @property
    def _structure(self) -> Any:
        return self.noperands, self.catch

    def infer_shapes(self, shapes: list[Any], noutputs: int) -> list[Any]:
        """Scalars when every input is one and both branches give scalars on scalars; else unknown."""
        if not _scalars(shapes):
            return [None] * noutputs
        outs: list[list[Any]] = []
        for branch in self.branches:
            known: dict[int, Any] = {id(v): () for v in (*branch.parameters, *branch.stand_ins)}
            found = propagate(toposort(branch.outputs), known)
            outs.append([found.get(id(v), v.shape) for v in branch.outputs])
        return [() if a == () and b == () else None for a, b in zip(*outs)] if len(outs[0]) == noutputs else [None] * noutputs

    def describe(self) -> dict[str, Any]:
        if self.tally is not None:  # a cascade's stage: which, and on which model
            index, model = getattr(self.tally, "index", "?"), getattr(self.tally, "model", "")
            return {"kind": "op", "title": f"cascade stage {index}", "lines": [str(model), "failures caught"]}
        if self.catch:
            return {"kind": "op", "title": "cond", "lines": ["failures caught"]}
        return {"kind": "op", "title": "cond"}

    def argument_name(self, position: int, ninputs: int) -> str:
        if position == 0:
            return "pred"
        if position <= self.noperands:
            return self.branches[0].parameters[position - 1].name or f"operand {position - 1}"
        return "captured"


class Where(Op):
    """Elementwise ``x if pred else y``, both evaluated; see ``where``."""

    traits = Traits(elementwise=True)

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "where"}

    def argument_name(self, position: int, ninputs: int) -> str:
        return ("pred", "x", "y")[position]

    def perform(self, *values: Any) -> Any:
        return broadcast_map(_select, values)


def _select(pred: Any, x: Any, y: Any) -> Any:
    return x if truth("where", pred) else y


def truth(where: str, value: Any) -> bool:
    """A condition's value as a ``bool`` (the scheduler's loops and branches ask it per element).

    Raises
    ------
    TypeError
        For anything but a Python or NumPy boolean, naming ``where``.
    """
    if value is True or value is False or type(value).__name__ == "bool_":
        return bool(value)
    raise TypeError(f"{where}: the condition must be a boolean per element, got {type(value).__name__} {value!r:.60}")


def _as_state(init: Any) -> tuple[tuple[Variable, ...], bool]:
    if isinstance(init, tuple):  # a tuple is the structure of the state; a list is an array
        if not init:
            raise GraphBuildError("while_loop: init is an empty tuple; the loop needs a state")
        return tuple(as_variable(v, array=True) for v in init), True
    return (as_variable(init, array=True),), False


#: What ``while_loop`` does with an element still running after ``max_iter`` iterations.
ON_MAX_ITER = ("keep", "fail")


def while_loop(
    cond: Callable[..., Any], body: Callable[..., Any], init: Any, *, max_iter: int, on_max_iter: str = "keep"
) -> Any:
    """Repeat ``body`` on each element of the state while ``cond`` holds, batched.

    ``cond`` and ``body`` are traced once over symbolic values: they receive
    the state (one Variable per component of ``init``) and may also read outer
    Variables (inputs, earlier results). ``init`` broadcasts against the outer
    Variables they read, so ``init=""`` with an array of questions is one state
    per question. Each iteration evaluates ``body`` only on the elements whose
    ``cond`` is true, as one batched schedule (a loop over 1,000 elements makes
    one backend call per backend per iteration); an element leaves when its
    ``cond`` turns false or after ``max_iter`` iterations. The iteration number
    is part of each draw inside the loop: a repeated prompt is a new draw, a
    re-run replays finished iterations from the cache and resumes where it
    stopped. With ``errors="return"``, an element whose body fails leaves the
    loop holding its ``Failure``. An element that runs out of iterations
    never goes unnoticed: progress and ``Trace.summary()`` say how many did
    (``4 of 15 stopped at max_iter=4``), and ``on_max_iter="fail"`` makes
    them failures.

    Parameters
    ----------
    cond
        ``cond(*state)`` -> a boolean Variable (one per element).
    body
        ``body(*state)`` -> the next state, with the structure of ``init``.
    init
        The initial state: a Variable or value, or a tuple of them.
    max_iter
        The most iterations any element runs (an integer >= 1).
    on_max_iter
        What an element still running after ``max_iter`` iterations holds:
        ``"keep"`` (default) its last state, counted in progress and the
        trace (``Trace.loops_limited``); ``"fail"`` a ``Failure`` of type
        ``MaxIterError`` naming ``max_iter`` (``errors="return"``), or the
        evaluation raises a ``NodeError`` naming the loop
        (``errors="raise"``). Either way ``cond`` also runs after the last
        iteration, so an element that finished on its last iteration is not
        counted.

    Returns
    -------
    Variable or tuple of Variables
        The final state, with the structure of ``init``.

    Raises
    ------
    GraphBuildError
        At build time, naming the loop, when ``max_iter`` is missing or < 1,
        ``on_max_iter`` is not ``"keep"`` or ``"fail"``, ``cond`` or ``body`` return the wrong structure, or do not depend on
        the state.

    Examples
    --------
    >>> import outlines
    >>> grow = outlines.fn(lambda s: s + "a")
    >>> short = outlines.fn(lambda s: len(s) < 3)
    >>> outlines.while_loop(short, grow, init=outlines.constant(""), max_iter=5).eval()
    'aaa'
    >>> cut = outlines.while_loop(short, grow, init=outlines.constant(""), max_iter=2, on_max_iter="fail")
    >>> cut.eval(errors="return").error_type
    'MaxIterError'
    """
    where = f"while_loop(cond={getattr(cond, '__name__', cond)!s}, body={getattr(body, '__name__', body)!s})"
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise GraphBuildError(f"{where}: max_iter must be an integer >= 1, got {max_iter!r}")
    if on_max_iter not in ON_MAX_ITER:
        raise GraphBuildError(f"{where}: on_max_iter must be 'keep' or 'fail', got {on_max_iter!r}")
    state, is_tuple = _as_state(init)
    n = len(state)
    params = _parameters(body, n, "state")
    cond_params = [Variable(name=p.name) for p in params]
    (checked,), captured_c, stand_ins_c = trace_subgraph(where, [("cond", cond, cond_params, 1)])
    (stepped,), captured, stand_ins = trace_subgraph(where, [("body", body, params, n)])
    if not _depends_on(stepped, params):
        raise GraphBuildError(f"{where}: body does not depend on the state; it would compute the same thing "
                              "at every iteration")
    _check_boolean(where, "cond", checked[0])
    _check_per_element(where, stepped)
    if not _depends_on(checked, cond_params):
        raise GraphBuildError(f"{where}: cond does not depend on the state; the loop could never stop early")
    # One set of stand-ins for what cond and body capture: the same outer Variable is one input.
    stand_in_of = {id(v): s for v, s in zip(captured, stand_ins)}
    for variable, stand_in in zip(captured_c, stand_ins_c):
        if id(variable) not in stand_in_of:
            captured.append(variable)
            stand_ins.append(stand_in)
            stand_in_of[id(variable)] = stand_in
    rebind = {id(s): stand_in_of[id(v)] for v, s in zip(captured_c, stand_ins_c)}
    check = clone(checked, {**rebind, **{id(c): p for c, p in zip(cond_params, params)}})
    after = clone(checked, {**rebind, **{id(c): o for c, o in zip(cond_params, stepped)}})
    condition = Subgraph(params, check, captured, stand_ins)
    op = WhileLoop(where, condition, Subgraph(params, [*stepped, *after], captured, stand_ins), max_iter, on_max_iter)
    node = Apply(op, [*state, *captured], n)
    return node.outputs if is_tuple else node.outputs[0]


def cond(pred: Any, if_true: Callable[..., Any], if_false: Callable[..., Any], *operands: Any) -> Any:
    """Per element, evaluate only the chosen branch; merge the results.

    Parameters
    ----------
    pred
        A boolean Variable (one per element).
    if_true, if_false
        Functions of ``*operands`` traced once; they return a Variable or a
        tuple of Variables, of the same structure. They may read outer Variables.
    *operands
        The values the branches receive (Variables or values).

    Returns
    -------
    Variable or tuple of Variables
        Elementwise ``if_true(...)`` where ``pred`` holds, ``if_false(...)``
        elsewhere; each branch saw only its elements, in one schedule.

    Examples
    --------
    >>> import outlines
    >>> q = outlines.string("q")
    >>> is_long = outlines.fn(lambda s: len(s) > 2)
    >>> out = outlines.cond(is_long(q), lambda s: s + "!", lambda s: s + "?", q)
    >>> list(out.eval({"q": ["a", "abc"]}))
    ['a?', 'abc!']
    """
    return _cond(pred, if_true, if_false, operands)


def _cond(pred: Any, if_true: Callable[..., Any], if_false: Callable[..., Any], operands: Sequence[Any],
          catch: bool = False, tally: Callable[[np.ndarray], dict[str, Any]] | None = None) -> Any:
    """``cond``; with ``catch``, the branches' failures are values (``Cond.catch``: ``outlines.cascade``'s stages)."""
    where = "cond"
    pred = as_variable(pred, array=True)
    _check_boolean(where, "pred", pred)
    values = [as_variable(v, array=True) for v in operands]
    params_t = _parameters(if_true, len(values), "operand")
    params_f = _parameters(if_false, len(values), "operand")
    (true_out,), captured_t, stand_ins_t = trace_subgraph(where, [("if_true", if_true, params_t, None)])
    (false_out,), captured_f, stand_ins_f = trace_subgraph(where, [("if_false", if_false, params_f, None)])
    if len(true_out) != len(false_out):
        raise GraphBuildError(f"cond: if_true returned {len(true_out)} value(s) and if_false {len(false_out)}; "
                              "both branches must return the same structure")
    op = Cond((Subgraph(params_t, true_out, captured_t, stand_ins_t), Subgraph(params_f, false_out, captured_f, stand_ins_f)),
              len(values), catch, tally)
    node = Apply(op, [pred, *values, *captured_t, *captured_f], len(true_out))
    single = len(true_out) == 1
    return node.outputs[0] if single else node.outputs


def where(pred: Any, x: Any, y: Any) -> Variable:
    """Elementwise select: ``x`` where ``pred`` is true, else ``y`` (both evaluated).

    The eager counterpart of ``cond``: both sides are computed over every
    element, then paired with ``pred`` on their leading axes.

    Parameters
    ----------
    pred
        A boolean per element (an ``outlines.fn`` returning ``bool``, or a
        boolean constant).
    x, y
        Variables or values; they pair with ``pred`` like any elementwise op.

    Returns
    -------
    Variable

    Raises
    ------
    TypeError
        At evaluation, when an element of ``pred`` is not a boolean (wrapped
        in a ``NodeError`` naming the node).

    Examples
    --------
    >>> import outlines
    >>> outlines.where(outlines.constant(True), "yes", "no").eval()
    'yes'
    >>> is_number = outlines.fn(lambda text: text.isdigit())
    >>> text = outlines.string("text")
    >>> outlines.where(is_number(text), text, "n/a").eval({"text": ["12", "hi"]}).tolist()
    ['12', 'n/a']
    """
    return Where()(pred, x, y)
