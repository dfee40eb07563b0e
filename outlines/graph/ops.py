"""Elementwise machinery shared by every op, and the small structural ops.

Values at run time are Python scalars, NumPy object arrays or ``Ragged``
rows. ``broadcast_map`` applies a scalar function over arguments paired on
their LEADING axes (``outlines.graph.shapes``) in one tight loop; ``core_map``
does the same for functions that take whole core axes (gufunc signatures,
template list arguments). With ``errors="return"`` they turn failing elements
into ``Failure`` values and skip elements whose inputs already failed.
Structural ops (``Index``, ``Reshape``, ``Stack``, ``Concatenate``) are pure
and inline, so rewrites may merge and fold them.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from outlines.common.errors import Failure, GraphBuildError
from outlines.graph.basic import Apply, Constant, Op, Variable, as_variable
from outlines.graph.ragged import Ragged
from outlines.graph.shapes import Shape, align, broadcast_leading, pad_trailing, show
from outlines.graph.traits import Traits

__all__ = [
    "Concat",
    "Concatenate",
    "Flatten",
    "Index",
    "Regroup",
    "Reshape",
    "Stack",
    "all_text",
    "broadcast_map",
    "concatenate",
    "core_map",
    "expand_dims",
    "scalar_or_array",
    "stack",
]


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
    call = fn if on_error is None and on_failed_input is None else _guarded(fn, on_error, on_failed_input)
    ragged = next((a for a in args if isinstance(a, Ragged)), None)
    if ragged is not None:
        flat = broadcast_map(call, _flatten_rows(ragged, [(a, 0) for a in args]))
        return ragged.with_values(flat)
    if not any(isinstance(a, np.ndarray) for a in args):
        return call(*args)
    shape, arrays = broadcast_leading("elementwise op", [_as_array(a) for a in args])
    flats = [a.reshape(-1) for a in arrays]
    count = int(np.prod(shape, dtype=np.int64))
    if on_error is not None and not any(_holds_failure(flat) for flat in flats):
        # no failed input (one pass over each): only exceptions to guard, without a wrapper per element
        out = np.fromiter(_each_once(fn, on_error, flats), dtype=object, count=count)
    else:
        out = np.fromiter(map(call, *flats), dtype=object, count=count)
    return out.reshape(shape)


def _holds_failure(flat: np.ndarray) -> bool:
    return any(issubclass(kind, Failure) for kind in set(map(type, flat)))


def _each_once(fn: Callable[..., Any], on_error: Callable[[BaseException], Failure], flats: list[np.ndarray]) -> list[Any]:
    """``fn`` over the elements of ``flats``, each called exactly once; one that raises is its Failure (``on_error``)."""
    results: list[Any] = []
    append, elements = results.append, zip(*flats)
    while True:
        try:
            for values in elements:  # resumes after the element that raised
                append(fn(*values))
        except Exception as exc:  # noqa: BLE001 - becomes the element's Failure
            append(on_error(exc))
            continue
        return results


def _flatten_rows(ragged: Ragged, args: list[tuple[Any, int]]) -> list[Any]:
    """Arguments over the items of ``ragged``'s rows: one entry per value.

    Each argument comes with its core rank. Another ``Ragged`` must have the
    same rows; an array pairs its leading (loop) axes with the outer axes and
    is repeated along each row.
    """
    outer = ragged.outer
    out: list[Any] = []
    for value, core in args:
        if isinstance(value, Ragged):
            if not np.array_equal(value.lengths, ragged.lengths):
                raise GraphBuildError(f"cannot pair ragged values of shapes {show(ragged.shape)} and {show(value.shape)} with different row lengths")
            out.append(value.values)
        elif isinstance(value, np.ndarray):
            loop = value.shape[: value.ndim - core]
            if len(loop) > len(outer):
                raise GraphBuildError(
                    f"cannot pair shapes {show(value.shape)} and {show(ragged.shape)}: the axis after "
                    f"{show(tuple(outer))} is ragged in the second; reduce or index the first"
                )
            padded = value.reshape(loop + (1,) * (len(outer) - len(loop)) + value.shape[len(loop):])
            try:
                full = np.broadcast_to(padded, outer + value.shape[len(loop):])
            except ValueError:
                raise GraphBuildError(f"cannot pair shapes {show(value.shape)} and {show(ragged.shape)} on their leading axes") from None
            out.append(ragged.repeat(full))
        else:
            out.append(value)
    return out


def core_map(
    call: Callable[..., Any],
    args: Sequence[Any],
    cores: Sequence[int],
    core_outputs: Sequence[bool] = (False,),
    where: str = "function",
) -> Any:
    """Apply ``call`` over the loop axes of ``args``; each gets its last ``cores[i]`` axes whole.

    The loop axes pair on their leading axes. A ``Ragged`` argument whose core
    covers its ragged axis gets one row at a time; otherwise the loop runs
    over every item of every row and the results keep the rows. An output
    with a core axis (``core_outputs``) whose lengths differ across the loop
    is a ``Ragged``. Several outputs come back as a tuple.
    """
    several = len(core_outputs) > 1
    looping = next(
        (a for a, c in zip(args, cores) if isinstance(a, Ragged) and c < 1 + len(a.inner)), None
    )
    if looping is not None:
        if any(isinstance(a, Ragged) and c >= 1 + len(a.inner) for a, c in zip(args, cores)):
            raise GraphBuildError(f"{where}: cannot both loop over one ragged value's items and take another's rows")
        flat = core_map(call, _flatten_rows(looping, list(zip(args, cores))), cores, core_outputs, where)
        results = flat if several else (flat,)
        if any(isinstance(r, Ragged) for r in results):
            raise GraphBuildError(f"{where}: ragged results inside ragged rows are not supported")
        wrapped = tuple(looping.with_values(r) for r in results)
        return wrapped if several else wrapped[0]
    arrays: list[np.ndarray] = []
    loops: list[tuple[int, ...]] = []
    core_ranks: list[int] = []
    for value, core in zip(args, cores):
        if isinstance(value, Ragged):
            if core > 1 + len(value.inner):
                raise GraphBuildError(f"{where}: a core of {core} axes spans the ragged axis of {show(value.shape)}")
            rows = value.rows()
            array = np.empty(len(rows), dtype=object)
            for i, row in enumerate(rows):
                array[i] = row
            value, core = array.reshape(value.outer), 0
        array = _as_array(value)
        if array.ndim < core:
            raise GraphBuildError(f"{where}: an argument of shape {show(array.shape)} has fewer than the {core} core axes it needs")
        arrays.append(array)
        loops.append(array.shape[: array.ndim - core])
        core_ranks.append(core)
    rank = max((len(loop) for loop in loops), default=0)
    padded = [a.reshape(loop + (1,) * (rank - len(loop)) + a.shape[len(loop):]) for a, loop in zip(arrays, loops)]
    try:
        loop_shape = tuple(np.broadcast_shapes(*(p.shape[:rank] for p in padded)))
    except ValueError:
        raise GraphBuildError(f"{where}: cannot pair shapes {' and '.join(show(a.shape) for a in arrays)} on their leading axes") from None
    count = int(np.prod(loop_shape, dtype=np.int64))
    flats = [np.broadcast_to(p, loop_shape + p.shape[rank:]).reshape((count,) + p.shape[rank:]) for p in padded]
    results = [call(*(f[i] for f in flats)) for i in range(count)]
    columns = list(zip(*results)) if several else [results]
    outs = tuple(_assemble(list(col), loop_shape, is_core) for col, is_core in zip(columns, core_outputs))
    return outs if several else outs[0]


def _assemble(values: list[Any], loop_shape: tuple[int, ...], core: bool) -> Any:
    if not core:
        out = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):
            out[i] = v
        return scalar_or_array(out.reshape(loop_shape))
    rows = [v if isinstance(v, np.ndarray) else as_object_array(list(v)) for v in values]
    if not loop_shape:
        return rows[0]
    if len({r.shape for r in rows}) <= 1:
        inner = rows[0].shape if rows else (0,)
        return np.stack(rows).reshape(loop_shape + inner) if rows else np.empty(loop_shape + inner, dtype=object)
    return Ragged.from_rows(rows, loop_shape)


def as_object_array(values: Any) -> np.ndarray:
    from outlines.graph.basic import as_object_array as convert

    return convert(values)


def _guarded(
    fn: Callable[..., Any],
    on_error: Callable[[BaseException], Failure] | None,
    on_failed_input: Callable[[Failure], Failure] | None,
) -> Callable[..., Any]:
    def call(*values: Any) -> Any:
        for value in values:
            if isinstance(value, Failure):
                return on_failed_input(value) if on_failed_input else value
        if on_error is None:  # only failed inputs are guarded (an async step's coroutines settle later)
            return fn(*values)
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


class NotText:
    """Stands in for an element that is not text where text is required; using it raises ``error``.

    ``mark_not_text`` puts it in place of the element before the elementwise
    loop, while the element's index is still known, so the error names it.
    """

    __slots__ = ("error",)

    def __init__(self, error: TypeError) -> None:
        self.error = error


def mark_not_text(
    value: Any, refuses: Callable[[Any], bool], where: str, lists: bool = False
) -> Any:
    """``value`` with each element ``refuses`` rejects replaced by a ``NotText`` naming ``where``, its index and type.

    ``value`` is a scalar, an array or a ``Ragged``; with ``lists``, elements
    that are lists or arrays (list arguments of a template) are looked into
    too. ``Failure`` elements are left alone (they fail on their own).
    """
    if isinstance(value, Ragged):
        values = mark_not_text(value.values, refuses, where, lists)
        return value if values is value.values else value.with_values(values)
    if not isinstance(value, np.ndarray):
        if lists and isinstance(value, (list, tuple)):
            marked = [_marked(item, refuses, f"{where} at index {i}") for i, item in enumerate(value)]
            return value if all(a is b for a, b in zip(marked, value)) else type(value)(marked)
        return _marked(value, refuses, where)
    if all_text(value.flat) or not any(refuses(v) or (lists and isinstance(v, (list, tuple))) for v in value.flat):
        return value  # the common case: nothing to say, nothing copied
    out = value.copy()
    for index, element in np.ndenumerate(value):
        at = f"{where} at index {index[0] if len(index) == 1 else index}" if index else where
        out[index] = (mark_not_text(element, refuses, at) if lists and isinstance(element, (list, tuple))
                      else _marked(element, refuses, at))
    return out


def _marked(element: Any, refuses: Callable[[Any], bool], where: str) -> Any:
    if isinstance(element, Failure) or not refuses(element):
        return element
    return NotText(TypeError(f"{where} is {type(element).__name__} {element!r:.40}, not text"))


def raise_not_text(values: Any) -> None:
    """Raise the error of the first ``NotText`` among ``values`` (elements, or items of list elements)."""
    for value in values:
        if isinstance(value, NotText):
            raise value.error
        if isinstance(value, (list, tuple)):
            raise_not_text(value)


def all_text(values: Sequence[Any] | np.flatiter[Any]) -> bool:
    """Whether the type of every one of ``values`` (a sequence, or an array's ``flat``) is exactly ``str``.

    The usual prompts, completions and operands of ``+``: one C-speed pass whatever the texts' lengths. ``False`` says only that
    the caller must look closer: it then checks each value (a ``str``
    subclass is text) and names the first that is not.

    Examples
    --------
    >>> all_text(["a", "b"]), all_text(["a", 1]), all_text([])
    (True, False, True)
    """
    return list(map(type, values)).count(str) == len(values)


def not_str(value: Any) -> bool:
    """What ``+`` refuses: anything but text."""
    return not isinstance(value, str)


class Concat(Op):
    """String concatenation of its inputs, elementwise (``a + b``).

    An element that is not text fails with an error naming the operand, its
    index and its type; with ``errors="return"`` only that element fails.
    """

    traits = Traits(elementwise=True, guards_elements=True)

    def make_node(self, *inputs: Any) -> Apply:
        variables = [as_variable(x) for x in inputs]
        for variable in variables:
            check_text_input(self, variable, "each operand of +")
        return Apply(self, variables)

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "+ (concat)"}

    def perform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        if len(values) == 2 and type(values[0]) is str and type(values[1]) is str:
            return values[0] + values[1]  # two texts (``q + "?"``, folded by the plan per chain): nothing to check
        shape = _text_shape(values)
        if shape is not None and shape != ():  # all text, arrays of one shape: numpy adds them (str + str) in bulk
            total = values[0]
            for value in values[1:]:
                total = total + value
            return total
        marked = [mark_not_text(v, not_str, f"operand {i + 1} of +") for i, v in enumerate(values)]
        return broadcast_map(_join, marked, on_error=on_error, on_failed_input=on_failed_input)


def _text_shape(values: Sequence[Any]) -> tuple[int, ...] | None:
    """The shape of ``values`` when each is a ``str`` or an object array of ``str`` of that one shape, else None."""
    shape: tuple[int, ...] = ()
    for value in values:
        if type(value) is str:
            continue
        if type(value) is not np.ndarray or value.dtype != object or (shape and value.shape != shape):
            return None
        if not all_text(value.flat):
            return None
        shape = value.shape
    return shape


def _join(*parts: str) -> str:
    if not all(isinstance(p, str) for p in parts):
        raise_not_text(parts)
        bad = next(p for p in parts if not isinstance(p, str))
        raise TypeError(f"can only concatenate str, not {type(bad).__name__} {bad!r:.60}")
    return "".join(parts)


def _refuse_ragged(op: Op, ragged: list[bool]) -> None:
    if any(ragged):
        raise GraphBuildError(
            f"{op.name}: not defined on a ragged value (rows of different lengths); reduce its "
            "rows with an outlines.fn(signature='(n)->()') first"
        )


def _check_value(op: Op, value: Any) -> np.ndarray:
    if isinstance(value, Ragged):
        _refuse_ragged(op, [True])
    return _as_array(value)


class Stack(Op):
    """Stack ``n`` values along a new axis (``axis=-1``: a list of Variables).

    The values pair on their leading axes first, like every elementwise op.
    """

    traits = Traits(moves_unknown=True)  # moves elements without reading them (explain's dry run)

    __props__ = ("n", "axis")

    def __init__(self, n: int, axis: int = -1) -> None:
        self.n = n
        self.axis = axis

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": f"stack {self.n}", "lines": [] if self.axis == -1 else [f"axis={self.axis}"]}

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        shape = align(self.name, shapes)
        if shape is None:
            return [None]
        rank = len(shape) + 1
        if not -rank <= self.axis < rank:
            raise GraphBuildError(f"{self.name}: axis {self.axis} is out of range for a result of rank {rank}")
        out = list(shape)
        out.insert(self.axis % rank, self.n)
        return [tuple(out)]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        _refuse_ragged(self, ragged)
        return [False]

    def perform(self, *values: Any, unknown: Any = None) -> Any:
        _, arrays = broadcast_leading(self.name, [_check_value(self, v) for v in values])
        return np.stack(arrays, axis=self.axis)


class Concatenate(Op):
    """Join values of equal rank along an existing axis (``outlines.concatenate``)."""

    traits = Traits(moves_unknown=True)  # moves elements without reading them (explain's dry run)

    __props__ = ("axis",)

    def __init__(self, axis: int = 0) -> None:
        self.axis = axis

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "concatenate", "lines": [f"axis={self.axis}"]}

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        known = [s for s in shapes if s is not None]
        if len(known) < len(shapes):
            return [None]
        ranks = {len(s) for s in known}
        if len(ranks) != 1 or 0 in ranks:
            raise GraphBuildError(f"{self.name}: needs values of one rank >= 1, got shapes {' and '.join(show(s) for s in shapes)}")
        rank = ranks.pop()
        if not -rank <= self.axis < rank:
            raise GraphBuildError(f"{self.name}: axis {self.axis} is out of range for rank {rank}")
        axis = self.axis % rank
        out: list[int | None] = []
        for i in range(rank):
            sizes = [s[i] for s in known]
            given = [n for n in sizes if n is not None]
            if i == axis:
                out.append(sum(given) if len(given) == len(sizes) else None)
                continue
            if len(set(given)) > 1:
                raise GraphBuildError(f"{self.name}: shapes {' and '.join(show(s) for s in shapes)} differ off axis {self.axis}")
            out.append(given[0] if given else None)
        return [tuple(out)]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        _refuse_ragged(self, ragged)
        return [False]

    def perform(self, *values: Any, unknown: Any = None) -> Any:
        return np.concatenate([_check_value(self, v) for v in values], axis=self.axis)


def _index_part(part: Any) -> Any:
    """One part of an index key as plain data (props must hash and compare)."""
    if part is None or part is Ellipsis:
        return None if part is None else "..."
    if isinstance(part, slice):
        return ("slice", part.start, part.stop, part.step)
    if isinstance(part, Variable):
        raise GraphBuildError("indexing with a symbolic Variable is not supported; use an outlines.fn")
    if isinstance(part, (int, np.integer)) and not isinstance(part, bool):
        return int(part)
    raise GraphBuildError(f"unsupported index {part!r}: use ints, slices, None and ...")


def _python_part(part: Any) -> Any:
    if part == "...":
        return Ellipsis
    if isinstance(part, tuple):
        return slice(*part[1:])
    return part


def _show_part(part: Any) -> str:
    """An index part as Python writes it: ``1:3``, ``::2``, ``None``, ``...``."""
    if isinstance(part, tuple):
        start, stop, step = ("" if n is None else str(n) for n in part[1:])
        return f"{start}:{stop}" + (f":{step}" if step else "")
    return "..." if part == "..." else repr(part)


class Index(Op):
    """``v[key]`` for ints, slices, ``None`` (a new axis) and ``...``."""

    traits = Traits(moves_unknown=True)  # moves elements without reading them (explain's dry run)

    __props__ = ("parts",)

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self.parts = parts

    @classmethod
    def create(cls, key: Any) -> Index:
        """The op for a Python index key."""
        parts = key if isinstance(key, tuple) else (key,)
        return cls(tuple(_index_part(p) for p in parts))

    @property
    def name(self) -> str:
        return f"Index[{', '.join(_show_part(p) for p in self.parts)}]"

    def _key(self) -> tuple[Any, ...]:
        return tuple(_python_part(p) for p in self.parts)

    def stacked(self) -> Index:
        """The same key under a new leading axis: ``v[key]`` of each member is ``stacked[:, key]``."""
        return Index((("slice", None, None, None),) + self.parts)

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "index " + self.name[len("Index"):]}

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        (shape,) = shapes
        if shape is None:
            return [None]
        parts = list(self.parts)
        if parts.count("...") > 1:
            raise GraphBuildError(f"{self.name}: at most one ... in an index")
        used = sum(1 for p in parts if p is not None and p != "...")
        if used > len(shape):
            raise GraphBuildError(f"{self.name}: too many indices for a value of shape {show(shape)}")
        if "..." in parts:
            at = parts.index("...")
            parts[at : at + 1] = [("slice", None, None, None)] * (len(shape) - used)
        else:
            parts += [("slice", None, None, None)] * (len(shape) - used)
        out: list[int | None] = []
        axis = 0
        for part in parts:
            if part is None:
                out.append(1)
                continue
            size = shape[axis]
            axis += 1
            if isinstance(part, int):
                if size is not None and not -size <= part < size:
                    raise GraphBuildError(f"{self.name}: index {part} is out of bounds for an axis of size {size} in shape {show(shape)}")
            else:
                out.append(None if size is None else len(range(*slice(*part[1:]).indices(size))))
        return [tuple(out)]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        _refuse_ragged(self, ragged)
        return [False]

    def perform(self, value: Any, unknown: Any = None) -> Any:
        return scalar_or_array(_check_value(self, value)[self._key()])


class Reshape(Op):
    """The same elements in another shape (``v.reshape(...)``; one size may be -1)."""

    traits = Traits(moves_unknown=True)  # moves elements without reading them (explain's dry run)

    __props__ = ("shape",)

    def __init__(self, shape: tuple[int, ...]) -> None:
        if sum(1 for n in shape if n == -1) > 1 or any(n < -1 for n in shape):
            raise GraphBuildError(f"Reshape: invalid shape {shape}: sizes >= 0, at most one -1")
        self.shape = shape

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": f"reshape {show(self.shape)}"}

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        (shape,) = shapes
        if shape is None or None in shape:
            return [tuple(None if n == -1 else n for n in self.shape)]
        total = int(np.prod([int(n) for n in shape if n is not None], dtype=np.int64))
        known = int(np.prod([n for n in self.shape if n != -1], dtype=np.int64))
        if -1 in self.shape:
            if known == 0 or total % known:
                raise GraphBuildError(f"Reshape: cannot reshape {show(shape)} into {self.shape}")
            return [tuple(total // known if n == -1 else n for n in self.shape)]
        if known != total:
            raise GraphBuildError(f"Reshape: cannot reshape {show(shape)} ({total} elements) into {show(self.shape)}")
        return [self.shape]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        _refuse_ragged(self, ragged)
        return [False]

    def perform(self, value: Any, unknown: Any = None) -> Any:
        return scalar_or_array(_check_value(self, value).reshape(self.shape))


class Flatten(Op):
    """A ragged value's items as one flat array (what a model call batches)."""

    traits = Traits(moves_unknown=True)  # moves elements without reading them (explain's dry run)

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "flatten rows"}

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        (shape,) = shapes
        if shape is None or None not in shape:
            return [shape]
        return [shape[shape.index(None) :]]

    def perform(self, value: Any, unknown: Any = None) -> Any:
        return value.values if isinstance(value, Ragged) else value


class Regroup(Op):
    """Put flat results back into the rows of the value they came from."""

    traits = Traits(moves_unknown=True)  # moves elements without reading them (explain's dry run)

    def describe(self) -> dict[str, Any]:
        return {"kind": "op", "title": "regroup into rows"}

    def argument_name(self, position: int, ninputs: int) -> str:
        return ("values", "rows")[position]

    def infer_shapes(self, shapes: list[Shape], noutputs: int) -> list[Shape]:
        flat, rows = shapes
        if flat is None or rows is None:
            return [None]
        return [tuple(rows) + tuple(flat[1:])]

    def ragged_outputs(self, ragged: list[bool], noutputs: int) -> list[bool]:
        return [True]

    def perform(self, flat: Any, rows: Any, unknown: Any = None) -> Any:
        return rows.with_values(flat) if isinstance(rows, Ragged) else flat


def stack(values: Sequence[Any], axis: int = 0) -> Variable:
    """Stack Variables (or values) along a new ``axis``, after pairing them.

    The values pair on their leading axes like the operands of any
    elementwise op (``outlines.graph.shapes``), then a new axis of size
    ``len(values)`` is inserted at ``axis``.

    Parameters
    ----------
    values
        Variables or values (at least one).
    axis
        Where the new axis goes in the result (``-1``: last).

    Returns
    -------
    Variable

    Raises
    ------
    GraphBuildError
        For no values, or values whose shapes cannot pair.

    Examples
    --------
    >>> import outlines
    >>> a, b = outlines.constant("x"), outlines.string("b")
    >>> outlines.stack([a, b]).eval({"b": "y"}).tolist()
    ['x', 'y']
    """
    if not values:
        raise GraphBuildError("stack: needs at least one value")
    return Stack(len(values), axis)(*values)


def concatenate(values: Sequence[Any], axis: int = 0) -> Variable:
    """Join Variables (or arrays) of one rank along an existing ``axis``.

    Parameters
    ----------
    values
        Variables or arrays of one rank (at least one), whose sizes agree on
        every axis but ``axis``.
    axis
        The axis they are joined along.

    Returns
    -------
    Variable

    Raises
    ------
    GraphBuildError
        For no values, or ranks or sizes that do not agree (where known).

    Examples
    --------
    >>> import numpy as np, outlines
    >>> a = outlines.constant(np.array(["x"], dtype=object))
    >>> outlines.concatenate([a, a]).eval().tolist()
    ['x', 'x']
    """
    if not values:
        raise GraphBuildError("concatenate: needs at least one value")
    return Concatenate(axis)(*[as_variable(v, array=True) for v in values])


def expand_dims(value: Any, axis: int) -> Variable:
    """``value`` with a size-1 axis inserted at ``axis`` (``-1``: ``value[..., None]``).

    Operands pair on their LEADING axes; a size-1 axis says another pairing
    explicitly (``v[None]`` pairs ``v`` with every row of a 2-d value).

    Parameters
    ----------
    value
        A Variable or an array.
    axis
        Where the new axis goes, counted in the result's axes.

    Returns
    -------
    Variable

    Examples
    --------
    >>> import numpy as np, outlines
    >>> marks = outlines.constant(np.array(["?", "!"], dtype=object))
    >>> outlines.expand_dims(marks, 0).shape, outlines.expand_dims(marks, -1).shape
    ((1, 2), (2, 1))
    >>> words = outlines.constant(np.array(["a", "b"], dtype=object))
    >>> (outlines.expand_dims(words, -1) + outlines.expand_dims(marks, 0)).eval().tolist()
    [['a?', 'a!'], ['b?', 'b!']]
    """
    variable = as_variable(value, array=True)
    if axis >= 0:
        return variable[(slice(None),) * axis + (None, Ellipsis)]
    return variable[(Ellipsis, None) + (slice(None),) * (-axis - 1)]
