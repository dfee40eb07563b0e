"""A graph as a picture's data: ``describe`` builds a ``Drawing``.

One ``DrawnNode`` per free input, constant and Apply (a shared node once),
edges in argument order, one colour per backend. A constant whose value occurs
more than once (a default system prompt in every call) is not boxed each time:
its consumers show it as an argument line. Where known, a node shows its
output's shape. With a ``Trace``, each node
also carries what happened when it ran: time, batches, cache, the first line of
its error. Every walk is iterative, and every piece of text passes a redactor
(``outlines.common.labels.redactor``: each model node's backend redacts its own
secrets), so no API key reaches a picture. The writers live in ``writers``.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Mapping

from outlines.graph.basic import Apply, Constant, Op, Variable
from outlines.graph.control import Cond, Subgraph, WhileLoop
from outlines.graph.protocols import model_call
from outlines.graph.traits import Run
from outlines.graph.traversal import ancestors, toposort
from outlines.common.labels import redactor, shorten

__all__ = ["Drawing", "DrawnNode", "describe", "first_line", "structure_keys"]

#: Light colours for backends (ColorBrewer Set3 without its red: red means failure).
PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3", "#bc80bd", "#ccebc5", "#ffed6f")
FAILED_FILL, FAILED_LINE = "#ffd6d6", "#d62728"


@dataclass
class DrawnNode:
    """One box of a picture; ``key`` is unique, ``label`` is the trace's name for it."""

    key: str
    label: str
    kind: str
    title: str
    lines: list[str] = field(default_factory=list)
    op: str | None = None
    backend: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    num_samples: int | None = None
    output: bool = False
    status: list[str] = field(default_factory=list)
    failed: bool = False
    #: The loop or branch whose body this box belongs to (drawn as a cluster), if any.
    cluster: str | None = None
    #: What the node computes from what (``structure_keys``): how a trace of
    #: another, structurally identical graph finds this node.
    structure: str | None = None


@dataclass
class Drawing:
    """Nodes in dependency order, edges ``(source, target, position, label)``, backends."""

    nodes: list[DrawnNode]
    edges: list[tuple[str, str, int, str]]
    backends: list[str]

    def colour(self, backend: str) -> str:
        return PALETTE[self.backends.index(backend) % len(PALETTE)]


def _redactor(nodes: Sequence[Apply]) -> Callable[[str], str]:
    # A model node's op holds its backend; the backend says what its secrets are.
    # Loop and branch bodies are drawn too, so their models are asked as well.
    walked = list(nodes)
    for node in walked:  # grows as bodies are found: an iterative walk, in order
        for _, subgraph in _bodies(node.op):
            walked.extend(subgraph.nodes)
    return redactor(model_call(node.op).backend for node in walked if node.op.traits.run is Run.GENERATE)


def _bodies(op: Op) -> list[tuple[str, Subgraph]]:
    """A loop's or a branch's sub-graphs, each with its role; none for any other op."""
    return op.subgraphs if isinstance(op, (WhileLoop, Cond)) else []


def _constant_title(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "ndim", 0) > 0:
        items = ", ".join(shorten(repr(v), 12) for v in value.reshape(-1)[:3])
        return shorten(f"array{tuple(shape)} [{items}{', …' if value.size > 3 else ''}]", 40)
    return shorten(repr(value), 32)


def _describe_apply(node: Apply, key: str) -> DrawnNode:
    fields: dict[str, Any] = {"kind": "op", "title": node.op.name, **node.op.describe()}
    return DrawnNode(key, node.label, op=type(node.op).__name__, **fields)


def describe(*variables: Variable, trace: Any = None, draws: Mapping[int, tuple[int, int]] | None = None) -> Drawing:
    """The picture of the graph computing ``variables``, as plain data.

    Parameters
    ----------
    *variables
        The outputs to draw; everything they depend on is drawn once.
    trace
        Optional ``Trace`` of an evaluation: nodes then carry their time, batch,
        cache hits and errors.
    draws
        Optional ``apply.order -> (first, last)`` draw numbers of the model
        calls (``Plan.draw_numbers``): a call whose draws do not start at 0
        (another call on the same prompt comes first) says which it takes.

    Returns
    -------
    Drawing
    """
    if not variables:
        raise TypeError("nothing to draw: pass the Variables (or a Program) whose graph to draw")
    variables = tuple(v for value in variables for v in _as_variables(value))
    nodes = toposort(variables)
    redact = _redactor(nodes)
    drawn: list[DrawnNode] = []
    keys: dict[int, str] = {}
    labels: dict[str, int] = {}
    leaves = [v for v in ancestors(variables) if v.owner is None]
    repeats: dict[tuple[str | None, str], int] = {}
    for leaf in leaves:
        if isinstance(leaf, Constant):
            same = (leaf.name, _value_text(leaf.value))
            repeats[same] = repeats.get(same, 0) + 1
    inline: dict[int, str] = {}  # a constant repeated across the graph: written in its consumers, not boxed
    for leaf in leaves:
        if isinstance(leaf, Constant) and repeats[(leaf.name, _value_text(leaf.value))] > 1:
            inline[id(leaf)] = leaf.name or _constant_title(leaf.value)
            continue
        keys[id(leaf)] = _add(drawn, labels, _describe_leaf(leaf, f"n{len(drawn)}"), redact)
    structure = structure_keys(nodes)
    for node in nodes:
        keys[id(node)] = _add(drawn, labels, _describe_apply(node, f"n{len(drawn)}"), redact)
        drawn[-1].structure = structure[id(node)]
        _add_shape(drawn[-1], node.outputs[0])
        span = (draws or {}).get(node.order)
        if span is not None and span[0] > 0:  # numbered after another call on the same prompt
            drawn[-1].lines.append(f"draws {span[0]}" + (f"-{span[1]}" if span[1] > span[0] else ""))
        for position, variable in enumerate(node.inputs):
            if id(variable) in inline:
                name = node.op.argument_name(position, len(node.inputs))
                drawn[-1].lines.append(f"{name + ' = ' if name else ''}{inline[id(variable)]}")
    edges = _edges(nodes, keys, redact)
    for node in nodes:  # control flow (outlines.graph.control): each body drawn as a cluster
        for role, subgraph in _bodies(node.op):
            edges.extend(_describe_body(node, role, subgraph, drawn, labels, keys, redact))
    index = {d.key: d for d in drawn}
    for variable in variables:
        output = keys.get(id(variable.owner) if variable.owner is not None else id(variable))
        if output is not None:
            index[output].output = True
    backends: list[str] = []
    for box in drawn:
        box.title, box.lines = redact(box.title), [redact(line) for line in box.lines]
        box.backend = redact(box.backend) if box.backend is not None else None
        if box.backend is not None and box.backend not in backends:
            backends.append(box.backend)
    if trace is not None:
        _overlay(drawn, trace, redact)
    return Drawing(drawn, edges, backends)


def _describe_body(node: Apply, role: str, subgraph: Any, drawn: list[DrawnNode], labels: dict[str, int],
                   keys: dict[int, str], redact: Callable[[str], str]) -> list[tuple[str, str, int, str]]:
    """Boxes of a loop's (or branch's) sub-graph in one cluster; its outputs feed the node."""
    cluster = f"{node.label} {role}"
    local = dict(keys)
    for stand_in, outer in zip(subgraph.stand_ins, subgraph.captured):  # captured values: edges from the outer boxes
        local[id(stand_in)] = keys[id(outer.owner) if outer.owner is not None else id(outer)]
    for leaf in (v for v in ancestors(subgraph.outputs) if v.owner is None and id(v) not in local):
        box = _describe_leaf(leaf, f"n{len(drawn)}")
        if any(leaf is parameter for parameter in subgraph.parameters):  # Variables refuse ==
            box.lines = ["loop state" if role == "body" else "operand"]
        box.cluster = cluster
        local[id(leaf)] = _add(drawn, labels, box, redact)
    inner = subgraph.nodes
    for apply in inner:
        box = _describe_apply(apply, f"n{len(drawn)}")
        box.cluster = cluster
        local[id(apply)] = _add(drawn, labels, box, redact)
    edges = _edges(inner, local, redact)
    for position, output in enumerate(subgraph.outputs):  # a loop's body ends with cond on the new state
        source = local[id(output.owner) if output.owner is not None else id(output)]
        edges.append((source, keys[id(node)], position, role if position < len(node.outputs) else "cond"))
    return edges


def _as_variables(value: Any) -> tuple[Variable, ...]:
    outputs = value.outputs if hasattr(value, "outputs") and hasattr(value, "inputs") else value  # a Program
    if isinstance(outputs, Variable):
        return (outputs,)
    if isinstance(outputs, tuple) and outputs and all(isinstance(v, Variable) for v in outputs):
        return outputs
    raise TypeError(f"visualize draws Variables; got {type(value).__name__}")


def _edges(nodes: list[Apply], keys: dict[int, str], redact: Callable[[str], str]) -> list[tuple[str, str, int, str]]:
    edges = []
    for node in nodes:
        for position, variable in enumerate(node.inputs):
            source = keys.get(id(variable.owner) if variable.owner is not None else id(variable))
            if source is None:  # a repeated constant, written inside the node
                continue
            label = node.op.argument_name(position, len(node.inputs))
            if variable.owner is not None and len(variable.owner.outputs) > 1:
                label = f"{label} (output {variable.index})".strip()
            edges.append((source, keys[id(node)], position, redact(label)))
    return edges


def _add(drawn: list[DrawnNode], labels: dict[str, int], node: DrawnNode, redact: Callable[[str], str]) -> str:
    node.label = redact(node.label)  # a constant's label is its value: it may hold a secret
    seen = labels.get(node.label, 0)
    labels[node.label] = seen + 1
    if seen:  # two inputs or constants may share a label; keys must not
        node.label = f"{node.label}~{seen + 1}"
    drawn.append(node)
    return node.key


def _describe_leaf(variable: Variable, key: str) -> DrawnNode:
    if isinstance(variable, Constant):
        title = variable.name or _constant_title(variable.value)
        return _add_shape(DrawnNode(key, variable.label, "constant", title, op="Constant"), variable)
    return _add_shape(DrawnNode(key, variable.label, "input", variable.label, ["input"]), variable)


def _add_shape(drawn: DrawnNode, variable: Variable) -> DrawnNode:
    """Show the Variable's shape where it is known (``Variable.shape``; None: unknown)."""
    shape = getattr(variable, "shape", None)
    if shape is not None and drawn.kind != "constant":
        try:
            text = "scalar" if len(shape) == 0 else "shape (" + ", ".join("?" if n is None else str(n) for n in shape) + (",)" if len(shape) == 1 else ")")
        except TypeError:
            return drawn
        drawn.lines.append(text)
    return drawn


def _value_text(value: Any) -> str:
    if isinstance(getattr(value, "shape", None), tuple):
        return f"{type(value).__name__}{value.shape}:" + hashlib.sha1(repr(value.tolist()).encode()).hexdigest()
    return f"{type(value).__name__}:{value!r}"


def structure_keys(nodes: Sequence[Apply]) -> dict[int, str]:
    """``id(node) -> key`` naming what each node computes from what.

    The key hashes the op's name and its inputs' keys (free inputs by name,
    constants by value), so two graphs built by the same code get the same keys
    though their labels differ. Nodes computing the same thing (independent
    draws of one prompt) are told apart by their order in ``nodes``.

    Parameters
    ----------
    nodes
        Apply nodes in dependency order (``toposort``, or a ``Plan``'s nodes).

    Returns
    -------
    dict
    """
    keys: dict[int, str] = {}
    seen: dict[str, int] = {}

    def of(variable: Variable) -> str:
        if variable.owner is not None:
            return f"{keys.get(id(variable.owner), '?')}.{variable.index}"
        if isinstance(variable, Constant):
            return "constant " + _value_text(variable.value)
        return f"input {variable.label}"

    for node in nodes:
        text = f"{type(node.op).__name__} {node.op.name}(" + ", ".join(of(v) for v in node.inputs) + ")"
        key = hashlib.sha1(text.encode()).hexdigest()[:16]
        count = seen.get(key, 0)
        seen[key] = count + 1
        keys[id(node)] = f"{key}~{count}" if count else key
    return keys


def _duration(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def first_line(error: Any) -> str:
    """The first line of an error (``Type: message``), for pictures."""
    if isinstance(error, BaseException):
        text = str(error).strip()
        lines = text.splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "error"


def _overlay(drawn: list[DrawnNode], trace: Any, redact: Callable[[str], str]) -> None:
    records = getattr(trace, "nodes", {}) or {}
    by_structure = {r.structure: r for r in records.values() if getattr(r, "structure", None)}
    batches = {b.id: b for b in getattr(trace, "batches", []) or []}
    for node in drawn:
        if node.kind in ("input", "constant"):
            continue
        # By what it computes first: labels differ between two builds of one graph.
        record = by_structure.get(node.structure) if node.structure else None
        record = record or records.get(node.label)
        if record is None:
            node.status = ["not run"]
            continue
        status = []
        if record.start is not None and record.end is not None:
            queued = getattr(record, "queued", 0.0)
            wait = f" ({_duration(queued)} queued)" if queued >= 0.01 and queued >= 0.05 * (record.end - record.start) else ""
            status.append(_duration(record.end - record.start) + wait)
        ids = list(record.batch_ids or ())
        if ids:
            sizes = ", ".join(str(getattr(batches.get(i), "size", "?")) for i in ids[:4])
            more = ", …" if len(ids) > 4 else ""
            status.append(f"batch{'es' if len(ids) > 1 else ''} {', '.join(map(str, ids[:4]))}{more} (size {sizes}{more})")
        if record.cache_hits or record.cache_misses:
            status.append(f"cache {record.cache_hits or 0} hit / {record.cache_misses or 0} miss")
        failed_batch = next((batches[i] for i in ids if getattr(batches.get(i), "error", None)), None)
        error = record.error or (failed_batch.error if failed_batch is not None else None)
        if error:
            node.failed = True
            count = getattr(record, "failures", 0)
            where = f"{count} elements, first " if count > 1 else ""
            status.append("FAILED: " + where + shorten(redact(first_line(error)), 60))
        node.status = [redact(line) for line in status]
