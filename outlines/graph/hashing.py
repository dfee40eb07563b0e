"""Content keys of subgraphs, and the numbering of random draws.

A Variable's key covers its op, the op's parameters and its inputs' keys, so
one key covers a whole subgraph (tinygrad-style). Two flavours:

- ``GraphKeys``: fast in-process keys (hash-consed small integers, ops compared
  by their parameters) used when planning every evaluation;
- ``content_hash``: a stable hex digest (same across processes and Python
  versions) of a subgraph, from each op's JSON ``key()``.

Pure computations with equal keys compute equal values. Impure ones (random
model calls, impure Python functions) get an occurrence number among
structurally equal computations, in creation order: the second identical random
call in a graph is draws ``k``, ``k+1``... after the first one's ``k`` draws.
Numbers depend only on the graph, so re-building the same program replays the
same draws.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Hashable, Iterable

import numpy as np

from outlines.graph.basic import Apply, Constant, Variable
from outlines.graph.traversal import toposort

__all__ = ["GraphKeys", "content_hash", "graph_keys", "number_draws"]

_SIMPLE = (str, int, float, bool, type(None))


def _simple_token(value: Any) -> Hashable:
    # repr for floats: -0.0 == 0.0 and nan != nan, but they render differently.
    return (type(value).__name__, repr(value) if isinstance(value, float) else value)


def constant_token(value: Any) -> Hashable | None:
    """A hashable token equal for equal simple constants; ``None`` when there is none."""
    if isinstance(value, _SIMPLE):
        return _simple_token(value)
    if isinstance(value, np.ndarray) and value.dtype == object and value.size <= 4096:
        flat = value.reshape(-1).tolist()
        if all(isinstance(v, _SIMPLE) for v in flat):
            return ("array", value.shape, tuple(_simple_token(v) for v in flat))
    return None


class GraphKeys:
    """In-process keys of every Variable of a graph, and draw offsets.

    Attributes
    ----------
    keys
        ``id(variable) -> int``; equal ints mean equal computations.
    draw_offsets
        ``id(apply) -> first draw number`` for each random ``Generate`` node.
    """

    def __init__(self) -> None:
        self.keys: dict[int, int] = {}
        self.draw_offsets: dict[int, int] = {}
        self._table: dict[Hashable, int] = {}
        self._occurrences: dict[Hashable, int] = {}

    def _intern(self, token: Hashable) -> int:
        found = self._table.get(token)
        if found is None:
            found = self._table[token] = len(self._table)
        return found

    def key(self, variable: Variable) -> int:
        found = self.keys.get(id(variable))
        if found is None:
            found = self.keys[id(variable)] = self._intern(self._leaf_token(variable))
        return found

    def _leaf_token(self, variable: Variable) -> Hashable:
        if isinstance(variable, Constant):
            token = constant_token(variable.value)
            return ("const", token) if token is not None else ("const@", id(variable))
        if variable.owner is None:
            return ("input", variable.name) if variable.name else ("input@", id(variable))
        raise KeyError(f"{variable!r} was not keyed: apply nodes must be visited in topological order")

    def visit(self, node: Apply) -> None:
        """Key ``node``'s outputs; its inputs' owners must have been visited."""
        op = node.op
        inputs = tuple(self.key(v) for v in node.inputs)
        token: Hashable = (op, inputs)
        if op.mode == "generate" and not op.pure:
            # Draws are numbered per (backend, params, prompt), whatever num_samples.
            stream = ("draws", op.backend, op.params, inputs)  # type: ignore[attr-defined]
            offset = self._occurrences.get(stream, 0)
            self._occurrences[stream] = offset + op.num_samples  # type: ignore[attr-defined]
            self.draw_offsets[id(node)] = offset
            token = (op, inputs, offset)
        elif not op.pure:
            count = self._occurrences.get(token, 0)
            self._occurrences[token] = count + 1
            token = (op, inputs, count)
        base = self._intern(token)
        if len(node.outputs) == 1:
            self.keys[id(node.outputs[0])] = base
        else:
            for output in node.outputs:
                self.keys[id(output)] = self._intern((base, output.index))


def graph_keys(nodes: Iterable[Apply]) -> GraphKeys:
    """Key every node of ``nodes``; creation order is a topological order."""
    keys = GraphKeys()
    for node in sorted(nodes, key=lambda n: n.order):
        keys.visit(node)
    return keys


def number_draws(nodes: Iterable[Apply]) -> dict[int, int]:
    """Draw offsets of random calls in a graph whose pure parts are already merged.

    After ``rewrites.rewrite``, structurally equal pure prompts are the same
    Variable, so the prompt's identity (or a constant's value) is its key and
    only the model calls need visiting.
    """
    offsets: dict[int, int] = {}  # only non-zero offsets are stored
    used: dict[Hashable, int] = {}
    for node in sorted((n for n in nodes if n.op.mode == "generate" and not n.op.pure), key=lambda n: n.order):
        prompt = node.inputs[0]
        token = constant_token(prompt.value) if isinstance(prompt, Constant) else None
        stream = (node.op.backend, node.op.params, token if token is not None else id(prompt))  # type: ignore[attr-defined]
        offset = used.get(stream, 0)
        if offset:  # absent means 0: most calls are first draws, keep the plan small
            offsets[id(node)] = offset
        used[stream] = offset + node.op.num_samples  # type: ignore[attr-defined]
    return offsets


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def content_hash(*variables: Variable) -> str:
    """A stable digest of the subgraphs computing ``variables``.

    Equal across processes for structurally equal graphs: ops contribute their
    JSON ``key()``, constants their value, free inputs their name. Random
    draws contribute their draw numbers.

    Examples
    --------
    >>> import outlines
    >>> q = outlines.string("q")
    >>> content_hash(q + "!") == content_hash(q + "!") != content_hash(q + "?")
    True
    """
    nodes = toposort(variables)
    offsets = graph_keys(nodes).draw_offsets
    digests: dict[int, str] = {}

    def of(variable: Variable) -> str:
        found = digests.get(id(variable))
        if found is not None:
            return found
        if isinstance(variable, Constant):
            try:
                text = json.dumps(["const", variable.value], sort_keys=True)
            except (TypeError, ValueError):
                text = json.dumps(["const", repr(variable.value)])
        else:
            text = json.dumps(["input", variable.name])
        return digests.setdefault(id(variable), _digest(text))

    for node in nodes:
        parts = [node.op.key(), [of(v) for v in node.inputs], offsets.get(id(node))]
        base = _digest(json.dumps(parts, sort_keys=True, default=repr))
        for output in node.outputs:
            digests[id(output)] = base if len(node.outputs) == 1 else _digest(f"{base}.{output.index}")
    return _digest(",".join(of(v) for v in variables))
