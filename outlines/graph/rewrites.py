"""Graph rewrites applied before scheduling: merge equal pure work, fold constants.

One pass over the Apply nodes in creation order (a topological order)
hash-conses the rewritten graph: a pure node whose op (equal by its parameters)
and inputs match an earlier one is replaced by it, so two identical prompt
renders, or two greedy calls on the same prompt, become one node. Inputs match
when they are the same Variable, or Constants of equal simple values. A pure
inline op whose inputs are all Constants is evaluated now into a Constant.
Random draws and impure ops are never merged; free inputs and Constants are
kept as the same objects, so givens still bind. Nothing recurses.
"""
from __future__ import annotations

from typing import Hashable, Sequence

from outlines.graph.basic import Apply, Constant, Variable
from outlines.graph.hashing import constant_token
from outlines.graph.traversal import toposort

__all__ = ["rewrite"]


def _input_key(variable: Variable) -> Hashable:
    """Equal keys: interchangeable inputs (the same Variable, or equal constants)."""
    if isinstance(variable, Constant):
        token = constant_token(variable.value)
        if token is not None:
            return token
    return id(variable)


def _fold(node: Apply, inputs: Sequence[Variable]) -> Constant | None:
    """The value of a pure inline op on Constants, or ``None`` to leave it to eval."""
    if node.op.mode != "inline" or len(node.outputs) != 1:
        return None
    try:
        value = node.op.perform(*(v.value for v in inputs))  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - eval raises it again, naming the node
        return None
    return Constant(value, name=node.outputs[0].name)


def rewrite(outputs: Sequence[Variable]) -> list[Variable]:
    """Merge structurally identical pure subgraphs and fold constant pure ops.

    Parameters
    ----------
    outputs
        The Variables to compute.

    Returns
    -------
    list[Variable]
        Variables computing the same values, in the same order: the originals
        where nothing changed, otherwise new Variables over new Apply nodes
        (each keeps its original's creation order, so draw numbering is
        unchanged). Free inputs are the same objects.

    Examples
    --------
    >>> from outlines.graph.ops import Concat
    >>> (folded,) = rewrite([Concat()("a", "b")])
    >>> folded.value
    'ab'
    """
    outputs = list(outputs)
    replaced: dict[int, Variable] = {}  # id(original Variable) -> its replacement
    canonical: dict[Hashable, Apply] = {}  # (op, inputs) of a pure node -> the node computing it
    for node in toposort(outputs):
        inputs = [replaced.get(id(v), v) for v in node.inputs]
        op, new, key = node.op, node, None
        if op.pure:
            if all(isinstance(v, Constant) for v in inputs):
                constant = _fold(node, inputs)
                if constant is not None:
                    replaced[id(node.outputs[0])] = constant
                    continue
            key = (op, len(node.outputs), tuple(_input_key(v) for v in inputs))
            try:
                new = canonical.setdefault(key, node)
            except TypeError:  # an op with unhashable parameters is never merged
                key = None
        if new is node and any(a is not b for a, b in zip(inputs, node.inputs)):
            new = Apply(op, inputs, len(node.outputs))
            new.order = node.order  # draws are numbered in creation order
            for old_output, new_output in zip(node.outputs, new.outputs):
                new_output.name = old_output.name
            if op.pure and key is not None:
                canonical[key] = new
        if new is not node:
            for old_output, new_output in zip(node.outputs, new.outputs):
                replaced[id(old_output)] = new_output
    return [replaced.get(id(v), v) for v in outputs]
