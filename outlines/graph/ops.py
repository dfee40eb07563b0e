"""Elementwise machinery shared by every op, and the small structural ops.

Values at run time are Python scalars or NumPy object arrays. ``broadcast_map``
applies a scalar function over broadcast arguments in one tight loop; when a
graph is evaluated with ``errors="return"`` it also turns failing elements into
``Failure`` values and skips elements whose inputs already failed.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from outlines.errors import Failure, GraphBuildError
from outlines.graph.basic import Apply, Constant, Op, Variable, as_variable

__all__ = ["Concat", "Stack", "broadcast_map", "scalar_or_array"]


def scalar_or_array(value: Any) -> Any:
    """Unwrap 0-d object arrays into their scalar."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    return value


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value if value.dtype == object else value.astype(object)
    array = np.empty((), dtype=object)
    array[()] = value
    return array


def broadcast_map(
    fn: Callable[..., Any],
    args: Sequence[Any],
    *,
    on_error: Callable[[BaseException], Failure] | None = None,
    on_failed_input: Callable[[Failure], Failure] | None = None,
) -> Any:
    """Apply scalar ``fn`` to broadcast ``args``; scalars in, scalar out.

    ``on_error`` (``errors="return"``) turns an element's exception into its
    Failure; ``on_failed_input`` builds the Failure of an element one of whose
    inputs is a Failure (that element's ``fn`` is not called).
    """
    call = fn if on_error is None else _guarded(fn, on_error, on_failed_input)
    if not any(isinstance(a, np.ndarray) for a in args):
        return call(*args)
    arrays = [_as_array(a) for a in args]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    flats = [a.reshape(-1) if a.shape == shape else np.broadcast_to(a, shape).reshape(-1) for a in arrays]
    count = int(np.prod(shape, dtype=np.int64))
    out = np.fromiter(map(call, *flats), dtype=object, count=count)
    return out.reshape(shape)


def _guarded(
    fn: Callable[..., Any],
    on_error: Callable[[BaseException], Failure],
    on_failed_input: Callable[[Failure], Failure] | None,
) -> Callable[..., Any]:
    def call(*values: Any) -> Any:
        for value in values:
            if isinstance(value, Failure):
                return on_failed_input(value) if on_failed_input else value
        try:
            return fn(*values)
        except Exception as exc:  # noqa: BLE001 - becomes the element's Failure
            return on_error(exc)

    return call


def check_text_input(op: Op, variable: Variable, what: str) -> None:
    """Reject constants that cannot be text where text is required."""
    if isinstance(variable, Constant):
        value = variable.value
        ok = isinstance(value, str) or (
            isinstance(value, np.ndarray) and all(isinstance(v, str) for v in value.flat)
        )
        if not ok:
            raise GraphBuildError(
                f"{op.name}: {what} must be a string, an array of strings or a symbolic "
                f"Variable; got {type(value).__name__} {value!r:.60}"
            )


class Concat(Op):
    """String concatenation of its inputs, elementwise (``a + b``)."""

    elementwise = True

    def make_node(self, *inputs: Any) -> Apply:
        variables = [as_variable(x) for x in inputs]
        for variable in variables:
            check_text_input(self, variable, "each operand of +")
        return Apply(self, variables)

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "+ (concat)"}

    def perform(self, *values: Any) -> Any:
        return broadcast_map(_join, values)


def _join(*parts: str) -> str:
    if not all(isinstance(p, str) for p in parts):
        bad = next(p for p in parts if not isinstance(p, str))
        raise TypeError(f"can only concatenate str, not {type(bad).__name__} {bad!r:.60}")
    return "".join(parts)


class Stack(Op):
    """Stack ``n`` values along a new last axis (a list of Variables)."""

    __props__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": f"stack {self.n}"}

    def perform(self, *values: Any) -> Any:
        arrays = np.broadcast_arrays(*(_as_array(v) for v in values))
        return np.stack(arrays, axis=-1)
