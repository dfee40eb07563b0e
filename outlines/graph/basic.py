"""The three nouns of a graph: ``Variable``, ``Apply`` and ``Op``.

A ``Variable`` is a symbolic value: a free input (no owner), a ``Constant``, or
output ``index`` of an ``Apply``. An ``Apply`` is one use of an ``Op`` on input
Variables. An ``Op``'s equality and hash come from its parameters
(``__props__``), so two uses of equal Ops on the same inputs compute the same
thing. Apply nodes are numbered in creation order; every traversal is
deterministic. ``string`` and ``constant`` (``outlines.string``,
``outlines.constant``) are the user's constructors of free inputs and
Constants.
"""
from __future__ import annotations

import dis
import itertools
import sys
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Sequence

import numpy as np

from outlines.common.errors import GraphBuildError
from outlines.graph.families import note, stacking
from outlines.graph.ragged import Ragged
from outlines.graph.shapes import Shape, align, shape_of
from outlines.graph.traits import Traits

if TYPE_CHECKING:
    from outlines.graph.ops import Concat

__all__ = ["Apply", "Constant", "Op", "SymbolicValueError", "Variable", "as_variable", "constant", "string"]

_creation_order = itertools.count()

_SYMBOLIC_HINT = (
    "is symbolic: it has no value until it is evaluated. Call .eval() (or "
    "outlines.eval) to get its value, or use outlines.fn to run Python on it."
)


#: Why formatting a Variable is refused, and what to write instead.
_FORMAT_HINT = (
    "would put the text {text!r} into the string, not the Variable's value: the value is only known "
    "after evaluation. Build text from Variables with + (\"Answer this: \" + q) or an @outlines.prompt "
    "template ({{{{ q }}}}); repr() and print() still show the Variable."
)
#: ``BINARY_OP`` arguments of ``%`` and ``%=`` (CPython's NB_REMAINDER, NB_INPLACE_REMAINDER).
_PERCENT_OPS = {6, 19}
_BINARY_OP = dis.opmap.get("BINARY_OP")
_CONVERSIONS = {dis.opmap[name] for name in ("FORMAT_VALUE", "CONVERT_VALUE") if name in dis.opmap}


def _building_text() -> bool:
    """Whether the code calling ``str()`` on a Variable builds text with it (``%``, or ``!s`` in an f-string).

    ``print(v)`` and ``"%s" % v`` both reach ``__str__`` through C, so the
    caller's current instruction tells them apart: a ``%`` operator or an
    f-string conversion (Python compiles ``"%s" % (v,)`` into one) builds
    text; anything else (``print``, ``str()``, ``logging``) shows the Variable.
    """
    frame = sys._getframe(2)  # _building_text <- __str__ <- the code that asked
    if frame.f_globals.get("__name__") == "logging":  # "%s" % args, to show a log line
        return False
    code, offset = frame.f_code.co_code, frame.f_lasti
    if not 0 <= offset < len(code) - 1:
        return False
    return (code[offset] == _BINARY_OP and code[offset + 1] in _PERCENT_OPS) or code[offset] in _CONVERSIONS


class SymbolicValueError(TypeError):
    """A symbolic Variable was used where a concrete value is needed."""


class Variable:
    """A symbolic value in an outlines graph.

    Parameters
    ----------
    owner
        The ``Apply`` that computes this Variable, or ``None`` for an input.
    index
        Which output of ``owner`` this is.
    name
        A human name; for free inputs, the name ``givens`` may use.
    shape
        The static shape when known (see ``outlines.graph.shapes``): ``None``
        for an unknown rank, ``None`` sizes for sizes known only at run time.
    ragged
        Whether the value may be a ``Ragged`` (rows of different lengths).

    Variables hash by identity (they are dict keys in ``givens``); comparing
    them with ``==`` or ``<`` raises, like ``bool()``, because the answer is
    only known after evaluation.
    """

    __slots__ = ("owner", "index", "name", "shape", "ragged", "__weakref__")
    #: Whether this is a ``Constant`` (read where importing the class would be a cycle).
    is_constant = False

    def __init__(
        self,
        owner: Apply | None = None,
        index: int = 0,
        name: str | None = None,
        shape: Shape = None,
        ragged: bool = False,
    ) -> None:
        self.owner = owner
        self.index = index
        self.name = name
        self.shape = shape
        self.ragged = ragged

    @property
    def ndim(self) -> int | None:
        """The rank when known, else ``None``."""
        return None if self.shape is None else len(self.shape)

    # -- symbolic guards (Dask-style): fail loudly instead of guessing --------
    def __bool__(self) -> bool:
        raise SymbolicValueError(f"The truth value of {self!r} {_SYMBOLIC_HINT}")

    def __iter__(self) -> Any:
        raise SymbolicValueError(f"Iterating over {self!r} is not possible: it {_SYMBOLIC_HINT}")

    def __len__(self) -> int:
        if self.shape and self.shape[0] is not None:
            return self.shape[0]
        raise SymbolicValueError(f"len() of {self!r} is unknown: it {_SYMBOLIC_HINT}")

    def __index__(self) -> int:
        raise SymbolicValueError(f"{self!r} cannot be used as an index: it {_SYMBOLIC_HINT}")

    def _compare(self, symbol: str) -> NoReturn:
        raise SymbolicValueError(
            f"Comparing {self!r} with {symbol} is not possible: it {_SYMBOLIC_HINT} "
            "(inside a @outlines.prompt template, compare in the template or in an outlines.fn)"
        )

    def __eq__(self, other: object) -> bool:
        return self._compare("==")

    def __ne__(self, other: object) -> bool:
        return self._compare("!=")

    def __lt__(self, other: object) -> bool:
        return self._compare("<")

    def __le__(self, other: object) -> bool:
        return self._compare("<=")

    def __gt__(self, other: object) -> bool:
        return self._compare(">")

    def __ge__(self, other: object) -> bool:
        return self._compare(">=")

    def __contains__(self, item: object) -> bool:
        raise SymbolicValueError(f"`in` on {self!r} is not possible: it {_SYMBOLIC_HINT}")

    __hash__ = object.__hash__

    # -- formatting: an f-string would send the repr as the prompt -------------
    def __format__(self, spec: str) -> str:
        raise SymbolicValueError(self._format_error())

    def __str__(self) -> str:
        if _building_text():
            raise SymbolicValueError(self._format_error())
        return repr(self)

    def _format_error(self) -> str:
        return f"Formatting {self!r} into a string (f-string, format(), str.format or %) " + _FORMAT_HINT.format(
            text=repr(self)
        )

    # -- arrays ---------------------------------------------------------------
    def __getitem__(self, key: Any) -> Variable:
        from outlines.graph.ops import Index

        return Index.create(key)(self)

    def reshape(self, *shape: Any) -> Variable:
        """The same elements in another shape, like ``numpy.reshape``.

        Parameters
        ----------
        *shape
            The new sizes, as separate integers or one tuple; one size may be
            ``-1`` (inferred from the others).

        Returns
        -------
        Variable

        Raises
        ------
        GraphBuildError
            When the static shape is known and has another number of elements.

        Examples
        --------
        >>> import numpy as np, outlines
        >>> grid = outlines.constant(np.array([["a", "b"], ["c", "d"]], dtype=object))
        >>> grid.reshape(4).eval().tolist()
        ['a', 'b', 'c', 'd']
        >>> grid.reshape(-1, 1).shape
        (4, 1)
        """
        from outlines.graph.ops import Reshape

        sizes = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return Reshape(tuple(int(n) for n in sizes))(self)

    def expand_dims(self, axis: int) -> Variable:
        """A size-1 axis inserted at ``axis`` (``v[..., None]`` is ``axis=-1``); see ``outlines.expand_dims``.

        Parameters
        ----------
        axis
            Where the new axis goes, counted in the result's axes.

        Returns
        -------
        Variable

        Examples
        --------
        >>> import numpy as np, outlines
        >>> outlines.constant(np.array(["a", "b"], dtype=object)).expand_dims(0).shape
        (1, 2)
        """
        from outlines.graph.ops import expand_dims

        return expand_dims(self, axis)

    # -- string building ------------------------------------------------------
    def __add__(self, other: Any) -> Variable:
        if type(other) is str and type(self) is Variable:
            # the common case, built thousands of times in a loop: nothing to convert or check
            return Apply(_CONCAT[0] if _CONCAT else _concat(), (self, Constant(other))).outputs[0]
        return _concat()(self, other)

    def __radd__(self, other: Any) -> Variable:
        if type(other) is str and type(self) is Variable:
            return Apply(_CONCAT[0] if _CONCAT else _concat(), (Constant(other), self)).outputs[0]
        return _concat()(other, self)

    # -- evaluation -------------------------------------------------------------
    def eval(self, givens: Any = None, **options: Any) -> Any:
        """Evaluate this Variable: ``outlines.eval(self, givens=givens, **options)``.

        Works in plain scripts and inside a running event loop (Jupyter): there
        the schedule runs on a private loop in a helper thread.

        Parameters
        ----------
        givens
            Values of the free inputs, keyed by Variable or by name; lists and
            tuples of strings are arrays.
        **options
            Evaluation options (``cache``, ``errors``, ``max_concurrency``,
            ``progress``, ``executor``, ``budget``, ``batch_window``); see
            ``outlines.eval``.

        Returns
        -------
        Any
            A ``str`` (or any Python value) for a scalar, a NumPy object array
            for an array, an ``outlines.Ragged`` for rows of different lengths.

        Raises
        ------
        UnboundInputError
            When ``givens`` misses free inputs (all are listed).
        NodeError
            When a node fails (with ``errors="raise"``), naming the node.

        Examples
        --------
        >>> import outlines
        >>> question = outlines.string("question")
        >>> (question + "?").eval({"question": "why"})
        'why?'
        >>> (question + "?").eval({question: ["why", "how"]}).tolist()
        ['why?', 'how?']
        """
        from outlines.runtime.evaluate import eval as _eval

        return _eval(self, givens=givens, **options)

    async def aeval(self, givens: Any = None, **options: Any) -> Any:
        """Evaluate this Variable on the running event loop, in async code; see ``eval``.

        Parameters
        ----------
        givens
            Values of the free inputs, as for ``eval``.
        **options
            Evaluation options, as for ``eval``.

        Returns
        -------
        Any
            As ``eval``.

        Raises
        ------
        UnboundInputError, NodeError
            As ``eval``.

        Examples
        --------
        >>> import asyncio, outlines
        >>> question = outlines.string("question")
        >>> asyncio.run((question + "?").aeval({"question": "why"}))
        'why?'
        """
        from outlines.runtime.evaluate import aeval as _aeval

        return await _aeval(self, givens=givens, **options)

    @property
    def label(self) -> str:
        """A short human label: the name, or the op's name with its number."""
        if self.name:
            return self.name
        if self.owner is not None:
            suffix = f".{self.index}" if len(self.owner.outputs) > 1 else ""
            return self.owner.label + suffix
        return f"input_{id(self) & 0xFFFF:x}"

    def __repr__(self) -> str:
        if self.owner is None:
            return f"Variable({self.label!r})"
        return f"Variable({self.label!r}, op={self.owner.op!r})"

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        from outlines.graph.viz.jupyter import mimebundle

        return mimebundle(self)


class Constant(Variable):
    """A Variable with a fixed value."""

    __slots__ = ("value",)
    is_constant = True

    def __init__(self, value: Any, name: str | None = None) -> None:
        super().__init__(None, 0, name, shape_of(value), isinstance(value, Ragged))
        self.value = value

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        text = repr(self.value) if not isinstance(self.value, np.ndarray) else f"array{self.value.shape}"
        return text if len(text) <= 24 else text[:21] + "..."

    def __repr__(self) -> str:
        return f"Constant({self.label})"


class Apply:
    """One application of ``op`` to ``inputs``, producing ``outputs``."""

    # family: the node's family (``outlines.graph.families``) or None; rank: set on a member only.
    __slots__ = ("op", "inputs", "outputs", "order", "family", "rank", "__weakref__")

    def __init__(self, op: Op, inputs: Sequence[Variable], noutputs: int = 1, *, sibling: bool = True) -> None:
        self.op = op
        self.inputs: tuple[Variable, ...]
        if len(inputs) == 1:  # a chain's node: its input's attributes read without a comprehension's frame
            variable = inputs[0]
            owner = variable.owner
            if owner is not None and len(owner.outputs) == 1:
                # the one output of a one-output node: its owner's outputs tuple is this node's inputs,
                # shared (tuples are immutable), one container less for the collector per node of a chain
                self.inputs = owner.outputs
            else:
                self.inputs = (variable,)
            shapes = op.infer_shapes([variable.shape], noutputs)
            ragged = op.ragged_outputs([variable.ragged], noutputs)
        else:
            inputs = self.inputs = tuple(inputs)
            shapes = op.infer_shapes([v.shape for v in inputs], noutputs)
            ragged = op.ragged_outputs([v.ragged for v in inputs], noutputs)
        self.order = next(_creation_order)
        if noutputs == 1:  # the common case, kept cheap for deep graphs
            self.outputs: tuple[Variable, ...] = (Variable(self, 0, None, shapes[0], ragged[0]),)
            # ``sibling=False``: a node a plan makes for itself, never a user's sibling.
            stacks = op._stacks
            if stacks is None:
                stacks = stacking(op) or False
                op._stacks = stacks
            if stacks and sibling:  # a tuple: how its uses join families
                note(self, stacks)
            else:
                self.family = None
        else:
            self.family = None
            self.outputs = tuple(Variable(self, i, None, shapes[i], ragged[i]) for i in range(noutputs))

    @property
    def out(self) -> Variable:
        """The single output (most Ops have exactly one)."""
        return self.outputs[0]

    @property
    def label(self) -> str:
        return f"{self.op.name}#{self.order}"

    def __repr__(self) -> str:
        return f"Apply({self.label}, inputs={[v.label for v in self.inputs]})"


#: Class attributes that once said what ``Traits`` says now: an op declaring one would be silently misread.
_RETIRED_FLAGS = ("mode", "pure", "elementwise", "guards_elements", "moves_unknown")


class Op:
    """Base class of every operation.

    Subclasses list their parameters in ``__props__``; equality and hashing come
    from ``type(self)`` and those parameters. Each subclass declares its
    ``traits`` (``outlines.graph.traits.Traits``): how the scheduler runs it
    (inline, a Python step, a model call, a loop or branch), whether it is
    pure, elementwise, and so on. The planner and the scheduler read those,
    never flags on the op. An op whose traits follow its parameters (a user
    function's purity) computes its record once, in ``__init__``.
    """

    __props__: tuple[str, ...] = ()
    #: What the planner and the scheduler may assume of this op (a pure inline op unless declared).
    traits: Traits = Traits()
    #: How this op's uses join families (``Apply``: ``families.stacking``, or False), once known.
    _stacks: tuple[int, Any] | Literal[False] | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        retired = [name for name in _RETIRED_FLAGS if name in vars(cls)]
        if retired:
            raise TypeError(f"{cls.__name__} sets {', '.join(retired)}: declare traits = Traits(...) instead "
                            "(outlines.graph.traits)")

    def make_node(self, *inputs: Any) -> Apply:
        return Apply(self, [as_variable(x) for x in inputs])

    def stacked(self) -> Op | None:
        """The op computing this op's results for many of its uses stacked along a new leading axis.

        The one stacking rule (``outlines.runtime.plan``): sibling uses of ops
        of one kin whose inputs are constants or members of stacked families
        become one node of this op over their arrays. An elementwise op
        (``elementwise``: it pairs its inputs on leading axes, one result per
        element) computes the stacked results itself, pure or not: an impure
        one (an ``outlines.fn`` not declared pure) still runs once per
        element, and is never merged. Any other op returns ``None`` and never
        stacks.
        """
        return self if self.traits.elementwise else None

    @property
    def kin(self) -> Any:
        """What equal ops share when the plan stacks or merges them: the op itself (its parameters).

        A control op (``outlines.graph.control``) is its own op per call, but
        its kin is its traced structure: loops built from the same code stack.
        """
        return self

    def __call__(self, *inputs: Any) -> Variable:
        node = self.make_node(*inputs)
        return node.outputs[0] if len(node.outputs) == 1 else node.outputs  # type: ignore[return-value]  # an op of n outputs returns their tuple

    def perform(self, *values: Any, **options: Any) -> Any:
        """Compute the output value(s) from the input values.

        ``options`` are the keywords its traits declare it takes:
        ``on_error`` and ``on_failed_input`` (``guards_elements``),
        ``unknown`` (``moves_unknown``).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement perform")

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        """Static output shapes from the inputs' (``GraphBuildError`` when they cannot pair).

        Elementwise ops (``traits.elementwise``) pair their inputs on leading
        axes (``outlines.graph.shapes.align``); others do not know by default.
        """
        if self.traits.elementwise:
            return [align(self.name, shapes)] * noutputs
        return [None] * noutputs

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        """Which outputs may be ``Ragged``: elementwise ops keep their inputs' rows."""
        return [self.traits.elementwise and any(ragged)] * noutputs

    def __getstate__(self) -> dict[str, Any]:
        # String hashes differ between processes: never ship the cached one.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def _props(self) -> tuple[Any, ...]:
        return tuple(getattr(self, p) for p in self.__props__)

    @property
    def name(self) -> str:
        return type(self).__name__

    def describe(self) -> dict[str, Any]:
        """How pictures show this op: fields of a ``DrawnNode`` (``graph.viz.drawing``).

        ``kind`` (``"op"``, ``"prompt"``, ``"model"``, ``"python"``), ``title`` and
        ``lines`` under it; model calls add ``backend``, ``params`` and
        ``num_samples``. The default is a plain box titled with ``name``.
        """
        return {"kind": "op", "title": self.name}

    def argument_name(self, position: int, ninputs: int) -> str:
        """The label of the edge into input ``position`` in pictures."""
        return str(position) if ninputs > 1 else ""

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._props() == other._props()

    def __hash__(self) -> int:
        # Ops are immutable once built; planning hashes them once per node.
        try:
            known: int = self.__dict__["_hash"]
            return known
        except KeyError:
            value = self.__dict__["_hash"] = hash((type(self), self._props()))
            return value

    def __repr__(self) -> str:
        props = ", ".join(f"{p}={getattr(self, p)!r}" for p in self.__props__)
        return f"{type(self).__name__}({props})"


def string(name: str | None = None) -> Variable:
    """A free string input, bound at evaluation time (by Variable or by ``name``).

    Parameters
    ----------
    name
        The name ``givens`` may bind it by (``{"question": ...}``).

    Returns
    -------
    Variable
        A Variable with no owner: a free input of every graph built on it.

    Examples
    --------
    >>> question = string("question")
    >>> (question + "?").eval({"question": "why"})
    'why?'
    """
    return Variable(None, 0, name)


def constant(value: Any, name: str | None = None) -> Constant:
    """A Variable that always holds ``value``.

    Parameters
    ----------
    value
        Any Python value: a str, a NumPy object array (an array constant), a
        ``Ragged``... A list stays one Python value; use
        ``np.array(values, dtype=object)`` for an array of strings.
    name
        A label for pictures and traces.

    Returns
    -------
    Constant
        A Variable with no owner whose ``shape`` is the value's.

    Examples
    --------
    >>> constant("hi", name="greeting").eval()
    'hi'
    """
    return Constant(value, name)


def as_object_array(values: Any) -> np.ndarray:
    """A NumPy object array of ``values`` (nested lists keep their shape)."""
    if isinstance(values, np.ndarray) and values.dtype == object:
        return values
    if isinstance(values, np.ndarray):
        return values.astype(object)
    types = set(map(type, values))  # one C-speed pass; then a check per distinct type
    if types <= {str}:  # the usual given, a list of texts: one C-speed copy
        return np.fromiter(values, dtype=object, count=len(values))
    nested = any(issubclass(t, (list, tuple, np.ndarray)) for t in types)
    if nested:
        return np.array(values, dtype=object)
    array = np.empty(len(values), dtype=object)
    array[:] = list(values)
    return array


def as_variable(value: Any, *, array: bool = False) -> Variable:
    """Wrap a non-symbolic value as a ``Constant``; a Variable is returned as it is.

    A list or tuple holding Variables becomes a ``Stack`` of them. With
    ``array=True`` (prompts, givens), a plain list or tuple becomes a NumPy
    object array; otherwise it stays one Python value.

    Parameters
    ----------
    value
        A Variable, a value, or a list/tuple of either.
    array
        Whether a plain list or tuple is an array (``True``) or one value.

    Returns
    -------
    Variable

    Raises
    ------
    GraphBuildError
        For a nested list holding Variables (ambiguous: use ``outlines.stack``).

    Examples
    --------
    >>> as_variable(["a", "b"], array=True).shape
    (2,)
    >>> as_variable(["a", "b"]).shape
    ()
    """
    if isinstance(value, Variable):
        return value
    if isinstance(value, (list, tuple)) and any(isinstance(v, Variable) for v in value):
        from outlines.graph.ops import Stack

        return Stack(len(value))(*value)
    if isinstance(value, (list, tuple)) and _nests_variables(value):
        raise GraphBuildError(
            "a nested list holding Variables is ambiguous; build it with outlines.stack(..., axis=...)"
        )
    if array and isinstance(value, (list, tuple)):
        return Constant(as_object_array(value))
    return Constant(value)


def _nests_variables(value: Any) -> bool:
    return any(isinstance(v, Variable) or (isinstance(v, (list, tuple)) and _nests_variables(v)) for v in value)


_CONCAT: list[Concat] = []


def _concat() -> Concat:
    """The ``+`` op, made once: for build speed, not for families.

    Equal ops are siblings whichever object they are; a new op per ``+``
    would cost its hash and kin each time (measured: 4.1 against 5.8 us per
    node of chains ``llm(llm(llm(q) + "a") + "b")``).
    """
    if not _CONCAT:
        from outlines.graph.ops import Concat

        _CONCAT.append(Concat())
    return _CONCAT[0]
