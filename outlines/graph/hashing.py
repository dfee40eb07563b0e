"""Content keys of subgraphs, and the numbering of random draws.

A Variable's key hashes its op, the op's parameters and its inputs' keys, so
one key covers a whole subgraph (tinygrad-style). Pure computations with equal
keys compute equal values and may be merged. Impure ones (random model calls,
impure Python functions) get an occurrence number among structurally equal
computations, in creation order: the second identical random call in a graph
is draw ``k``, ``k+1``... after the first one's ``k`` draws. Numbers depend only
on the graph, so re-building the same program replays the same draws.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

import numpy as np

from outlines.graph.basic import Apply, Constant, Variable

__all__ = ["GraphKeys", "constant_key", "graph_keys"]


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def constant_key(value: Any) -> str | None:
    """A key for a constant value, or ``None`` when it has no stable content."""
    if isinstance(value, np.ndarray):
        if value.dtype == object and all(isinstance(v, (str, int, float, bool)) for v in value.flat):
            return _digest(json.dumps(["array", list(value.shape), value.reshape(-1).tolist()]))
        return None
    try:
        return _digest(json.dumps(["const", type(value).__name__, value], sort_keys=True))
    except (TypeError, ValueError):
        return None


class GraphKeys:
    """Keys of every Variable of a graph, and the draw offset of each random call.

    Attributes
    ----------
    keys
        ``id(variable) -> key`` for every Variable reached.
    draw_offsets
        ``id(apply) -> first draw number`` for each random ``Generate`` node.
    """

    def __init__(self) -> None:
        self.keys: dict[int, str] = {}
        self.draw_offsets: dict[int, int] = {}
        self._occurrences: dict[str, int] = {}
        self._op_text: dict[int, str] = {}

    def key(self, variable: Variable) -> str:
        found = self.keys.get(id(variable))
        if found is None:
            found = self.keys[id(variable)] = self._leaf_key(variable)
        return found

    def _leaf_key(self, variable: Variable) -> str:
        if isinstance(variable, Constant):
            return constant_key(variable.value) or f"const@{id(variable):x}"
        if variable.owner is None:
            return f"input:{variable.name}" if variable.name else f"input@{id(variable):x}"
        raise KeyError(f"{variable!r} was not keyed: apply nodes must be visited in topological order")

    def _op_key(self, node: Apply) -> str:
        op = node.op
        text = self._op_text.get(id(op))
        if text is None:
            text = self._op_text[id(op)] = json.dumps(op.key(), sort_keys=True, default=repr)
        return text

    def visit(self, node: Apply) -> None:
        """Key ``node``'s outputs; its inputs' owners must have been visited."""
        op = node.op
        inputs = ",".join(self.key(v) for v in node.inputs)
        base = _digest(f"{self._op_key(node)}({inputs})")
        if op.mode == "generate" and not op.pure:
            # Draws are numbered per (backend, params, prompt), not per num_samples.
            stream = _digest(f"{type(op).__name__}:{json.dumps(op.key()[:3], default=repr)}({inputs})")
            offset = self._occurrences.get(stream, 0)
            self._occurrences[stream] = offset + op.num_samples  # type: ignore[attr-defined]
            self.draw_offsets[id(node)] = offset
            base = _digest(f"{base}#draw{offset}")
        elif not op.pure:
            count = self._occurrences.get(base, 0)
            self._occurrences[base] = count + 1
            base = _digest(f"{base}#{count}")
        for output in node.outputs:
            self.keys[id(output)] = base if len(node.outputs) == 1 else f"{base}.{output.index}"


def graph_keys(nodes: Iterable[Apply]) -> GraphKeys:
    """Key every node of ``nodes`` (topologically ordered, e.g. by ``toposort``)."""
    keys = GraphKeys()
    for node in sorted(nodes, key=lambda n: n.order):
        keys.visit(node)
    return keys
