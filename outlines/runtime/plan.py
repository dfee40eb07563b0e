"""The static part of an evaluation: which nodes run, in what dependency order.

A ``Plan`` is built once per set of outputs (a ``Program`` keeps its own) and
holds the nodes in topological order, the in-degree and consumers of each, the
free inputs, and the draw number of each random model call.
"""
from __future__ import annotations

import warnings
from typing import Any, Iterable, Mapping

import numpy as np

from outlines.errors import UnboundInputError
from outlines.graph.basic import Apply, Constant, Variable, as_object_array
from outlines.graph.hashing import graph_keys, number_draws
from outlines.graph.traversal import toposort

__all__ = ["Plan", "bind_givens"]


class Plan:
    """Nodes of a graph in topological order, with their dependency structure.

    Attributes
    ----------
    outputs
        The (possibly rewritten) output Variables.
    nodes
        Apply nodes, each after the owners of its inputs.
    indegree
        For node ``i``, how many distinct nodes it waits for.
    consumers
        For node ``i``, the indices of the nodes that use its outputs.
    inputs, constants
        The free input Variables and the Constants the graph reads.
    draw_offsets
        ``id(apply) -> first draw number`` of each random model call.
    """

    def __init__(self, outputs: Iterable[Variable], *, rewrite: bool = True) -> None:
        outputs = list(outputs)
        for argument, output in enumerate(outputs):
            if not isinstance(output, Variable):
                raise TypeError(f"eval expects symbolic Variables; argument {argument} is {type(output).__name__}")
        if rewrite:
            outputs = _rewrite(outputs)
        self.outputs = outputs
        self.nodes: list[Apply] = toposort(outputs)
        position = {id(node): i for i, node in enumerate(self.nodes)}
        self.indegree = [0] * len(self.nodes)
        self.consumers: list[list[int]] = [[] for _ in self.nodes]
        for i, node in enumerate(self.nodes):
            parents = {position[id(v.owner)] for v in node.inputs if v.owner is not None}
            self.indegree[i] = len(parents)
            for parent in sorted(parents):
                self.consumers[parent].append(i)
        leaves = list({id(v): v for v in _leaves(self.nodes, outputs)}.values())
        self.inputs = [v for v in leaves if not isinstance(v, Constant)]
        self.constants = [v for v in leaves if isinstance(v, Constant)]
        if rewrite:  # equal pure prompts are one Variable now: a cheap numbering suffices
            self.draw_offsets: dict[int, int] = number_draws(self.nodes)
        else:
            self.draw_offsets = graph_keys(self.nodes).draw_offsets

    def __len__(self) -> int:
        return len(self.nodes)


def _leaves(nodes: list[Apply], outputs: list[Variable]) -> Iterable[Variable]:
    for output in outputs:
        if output.owner is None:
            yield output
    for node in nodes:
        for variable in node.inputs:
            if variable.owner is None:
                yield variable


def _rewrite(outputs: list[Variable]) -> list[Variable]:
    try:
        from outlines.graph.rewrites import rewrite
    except ImportError:  # rewrites are an optimisation; the graph is valid without them
        return outputs
    return rewrite(outputs)


def as_value(value: Any) -> Any:
    """Normalize a given: lists and tuples become NumPy object arrays."""
    if isinstance(value, (list, tuple)):
        return as_object_array(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.astype(object)
    return value


def bind_givens(plan: Plan, givens: Mapping[Any, Any] | None) -> dict[int, Any]:
    """Values of the plan's inputs and constants, keyed by ``id(variable)``.

    Raises
    ------
    UnboundInputError
        Listing every free input that ``givens`` leaves unbound.
    TypeError
        When a key of ``givens`` is neither a Variable nor a name.

    Warns
    -----
    UserWarning
        When ``givens`` names (by string) inputs that the graph does not have.
    """
    givens = dict(givens or {})
    by_name: dict[str, Any] = {}
    by_variable: dict[int, Any] = {}
    for key, value in givens.items():
        if isinstance(key, Variable):
            by_variable[id(key)] = value
        elif isinstance(key, str):
            by_name[key] = value
        else:
            raise TypeError(f"givens keys must be input Variables or their names, got {type(key).__name__} {key!r:.40}")
    values: dict[int, Any] = {id(c): c.value for c in plan.constants}
    missing = []
    for variable in plan.inputs:
        if id(variable) in by_variable:
            values[id(variable)] = as_value(by_variable[id(variable)])
        elif variable.name is not None and variable.name in by_name:
            values[id(variable)] = as_value(by_name[variable.name])
        else:
            missing.append(variable.label)
    names = {variable.name for variable in plan.inputs if variable.name is not None}
    unknown = [name for name in by_name if name not in names]
    if unknown:
        # Said, not raised: one givens dict for a whole program may bind inputs
        # that the part being evaluated does not use. A misspelt name still
        # shows here (and as a missing input below).
        known = ", ".join(repr(n) for n in sorted(names)) or "none"
        warnings.warn(
            f"givens name input(s) this graph does not have, ignored: {', '.join(repr(n) for n in unknown)} "
            f"(its inputs: {known})",
            UserWarning,
            stacklevel=3,
        )
    if missing:
        raise UnboundInputError(missing)
    return values
