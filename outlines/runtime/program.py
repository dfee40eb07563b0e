"""``outlines.compile``: trace a function once into a reusable ``Program``.

Tracing is JAX-style but needs no interception: each parameter becomes a free
input Variable named after it, the function is called once on those, and the
Variables it returns are frozen with their plan (rewritten, stacked and ordered
once: the plan ``outlines.eval`` makes, ``Plan``). Calling the
Program binds the inputs and runs one schedule of that plan; an array argument
flows through as one node per op, so all its elements batch together. Before
running, the inputs' shapes are propagated through the graph
(``outlines.graph.shapes.propagate``), so a pairing that cannot work raises
``GraphBuildError`` naming both shapes before any model is called.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any, Callable, Sequence

from outlines.common.errors import GraphBuildError, JobsRunning, UnboundInputError
from outlines.runtime.evaluate import run_plan, run_sync
from outlines.graph.basic import Variable, as_variable
from outlines.graph.shapes import Shape, propagate, shape_of
from outlines.runtime.plan import Plan, as_value
from outlines.graph.basic import string
from outlines.runtime.jobs import Jobs
from outlines.runtime.session import Options

if TYPE_CHECKING:
    from outlines.runtime.stream import Stream

__all__ = ["Program", "chain", "compile"]


class Program:
    """A traced graph with named inputs; call it like the function it came from.

    Made by ``outlines.compile``. ``program(*args, **kwargs)`` binds the
    inputs (by position or by name) and evaluates in one schedule: a ``str``
    argument gives a scalar, list or array arguments give arrays (row ``i``
    computed from element ``i``; scalars broadcast), and a tuple of outputs
    gives a tuple of values. Before anything is sent, the inputs' shapes are
    checked through the whole graph. ``await program.acall(...)`` does the
    same on the running event loop; ``program.stream(...)`` yields elements
    as they finish; ``program.with_options(**options)`` is the same program
    with other evaluation options; ``program.visualize(...)`` draws it.

    Attributes
    ----------
    inputs
        The free input Variables, in parameter order.
    outputs
        The output Variables (one, or a tuple).

    Raises
    ------
    UnboundInputError
        When called without a value for some input (all are named).
    GraphBuildError
        When called on inputs whose shapes cannot pair in the graph.
    TypeError
        For too many arguments, or an unknown or repeated keyword.

    Examples
    --------
    >>> import asyncio, outlines
    >>> greet = outlines.compile(lambda greeting, name: greeting + ", " + name)
    >>> greet("Hello", name="Ada")
    'Hello, Ada'
    >>> greet("Hi", ["Ann", "Bob"]).tolist()
    ['Hi, Ann', 'Hi, Bob']
    >>> asyncio.run(greet.acall("Hey", "you"))
    'Hey, you'
    >>> greet.with_options(cache=False)("Bye", "Bob")
    'Bye, Bob'
    """

    def __init__(
        self,
        inputs: Sequence[Variable],
        outputs: Variable | Sequence[Variable],
        *,
        name: str = "program",
        options: Options | dict[str, Any] | None = None,
        _plan: Plan | None = None,
    ) -> None:
        self.inputs = tuple(inputs)
        for variable in self.inputs:
            if not isinstance(variable, Variable) or variable.owner is not None:
                raise GraphBuildError(f"compile: inputs must be free input Variables, got {variable!r}")
        self._single = not isinstance(outputs, (list, tuple))
        outs: list[Variable] = [as_variable(o) for o in (outputs if isinstance(outputs, (list, tuple)) else [outputs])]
        self.outputs: Variable | tuple[Variable, ...] = outs[0] if self._single else tuple(outs)
        self._outputs = outs
        self.name = name
        self.options = options if isinstance(options, Options) else Options.check(options or {})
        self.plan = _plan or Plan(outs)  # built once, run by every call
        self._positions = {v.name or f"arg{i}": v for i, v in enumerate(self.inputs)}
        self._checked: set[tuple[Shape, ...]] = set()

    def check_shapes(self, givens: dict[Variable, Any]) -> None:
        """Raise ``GraphBuildError`` when the inputs' shapes cannot pair in the graph.

        Checked once per combination of input shapes.
        """
        shapes = tuple(shape_of(as_value(givens[v])) if v in givens else None for v in self.inputs)
        if shapes in self._checked:
            return
        propagate(self.plan.nodes, {id(v): s for v, s in zip(self.inputs, shapes) if s != v.shape})
        self._checked.add(shapes)

    def _givens(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Variable, Any]:
        if len(args) > len(self.inputs):
            raise TypeError(f"{self.name}() takes {len(self.inputs)} argument(s) but {len(args)} were given")
        givens: dict[Variable, Any] = dict(zip(self.inputs, args))
        for key, value in kwargs.items():
            variable = self._positions.get(key)
            if variable is None:
                raise TypeError(f"{self.name}() got an unexpected argument {key!r}; inputs: {', '.join(self._positions)}")
            if variable in givens:
                raise TypeError(f"{self.name}() got multiple values for argument {key!r}")
            givens[variable] = value
        missing = [name for name, v in self._positions.items() if v not in givens]
        if missing:
            raise UnboundInputError(missing)
        givens = {v: as_value(value) for v, value in givens.items()}  # once: checking and binding read these
        self.check_shapes(givens)
        return givens

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate on the running event loop."""
        return await self._run(self._givens(args, kwargs))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate; a scalar for str arguments, arrays for list/array arguments."""
        givens = self._givens(args, kwargs)
        return run_sync(lambda blocked_loop: self._run(givens, blocked_loop))

    def submit(self, *args: Any, **kwargs: Any) -> list[str]:
        """Send the next round of provider batch jobs for these inputs and return at once.

        The program must be in batch mode (``compile(..., jobs=True)`` or
        ``with_options(jobs=...)``). Each call creates the jobs of the next
        round whose inputs are ready (the first round first) or finds those
        already running (the cache's ledger): nothing is paid twice. A plain
        call with the same inputs later waits for the jobs and collects.

        Parameters
        ----------
        *args, **kwargs
            The inputs, as for a call.

        Returns
        -------
        list[str]
            The provider's ids of the jobs still running (empty: every
            round is done, and the next call answers from the cache).

        Raises
        ------
        ValueError
            When the program is not in batch mode.

        Examples
        --------
        >>> import outlines
        >>> outlines.compile(lambda q: q + "!").submit("hi")
        Traceback (most recent call last):
        ...
        ValueError: submit needs a program in batch mode: compile(..., jobs=True) or program.with_options(jobs=True)
        """
        settings = Jobs.of(self.options.jobs)
        if settings is None:
            raise ValueError("submit needs a program in batch mode: compile(..., jobs=True) or "
                             "program.with_options(jobs=True)")
        options = self.options.with_changes(jobs=dataclasses.replace(settings, wait=False), errors="raise")
        givens = self._givens(args, kwargs)
        try:
            run_sync(lambda blocked_loop: run_plan(self.plan, givens, options, blocked_loop))
        except JobsRunning as running:
            return running.jobs
        return []

    async def _run(self, givens: dict[Variable, Any], blocked_loop: Any = None) -> Any:
        results = await run_plan(self.plan, givens, self.options, blocked_loop, check=False)  # checked in _givens
        results = self.plan.pick(results)  # each output's own value, where the plan stacked it into an array
        return results[0] if self._single else tuple(results)

    def stream(self, *args: Any, chunk_size: int | None = None, **kwargs: Any) -> Stream:
        """Evaluate over arrays of inputs, yielding ``(index, value)`` as elements finish.

        ``index`` is the element's position along the leading axis of the
        array inputs (scalar inputs, and arrays of length 1, broadcast);
        ``value`` is what the Program returns for that element: a ``str``, a
        row of samples (an array), or a tuple for several outputs. The leading
        axis is cut into chunks of ``chunk_size`` elements, one schedule each,
        all running at once within one evaluation's limits; the elements of a
        chunk come out together, chunks in the order they finish.

        Parameters
        ----------
        *args, **kwargs
            The inputs, as for calling the Program.
        chunk_size
            Elements per schedule (default: the smallest ``max_batch`` of the
            program's models, 1 when none sets one). Smaller chunks yield
            sooner; larger ones batch more model calls together.

        Returns
        -------
        Stream
            Iterate it with ``for`` (sync code, Jupyter included) or
            ``async for``. Finished draws are cached as they finish;
            ``errors="return"`` yields failed elements holding
            ``outlines.Failure``; ``errors="raise"`` raises a chunk's
            ``NodeError`` where that chunk would have been yielded, after the
            chunks that finished before it. Leaving the loop early cancels
            the rest.

        Raises
        ------
        ValueError
            When no input is an array, the array inputs' leading axes differ,
            or ``chunk_size`` is not a positive integer.

        Examples
        --------
        >>> shout = compile(lambda text: text + "!")
        >>> sorted(shout.stream(["a", "b"]))
        [(0, 'a!'), (1, 'b!')]
        """
        from outlines.runtime.stream import stream_program

        return stream_program(self, self._givens(args, kwargs), chunk_size)

    def with_options(self, **options: Any) -> Program:
        """The same program evaluated with other options (``cache``, ``errors``...)."""
        merged = self.options.with_changes(**options)
        return Program(self.inputs, self.outputs, name=self.name, options=merged, _plan=self.plan)

    def visualize(self, filename: str | None = None, format: str | None = None, **kwargs: Any) -> Any:  # noqa: A002
        """Draw the program's graph; see ``outlines.visualize``."""
        from outlines.graph.viz.writers import visualize

        return visualize(*self._outputs, filename=filename, format=format, draws=self.plan.draw_numbers(), **kwargs)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from outlines.graph.viz.jupyter import mimebundle

        return mimebundle(*self._outputs)

    def __repr__(self) -> str:
        names = ", ".join(self._positions)
        return f"Program({self.name}({names}), {len(self.plan.nodes)} nodes)"


def compile(  # noqa: A001
    fn_or_inputs: Callable[..., Any] | Sequence[Variable],
    outputs: Variable | Sequence[Variable] | None = None,
    **options: Any,
) -> Program:
    """Trace a function (or take inputs and outputs) into a ``Program``.

    Parameters
    ----------
    fn_or_inputs
        A function of free text inputs, traced once with one input Variable per
        parameter (named after it); or a list of input Variables.
    outputs
        With a list of inputs: the output Variable(s).
    **options
        Evaluation options used by every call (``cache``, ``errors``...).

    Returns
    -------
    Program

    Examples
    --------
    >>> shout = compile(lambda text: text + "!")
    >>> shout("hi")
    'hi!'
    >>> list(shout(["a", "b"]))
    ['a!', 'b!']
    """
    if outputs is not None:
        if callable(fn_or_inputs):
            raise TypeError("compile takes a function, or a list of inputs and the outputs")
        return Program(list(fn_or_inputs), outputs, options=options)
    fn = fn_or_inputs
    if not callable(fn):
        raise TypeError("compile takes a function, or a list of inputs and the outputs")
    parameters = inspect.signature(fn).parameters.values()
    for parameter in parameters:
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise GraphBuildError(f"compile: {fn.__name__} cannot take *{parameter.name}; name each input")
    inputs = [string(p.name) for p in parameters]
    traced: Any = fn(*inputs)
    if isinstance(traced, list):
        traced = tuple(traced)
    name = getattr(fn, "__name__", "program")
    return Program(inputs, traced, name=name if name != "<lambda>" else "program", options=options)


def chain(fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:
    """``compile`` as a decorator: ``@outlines.chain`` or ``@outlines.chain(**options)``.

    A seed name of the original proposal. The Program maps over several
    inputs at once: array arguments broadcast together, every element in one
    batched schedule.

    Parameters
    ----------
    fn
        The function to trace (when used as ``@chain``).
    **options
        Evaluation options for every call, as for ``compile``.

    Returns
    -------
    Program, or a decorator making one

    Examples
    --------
    >>> @chain
    ... def greet(greeting, name):
    ...     return greeting + ", " + name
    >>> list(greet(["hi", "bye"], ["Ann", "Bob"]))
    ['hi, Ann', 'bye, Bob']
    """
    if fn is None:
        return lambda f: compile(f, **options)
    return compile(fn, **options)
