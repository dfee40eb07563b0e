"""``Ragged``: rows of different lengths, stored flat so one model call sees all of them.

A function with a gufunc output core dimension (``signature="()->(n)"``)
returns a list per element; when the lists differ in length (each document
splits into its own number of paragraphs) the value is a ``Ragged`` of shape
``outer + (?,)``: ``values`` holds every item of every row in one flat array
(plus any trailing axes, such as a sample axis) and ``lengths`` the row sizes.
Elementwise ops and model calls work on ``values`` at once (one batch); a
gufunc with a core input dimension (``"(n)->()"``) gets one row at a time.
"""
from __future__ import annotations

from typing import Any, Iterator, Sequence

import numpy as np

__all__ = ["Ragged"]


class Ragged:
    """Rows of different lengths over an outer shape.

    Parameters
    ----------
    values
        Object array of shape ``(total,) + inner``: the rows, concatenated.
    lengths
        Integer array of the outer shape: each row's length.

    Examples
    --------
    >>> r = Ragged.from_rows([["a", "b"], ["c"]])
    >>> r.shape, r.tolist()
    ((2, None), [['a', 'b'], ['c']])
    """

    __slots__ = ("values", "lengths")

    def __init__(self, values: np.ndarray, lengths: np.ndarray) -> None:
        lengths = np.asarray(lengths, dtype=np.int64)
        if values.ndim < 1 or values.shape[0] != int(lengths.sum()):
            raise ValueError(f"Ragged: {values.shape[0] if values.ndim else 0} values for rows of total length {int(lengths.sum())}")
        self.values = values
        self.lengths = lengths

    @classmethod
    def from_rows(cls, rows: Sequence[Any], outer: tuple[int, ...] | None = None) -> Ragged:
        """Build from a flat sequence of rows (lists or arrays), in row-major order.

        Parameters
        ----------
        rows
            One list (or array) per row; rows may differ in length.
        outer
            The outer shape the rows fill (default: one axis of ``len(rows)``).

        Returns
        -------
        Ragged

        Examples
        --------
        >>> Ragged.from_rows([["a"], ["b", "c"], [], ["d"]], outer=(2, 2)).shape
        (2, 2, None)
        """
        outer = (len(rows),) if outer is None else outer
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows)).reshape(outer)
        parts = [np.asarray(_object_row(r)) for r in rows]
        inner = next((p.shape[1:] for p in parts if len(p)), ())
        values = np.concatenate(parts) if any(len(p) for p in parts) else np.empty((0, *inner), dtype=object)
        return cls(values.astype(object, copy=False), lengths)

    @property
    def outer(self) -> tuple[int, ...]:
        return tuple(self.lengths.shape)

    @property
    def inner(self) -> tuple[int, ...]:
        return tuple(self.values.shape[1:])

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The outer shape, ``None`` for the ragged axis, then the inner axes."""
        return (*self.outer, None, *self.inner)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def with_values(self, values: np.ndarray) -> Ragged:
        """The same rows holding other values (the result of an elementwise op)."""
        return Ragged(values, self.lengths)

    def rows(self) -> list[np.ndarray]:
        """Each row's values, in row-major order of the outer shape.

        Returns
        -------
        list of numpy.ndarray

        Examples
        --------
        >>> [row.tolist() for row in Ragged.from_rows([["a", "b"], ["c"]]).rows()]
        [['a', 'b'], ['c']]
        """
        ends = np.cumsum(self.lengths.reshape(-1))
        starts = ends - self.lengths.reshape(-1)
        return [self.values[a:b] for a, b in zip(starts, ends)]

    def repeat(self, array: np.ndarray) -> np.ndarray:
        """An outer-shaped array repeated along each row: one item per value."""
        return np.repeat(array.reshape(-1, *array.shape[self.lengths.ndim:]), self.lengths.reshape(-1), axis=0)

    def tolist(self) -> list[Any]:
        """Nested Python lists, one per row.

        Returns
        -------
        list
            Lists nested like the outer shape, each row a list of its items.

        Examples
        --------
        >>> Ragged.from_rows([["a", "b"], ["c"]]).tolist()
        [['a', 'b'], ['c']]
        """
        rows: list[list[Any]] = [row.tolist() for row in self.rows()]
        if not self.outer:
            return rows[0]
        out = np.empty(len(rows), dtype=object)
        for i, row in enumerate(rows):
            out[i] = row
        nested: list[Any] = out.reshape(self.outer).tolist()
        return nested

    def __len__(self) -> int:
        if not self.outer:
            return int(self.lengths)
        return self.outer[0]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Ragged)
            and np.array_equal(self.lengths, other.lengths)
            and self.values.shape == other.values.shape
            and bool(np.all(self.values == other.values))
        )

    # defining __eq__ without __hash__ leaves a Ragged unhashable (Python sets __hash__ to None)

    def __repr__(self) -> str:
        return f"Ragged({self.tolist()!r})"


def _object_row(row: Any) -> np.ndarray:
    if isinstance(row, np.ndarray):
        return row.astype(object, copy=False)
    out = np.empty(len(row), dtype=object)
    out[:] = list(row)
    return out
