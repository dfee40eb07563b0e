"""A graph as a picture's data: ``describe`` builds a ``Drawing``.

One ``DrawnNode`` per free input, constant and Apply (a shared node once),
edges in argument order, one colour per backend. With a ``Trace``, each node
also carries what happened when it ran: time, batches, cache, the first line of
its error. Every walk is iterative, and every piece of text passes a redactor,
so no API key reaches a picture. The writers live in ``visualize``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outlines.graph.basic import Apply, Constant, Variable
from outlines.graph.traversal import ancestors, toposort

__all__ = ["Drawing", "DrawnNode", "backend_name", "describe", "first_line", "hide_keys", "shorten"]

#: Light colours for backends (ColorBrewer Set3 without its red: red means failure).
PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3", "#bc80bd", "#ccebc5", "#ffed6f")
FAILED_FILL, FAILED_LINE = "#ffd6d6", "#d62728"
_KEY_PATTERN = re.compile(r"\b(sk-[A-Za-z0-9_\-]{3,}|Bearer\s+\S+)")


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


@dataclass
class Drawing:
    """Nodes in dependency order, edges ``(source, target, position, label)``, backends."""

    nodes: list[DrawnNode]
    edges: list[tuple[str, str, int, str]]
    backends: list[str]

    def colour(self, backend: str) -> str:
        return PALETTE[self.backends.index(backend) % len(PALETTE)]


def _redactor(nodes: Sequence[Apply]) -> Callable[[str], str]:
    hooks: list[Callable[[str], str]] = []
    for node in nodes:
        hook = getattr(getattr(getattr(node.op, "backend", None), "client", None), "redact", None)
        if callable(hook) and hook not in hooks:
            hooks.append(hook)

    def redact(text: str) -> str:
        for hook in hooks:
            text = hook(text)
        return hide_keys(text)

    return redact


def hide_keys(text: str) -> str:
    """``text`` with anything shaped like an API key (``sk-...``, ``Bearer ...``) starred out."""
    return _KEY_PATTERN.sub(lambda m: m.group(0)[:3] + "***", text)


def shorten(text: str, limit: int = 40) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def backend_name(backend: Any) -> str:
    """``kind: model`` of a Backend (or of a trace's backend string / identity)."""
    if isinstance(backend, str):
        return backend
    if isinstance(backend, (tuple, list)):
        return ": ".join(str(part) for part in backend[:2])
    return f"{getattr(backend, 'kind', 'backend')}: {getattr(backend, 'model_name', '?')}"


def _constant_title(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "ndim", 0) > 0:
        items = ", ".join(shorten(repr(v), 12) for v in value.reshape(-1)[:3])
        return shorten(f"array{tuple(shape)} [{items}{', …' if value.size > 3 else ''}]", 40)
    return shorten(repr(value), 32)


def _describe_apply(node: Apply, key: str) -> DrawnNode:
    fields: dict[str, Any] = {"kind": "op", "title": node.op.name, **node.op.describe()}
    return DrawnNode(key, node.label, op=type(node.op).__name__, **fields)


def describe(*variables: Variable, trace: Any = None) -> Drawing:
    """The picture of the graph computing ``variables``, as plain data.

    Parameters
    ----------
    *variables
        The outputs to draw; everything they depend on is drawn once.
    trace
        Optional ``Trace`` of an evaluation: nodes then carry their time, batch,
        cache hits and errors.

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
    for leaf in (v for v in ancestors(variables) if v.owner is None):
        keys[id(leaf)] = _add(drawn, labels, _describe_leaf(leaf, f"n{len(drawn)}"))
    for node in nodes:
        keys[id(node)] = _add(drawn, labels, _describe_apply(node, f"n{len(drawn)}"))
    edges = _edges(nodes, keys, redact)
    index = {d.key: d for d in drawn}
    for variable in variables:
        index[keys[id(variable.owner) if variable.owner is not None else id(variable)]].output = True
    backends: list[str] = []
    for box in drawn:
        box.title, box.lines = redact(box.title), [redact(line) for line in box.lines]
        if box.backend is not None and box.backend not in backends:
            backends.append(box.backend)
    if trace is not None:
        _overlay(drawn, trace, redact)
    return Drawing(drawn, edges, backends)


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
            source = keys[id(variable.owner) if variable.owner is not None else id(variable)]
            label = node.op.argument_name(position, len(node.inputs))
            if variable.owner is not None and len(variable.owner.outputs) > 1:
                label = f"{label} (output {variable.index})".strip()
            edges.append((source, keys[id(node)], position, redact(label)))
    return edges


def _add(drawn: list[DrawnNode], labels: dict[str, int], node: DrawnNode) -> str:
    seen = labels.get(node.label, 0)
    labels[node.label] = seen + 1
    if seen:  # two inputs or constants may share a label; keys must not
        node.label = f"{node.label}~{seen + 1}"
    drawn.append(node)
    return node.key


def _describe_leaf(variable: Variable, key: str) -> DrawnNode:
    if isinstance(variable, Constant):
        title = variable.name or _constant_title(variable.value)
        return DrawnNode(key, variable.label, "constant", title, op="Constant")
    return DrawnNode(key, variable.label, "input", variable.label, ["input"])


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
    batches = {b.id: b for b in getattr(trace, "batches", []) or []}
    for node in drawn:
        record = records.get(node.label)
        if node.kind in ("input", "constant"):
            continue
        if record is None:
            node.status = ["not run"]
            continue
        status = []
        if record.start is not None and record.end is not None:
            status.append(_duration(record.end - record.start))
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
            status.append("FAILED: " + shorten(redact(first_line(error)), 60))
        node.status = [redact(line) for line in status]
