"""Shapes and the pairing rule: operands of lower rank align on LEADING axes.

Model calls append their sample axis last, so a value built from a (T,) input
has shape (T, k) after ``num_samples=k``. Pairing it with the (T,) input must
give each row its own input: shapes are aligned on their leading axes (the
shorter one is padded with size-1 axes at the END, NumPy pads at the front),
then every axis must have equal sizes or size 1. Any other pairing is refused,
naming both shapes; ``v[None]`` or ``expand_dims`` says another alignment
explicitly.

A static shape is a tuple of sizes where ``None`` is a size not known before
running (a ragged axis, or a function's output length); a shape of ``None``
means even the rank is unknown (a free input before it is bound).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from outlines.common.errors import GraphBuildError
from outlines.graph.ragged import Ragged

__all__ = ["Shape", "align", "broadcast_leading", "pad_trailing", "propagate", "shape_of", "show"]

Shape = Optional[Tuple[Optional[int], ...]]


def show(shape: Shape) -> str:
    """``(3, 2)``, ``(3, ?)`` or ``(unknown rank)`` for messages."""
    if shape is None:
        return "(unknown rank)"
    sizes = ["?" if s is None else str(s) for s in shape]
    return "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"


def _mismatch(where: str, shapes: Sequence[Shape]) -> GraphBuildError:
    listed = " and ".join(show(s) for s in shapes)
    return GraphBuildError(
        f"{where}: cannot pair shapes {listed}. Operands of lower rank align on the "
        "LEADING axes (a (T,) value pairs with each row of a (T, k) one); say another "
        "pairing explicitly with v[None], v[..., None] or outlines.expand_dims."
    )


def align(where: str, shapes: Sequence[Shape]) -> Shape:
    """The shape of an elementwise result, or ``GraphBuildError`` naming the shapes.

    ``None`` (unknown rank) anywhere gives ``None``; an unknown size pairs with
    anything and stays unknown unless the other size is known and not 1.

    Examples
    --------
    >>> align("f", [(3,), (3, 2)])
    (3, 2)
    >>> align("f", [(), (4, None)])
    (4, None)
    """
    if shapes and shapes.count(shapes[0]) == len(shapes):
        # the common case (every operand a scalar, or of one shape): each axis keeps its size
        first = shapes[0]
        return None if first is None else tuple(first)
    if None in shapes:
        return None
    known_shapes = [s for s in shapes if s is not None]
    rank = max((len(s) for s in known_shapes), default=0)
    out: list[int | None] = []
    for axis in range(rank):
        sizes = {s[axis] for s in known_shapes if axis < len(s)}
        known = {n for n in sizes if n is not None and n != 1}
        if len(known) > 1:
            raise _mismatch(where, shapes)
        if known:
            out.append(known.pop())
        elif None in sizes:
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def pad_trailing(array: np.ndarray, rank: int) -> np.ndarray:
    """``array`` viewed with size-1 axes appended up to ``rank``."""
    extra = rank - array.ndim
    return array.reshape(array.shape + (1,) * extra) if extra > 0 else array


def broadcast_leading(where: str, arrays: Sequence[np.ndarray]) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """Broadcast concrete arrays with the leading-axes rule; views, not copies."""
    rank = max(a.ndim for a in arrays)
    padded = [pad_trailing(a, rank) for a in arrays]
    try:
        shape = tuple(np.broadcast_shapes(*(a.shape for a in padded)))
    except ValueError:
        raise _mismatch(where, [a.shape for a in arrays]) from None
    return shape, [a if a.shape == shape else np.broadcast_to(a, shape) for a in padded]


def shape_of(value: Any) -> Shape:
    """The static shape of a concrete value (a given or a constant)."""
    if isinstance(value, str):
        return ()
    if isinstance(value, Ragged):
        return value.shape
    if isinstance(value, np.ndarray):
        return tuple(int(n) for n in value.shape)
    return ()  # a scalar, or one Python value (a list given to a function whole)


def propagate(nodes: Sequence[Any], known: dict[int, Shape]) -> dict[int, Shape]:
    """The shapes that ``known`` changes, through ``nodes`` (in topological order).

    ``known`` maps ``id(variable)`` to the shape of a bound input; other
    Variables keep the shape they were built with, whose pairings were checked
    when they were built. So only nodes reading a changed shape are inferred
    again (a graph whose inputs are bound as built costs one pass of set
    lookups). A pairing that fails raises ``GraphBuildError`` naming the node
    and both shapes, before anything runs. Returns ``id(variable) -> shape``
    for every Variable whose shape differs from the one it was built with.
    """
    shapes = {key: shape for key, shape in known.items()}
    if not shapes:
        return shapes
    for node in nodes:
        if not any(id(v) in shapes for v in node.inputs):
            continue  # nothing new is known here
        inputs = [shapes.get(id(v), v.shape) for v in node.inputs]
        try:
            outs = node.op.infer_shapes(inputs, len(node.outputs))
        except GraphBuildError as exc:
            raise GraphBuildError(f"{node.label}: {exc}") from None
        for variable, shape in zip(node.outputs, outs):
            if shape != variable.shape:
                shapes[id(variable)] = shape
    return shapes
