"""The one key normaliser: any value as canonical JSON bytes (Dask ``tokenize`` style).

``normalize`` turns a value into canonical JSON data through a per-type
registry (``normalize.register``): mappings have string keys, tuples are
lists, integral floats are integers (1.0 and 1 are one number), NumPy scalars
are Python numbers, arrays carry their shape. ``canonical`` writes that as
compact ASCII JSON with sorted keys: the bytes every key hashes. Draw keys
(``outlines.cache.keys``) hash it; generation parameters and constraints
(``outlines.backends``) compare by it; the planner (``outlines.runtime.plan``)
keys interchangeable constants by it. Python's ``hash`` is never involved, so
keys do not depend on ``PYTHONHASHSEED``, dict order, the process or the
Python version.
"""
from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

__all__ = ["canonical", "normalize"]


@functools.singledispatch
def normalize(value: Any) -> Any:
    """Canonical JSON data for ``value``: equal content gives equal data.

    Parameters
    ----------
    value
        JSON-like data (None, bool, int, float, str, mappings, lists, tuples),
        NumPy scalars and arrays, or a type registered with
        ``normalize.register(cls, function)``; the function returns
        normalized data (it calls ``normalize`` on the parts it holds).

    Returns
    -------
    Any
        None, bool, int, float, str, lists and str-keyed dicts only.

    Raises
    ------
    TypeError
        For a value of no registered type, naming it.

    Examples
    --------
    >>> normalize({"b": (1.0, 2.5), "a": None})
    {'b': [1, 2.5], 'a': None}
    """
    item = getattr(value, "item", None)  # scalars of array libraries (and 0-d arrays)
    if callable(item) and not isinstance(value, (bytes, bytearray)):
        return normalize(item())
    raise TypeError(f"keys need JSON values; got {type(value).__name__} {value!r:.60}")


@normalize.register(type(None))
@normalize.register(str)
@normalize.register(bool)
def _itself(value: Any) -> Any:
    return value


@normalize.register(int)
def _integer(value: int) -> int:
    return int(value)  # IntEnum members and other int subclasses: their number


@normalize.register(float)
def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else float(value)


@normalize.register(Mapping)
def _mapping(value: Mapping[Any, Any]) -> dict[str, Any]:
    return {str(k): normalize(v) for k, v in value.items()}


@normalize.register(list)
@normalize.register(tuple)
def _sequence(value: Sequence[Any]) -> list[Any]:
    return [normalize(v) for v in value]


@normalize.register(np.ndarray)
def _array(value: np.ndarray) -> Any:
    if value.ndim == 0:
        return normalize(value.item())
    return {"shape": list(value.shape), "items": [normalize(v) for v in value.reshape(-1).tolist()]}


def canonical(value: Any) -> bytes:
    """The canonical JSON text of ``normalize(value)``: the bytes every key hashes.

    Examples
    --------
    >>> canonical({"b": 1.0, "a": "é"})
    b'{"a":"\\\\u00e9","b":1}'
    """
    text = json.dumps(normalize(value), sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return text.encode("ascii")
