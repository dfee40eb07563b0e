"""Python functions as graph ops: ``@outlines.fn``.

A lifted function is elementwise with NumPy broadcasting by default; with a
gufunc ``signature`` such as ``"(n)->()"`` it sees whole core dimensions (a
majority vote over samples). Sync functions that turn out to be slow run in
the shared thread pool; ``async def`` functions run concurrently on the loop.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import re
from typing import Any, Callable

import numpy as np

from outlines.errors import Failure, GraphBuildError
from outlines.graph.basic import Apply, Op, as_object_array, as_variable
from outlines.graph.ops import broadcast_map, scalar_or_array

__all__ = ["Function", "CallFunction", "fn"]

_SIGNATURE = re.compile(r"^\s*(\([^()]*\)\s*(,\s*\([^()]*\)\s*)*)->\s*(\([^()]*\)\s*(,\s*\([^()]*\)\s*)*)$")


class CallFunction(Op):
    """Run a user function; see ``outlines.fn``."""

    __props__ = ("function", "kwnames")
    mode = "python"

    def __init__(self, function: Function, kwnames: tuple[str, ...]) -> None:
        self.function = function
        self.kwnames = kwnames

    @property
    def pure(self) -> bool:  # type: ignore[override]
        return self.function.pure

    @property
    def name(self) -> str:
        return self.function.__name__

    def describe(self) -> dict[str, Any]:
        signature = self.function.signature
        return {"kind": "python", "title": self.function.__name__, "lines": [signature] if signature else []}

    def argument_name(self, position: int, ninputs: int) -> str:
        npositional = ninputs - len(self.kwnames)
        if position >= npositional:
            return str(self.kwnames[position - npositional])
        signature = self.function.python_signature
        names = [p.name for p in signature.parameters.values() if p.kind <= p.POSITIONAL_OR_KEYWORD] if signature else []
        return names[position] if position < len(names) else str(position)

    def _bind(self, values: tuple[Any, ...]) -> Callable[..., Any]:
        target, count = self.function.target, len(values) - len(self.kwnames)
        if not self.kwnames:
            return target
        names = self.kwnames
        return lambda *vals: target(*vals[:count], **dict(zip(names, vals[count:])))

    def perform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        """Compute synchronously (for sync functions); coroutines for async ones."""
        call = self._bind(values)
        signature = self.function.signature
        if signature is None:
            return broadcast_map(call, values, on_error=on_error, on_failed_input=on_failed_input)
        call = _core_outputs(call, self.function.core_outputs)
        if on_error is not None:
            call = _guard_core(call, on_error, on_failed_input)
        vectorized = np.vectorize(call, signature=signature, otypes=[object] * self.function.noutputs)
        result = vectorized(*values)
        if isinstance(result, tuple):
            return tuple(scalar_or_array(r) for r in result)
        return scalar_or_array(result)

    async def aperform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        """Compute an async function: every element's coroutine runs concurrently."""
        coroutines = self.perform(*values, on_failed_input=on_failed_input)
        if not isinstance(coroutines, np.ndarray):
            return await _settle(coroutines, on_error)
        flat = coroutines.reshape(-1)
        results = await asyncio.gather(*(_settle(c, on_error) for c in flat))
        return np.fromiter(results, dtype=object, count=len(results)).reshape(coroutines.shape)


async def _settle(value: Any, on_error: Any) -> Any:
    if not inspect.isawaitable(value):
        return value  # a Failure passed through for a failed input
    if on_error is None:
        return await value
    try:
        return await value
    except Exception as exc:  # noqa: BLE001 - becomes the element's Failure
        return on_error(exc)


def _core_outputs(call: Callable[..., Any], cores: tuple[bool, ...]) -> Callable[..., Any]:
    """Let functions return lists for outputs with core dimensions."""
    if not any(cores):
        return call

    def as_core(value: Any, core: bool) -> Any:
        return as_object_array(value) if core and isinstance(value, (list, tuple)) else value

    if len(cores) == 1:
        return lambda *values: as_core(call(*values), True)
    return lambda *values: tuple(as_core(v, c) for v, c in zip(call(*values), cores))


def _guard_core(call: Callable[..., Any], on_error: Any, on_failed_input: Any) -> Callable[..., Any]:
    def guarded(*values: Any) -> Any:
        for value in values:
            items = value.flat if isinstance(value, np.ndarray) else (value,)
            failed = next((v for v in items if isinstance(v, Failure)), None)
            if failed is not None:
                return on_failed_input(failed)
        try:
            return call(*values)
        except Exception as exc:  # noqa: BLE001
            return on_error(exc)

    return guarded


class Function:
    """A Python function lifted into graph ops; calling it builds a node."""

    def __init__(
        self,
        target: Callable[..., Any],
        *,
        signature: str | None = None,
        name: str | None = None,
        pure: bool = False,
        blocking: bool | None = None,
    ) -> None:
        functools.update_wrapper(self, target)
        if name:
            self.__name__ = self.__qualname__ = name
        if signature is not None and not _SIGNATURE.match(signature):
            raise GraphBuildError(f"fn {self.__name__}: invalid gufunc signature {signature!r} (e.g. '(n)->()')")
        self.target = target
        self.signature = signature.replace(" ", "") if signature else None
        outputs = re.findall(r"\(([^()]*)\)", signature.split("->")[1]) if signature else [""]
        self.noutputs = len(outputs)
        self.core_outputs = tuple(bool(o.strip()) for o in outputs)
        self.pure = pure
        self.blocking = blocking
        self.is_async = inspect.iscoroutinefunction(target)
        self.python_signature = _python_signature(target)
        self._min_positional, self._max_positional = _positional_range(self.python_signature)
        self._ops: dict[tuple[str, ...], CallFunction] = {}
        #: Mean seconds per call, measured; decides inline vs thread pool.
        self.mean_seconds: float | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.python_signature is not None and (kwargs or not self._positional_ok(len(args))):
            try:
                self.python_signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise GraphBuildError(f"fn {self.__name__}: {exc}") from None
        kwnames = tuple(kwargs)
        op = self._ops.get(kwnames)
        if op is None:
            op = self._ops[kwnames] = CallFunction(self, kwnames)
        inputs = [as_variable(a) for a in args] + [as_variable(kwargs[k]) for k in kwnames]
        node = Apply(op, inputs, self.noutputs)
        return node.outputs[0] if self.noutputs == 1 else node.outputs

    def _positional_ok(self, count: int) -> bool:
        """Whether ``count`` positional arguments surely bind (skips a slow ``bind``)."""
        return self._min_positional <= count <= self._max_positional

    def record(self, seconds: float) -> None:
        """Fold one measured call duration into ``mean_seconds``."""
        previous = self.mean_seconds
        self.mean_seconds = seconds if previous is None else 0.8 * previous + 0.2 * seconds

    def __repr__(self) -> str:
        sig = f", signature={self.signature!r}" if self.signature else ""
        return f"fn({self.__name__}{sig})"


def _positional_range(signature: inspect.Signature | None) -> tuple[int, float]:
    """How many positional arguments bind without keywords (empty range if unsure)."""
    if signature is None:
        return 1, 0
    low, high = 0, 0.0
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            high = float("inf")
        elif parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            high += 1
            low += parameter.default is parameter.empty
        elif parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty:
            return 1, 0  # a required keyword-only parameter: let bind() report it
    return low, high


def _python_signature(target: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(target)
    except (TypeError, ValueError):
        return None


def fn(
    function: Callable[..., Any] | None = None,
    *,
    signature: str | None = None,
    name: str | None = None,
    pure: bool = False,
    blocking: bool | None = None,
) -> Any:
    """Lift a Python function (sync or ``async def``) into a graph op.

    Parameters
    ----------
    function
        The function; ``fn`` also works as ``@fn(...)`` with options.
    signature
        NumPy gufunc signature for core dimensions, e.g. ``"(n)->()"``;
        default: elementwise with broadcasting over every argument.
    name
        Label in pictures and traces (default: the function's name).
    pure
        Whether equal inputs always give equal outputs, so identical calls may
        be merged (like ``dask.delayed(pure=True)``). Default ``False``.
    blocking
        ``True``: always run in a thread; ``False``: always on the event loop;
        ``None`` (default): in a thread until measured fast (< 1 ms a call).

    Returns
    -------
    Function
        Calling it with Variables (or values) builds a node.

    Raises
    ------
    GraphBuildError
        When called with arguments the function does not accept.

    Examples
    --------
    >>> @fn(signature="(n)->()")
    ... def count(xs):
    ...     return len(xs)
    """
    if function is None:
        return lambda f: Function(f, signature=signature, name=name, pure=pure, blocking=blocking)
    return Function(function, signature=signature, name=name, pure=pure, blocking=blocking)
