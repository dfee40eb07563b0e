"""Python functions as graph ops: ``@outlines.fn``.

A lifted function is elementwise by default, its arguments paired on their
LEADING axes (``outlines.graph.shapes``: a (T,) task pairs with each of the
k samples of its own row of a (T, k) value). With a gufunc ``signature`` such
as ``"(n)->()"`` it sees whole core dimensions (a majority vote over samples);
the loop axes pair the same way. An output core dimension (``"()->(n)"``)
may differ in length per element: the result is then ``Ragged``. Sync functions that turn out to be slow run in
the shared thread pool; ``async def`` functions run concurrently on the loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import re
from typing import Any, Callable

import numpy as np

from outlines.common.errors import Failure, GraphBuildError
from outlines.graph.basic import Apply, Op, Variable, as_object_array, as_variable
from outlines.graph.ops import broadcast_map, core_map
from outlines.graph.ragged import Ragged
from outlines.graph.shapes import Shape, align
from outlines.graph.traits import Run, Traits

__all__ = ["Function", "CallFunction", "fn"]

#: The values ``broadcast_map`` maps over (anything else is one scalar).
_ARRAYS = (np.ndarray, Ragged)
_SIGNATURE = re.compile(r"^\s*(\([^()]*\)\s*(,\s*\([^()]*\)\s*)*)->\s*(\([^()]*\)\s*(,\s*\([^()]*\)\s*)*)$")


class CallFunction(Op):
    """Run a user function; see ``outlines.fn``.

    Its traits follow its function, read once here: pure when the function is
    declared ``pure=True``; elementwise (one result per element of the loop
    axes) unless it has several outputs or an output core axis, whose length
    may vary. An op is immutable once built (its hash is its parameters), so
    the record is too.
    """

    __props__ = ("function", "kwnames")
    traits = Traits(run=Run.PYTHON, pure=False, elementwise=True, guards_elements=True)

    def __init__(self, function: Function, kwnames: tuple[str, ...]) -> None:
        self.function = function
        self.kwnames = kwnames
        elementwise = function.noutputs == 1 and not any(function.core_outputs)
        if function.pure or not elementwise:
            self.traits = dataclasses.replace(CallFunction.traits, pure=function.pure, elementwise=elementwise)

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

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        """Leading-axis pairing of the arguments (of the loop axes, with a signature)."""
        function = self.function
        if function.signature is None:
            if len(shapes) == 1 and noutputs == 1:  # one argument (a step of a chain): its shape, as align gives it
                return shapes
            return [align(function.__name__, shapes)] * noutputs
        known = [s for s in shapes if s is not None]
        if len(known) < len(shapes):
            return [None] * noutputs
        sizes: dict[str, int | None] = {}
        loops: list[Shape] = []
        for shape, core in zip(known, function.core_names):
            if len(shape) < len(core):
                raise GraphBuildError(
                    f"fn {function.__name__}: an argument of shape {shape} has fewer than the "
                    f"{len(core)} core axes of signature {function.signature}"
                )
            loops.append(shape[: len(shape) - len(core)])
            for name, size in zip(core, shape[len(shape) - len(core) :]):
                if sizes.get(name) not in (None, size) and size is not None:
                    raise GraphBuildError(f"fn {function.__name__}: core axis {name} has sizes {sizes[name]} and {size}")
                sizes[name] = size if size is not None else sizes.get(name)
        loop = align(function.__name__, loops)
        if loop is None:
            return [None] * noutputs
        return [loop + tuple(sizes.get(name) for name in core) for core in function.output_core_names]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        function = self.function
        if function.signature is None:
            if len(ragged) == 1 and noutputs == 1:  # one argument: its rows (a flag, as any() gives it)
                return ragged
            return [any(ragged)] * noutputs
        # a ragged argument without core axes loops over its items: the rows stay
        looped = any(r and not core for r, core in zip(ragged, function.core_names))
        return [looped or core for core in function.core_outputs]

    def _bind(self, values: tuple[Any, ...]) -> Callable[..., Any]:
        target, count = self.function.target, len(values) - len(self.kwnames)
        if not self.kwnames:
            return target
        names = self.kwnames
        return lambda *vals: target(*vals[:count], **dict(zip(names, vals[count:])))

    def perform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        """Compute synchronously (for sync functions); coroutines for async ones."""
        if on_error is None and on_failed_input is None and not self.kwnames and self.function.signature is None:
            # the common call, once per node of a chain: scalars need no broadcasting (broadcast_map's first case)
            for value in values:
                if isinstance(value, _ARRAYS):
                    break
            else:
                return self.function.target(*values)
        call = self._bind(values)
        signature = self.function.signature
        if signature is None:
            return broadcast_map(call, values, on_error=on_error, on_failed_input=on_failed_input)
        if on_error is not None:
            call = _guard_core(call, on_error, on_failed_input)
        cores = [len(core) for core in self.function.core_names]
        return core_map(call, values, cores, self.function.core_outputs, f"fn {self.name}")

    async def aperform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        """Compute an async function: every element's coroutine runs concurrently."""
        coroutines = self.perform(*values, on_failed_input=on_failed_input)
        if isinstance(coroutines, Ragged):
            return coroutines.with_values(await self._settle_all(coroutines.values, on_error))
        if not isinstance(coroutines, np.ndarray):
            return await _settle(coroutines, on_error)
        return await self._settle_all(coroutines, on_error)

    @staticmethod
    async def _settle_all(coroutines: np.ndarray, on_error: Any) -> np.ndarray:
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
        halves = self.signature.split("->") if self.signature else ["", "()"]
        self.core_names = tuple(_cores(halves[0]))
        self.output_core_names = tuple(_cores(halves[1]))
        self.noutputs = len(self.output_core_names)
        self.core_outputs = tuple(bool(core) for core in self.output_core_names)
        self.pure = pure
        self.blocking = blocking
        self.is_async = inspect.iscoroutinefunction(target)
        self.python_signature = _python_signature(target)
        self._min_positional, self._max_positional = _positional_range(self.python_signature)
        #: The op of each set of keyword names asked so far: a call built in a loop makes no op (about a
        #: third of the build time per node); equal ops stack whichever object they are.
        self._ops: dict[tuple[str, ...], CallFunction] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = None if kwargs else self._ops.get(())
        if op is not None and self._min_positional <= len(args) <= self._max_positional:
            # the common call, built thousands of times in a loop: positional arguments that surely bind
            if len(args) == 1:  # one argument: no list to build (Apply keeps a tuple as it is)
                arg = args[0]
                node = Apply(op, args if isinstance(arg, Variable) else (as_variable(arg),), self.noutputs)
            else:
                node = Apply(op, [a if isinstance(a, Variable) else as_variable(a) for a in args], self.noutputs)
            return node.outputs[0] if self.noutputs == 1 else node.outputs
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

    def __repr__(self) -> str:
        sig = f", signature={self.signature!r}" if self.signature else ""
        return f"fn({self.__name__}{sig})"


def _cores(half: str) -> list[tuple[str, ...]]:
    """The core axis names of each argument of one half of a gufunc signature."""
    return [tuple(n for n in group.split(",") if n) for group in re.findall(r"\(([^()]*)\)", half)]


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
        default: elementwise over every argument. Arguments (and the loop
        axes of a gufunc) pair on their LEADING axes; an output core axis
        whose length differs per element (``"()->(n)"`` returning lists of
        different lengths) gives a ``Ragged`` value.
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


def elemwise(function: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Map a Python function (sync or ``async def``) over arrays of inputs.

    A seed name of the original proposal: ``fn`` that also runs at once on
    concrete values. Called with Variables it builds a node (like ``fn``);
    called with values (lists and tuples are arrays) it returns values, the
    calls of an async function running concurrently.

    Parameters
    ----------
    function
        The function; ``elemwise`` also works as ``@elemwise(...)``.
    **options
        As for ``fn`` (``signature``, ``name``, ``pure``, ``blocking``).

    Returns
    -------
    Callable
        Variables in, Variable out; values in, values out (a NumPy object
        array for array inputs).

    Examples
    --------
    >>> shout = elemwise(lambda text, mark="!": text.upper() + mark)
    >>> list(shout(["a", "b"], mark="?"))
    ['A?', 'B?']
    """
    if function is None:
        return lambda f: elemwise(f, **options)
    lifted = function if isinstance(function, Function) else Function(function, **options)

    @functools.wraps(lifted.target)
    def call(*args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        if any(_symbolic(v) for v in values):
            return lifted(*args, **kwargs)
        from outlines.runtime.evaluate import eval as evaluate

        node = lifted(*(_concrete(a) for a in args), **{k: _concrete(v) for k, v in kwargs.items()})
        return evaluate(*node, cache=False) if isinstance(node, tuple) else evaluate(node, cache=False)

    return call


def _symbolic(value: Any) -> bool:
    from outlines.graph.basic import Variable

    if isinstance(value, Variable):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, Variable) for v in value)


def _concrete(value: Any) -> Any:
    from outlines.graph.basic import Constant

    if isinstance(value, (list, tuple)):
        return Constant(as_object_array(value))
    if isinstance(value, np.ndarray):
        return Constant(value if value.dtype == object else value.astype(object))
    return Constant(value)
