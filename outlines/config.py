"""Process-wide defaults for evaluation, settable globally or in a ``with`` block."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

__all__ = ["default_executor", "set_executor", "using_executor"]

_global_executor: Any = None
_scoped_executor: contextvars.ContextVar[Any] = contextvars.ContextVar("outlines_executor", default=None)


def default_executor() -> Any:
    """The executor evaluations use when none is passed (``None``: local).

    Returns
    -------
    Executor, distributed.Client or None
        The one set by ``using_executor`` in this context, else by
        ``set_executor``, else ``None`` (run in this process).

    Examples
    --------
    >>> default_executor() is None
    True
    """
    scoped = _scoped_executor.get()
    return scoped if scoped is not None else _global_executor


def set_executor(executor: Any) -> None:
    """Set the default executor (e.g. a ``distributed.Client``); ``None`` resets it.

    Parameters
    ----------
    executor
        An ``outlines.runtime.executor.Executor`` (``LocalExecutor``...), a
        Dask ``distributed.Client``, or ``None``. It is checked when an
        evaluation uses it.

    Examples
    --------
    >>> from outlines.runtime.executor import LocalExecutor
    >>> set_executor(LocalExecutor())
    >>> type(default_executor()).__name__
    'LocalExecutor'
    >>> set_executor(None)
    """
    global _global_executor
    _global_executor = executor


@contextlib.contextmanager
def using_executor(executor: Any) -> Iterator[Any]:
    """Use ``executor`` for every evaluation inside the ``with`` block.

    Parameters
    ----------
    executor
        As for ``set_executor``; it wins over the global default in this
        context (this thread, or this async task).

    Returns
    -------
    contextlib.AbstractContextManager
        Yields ``executor``.

    Examples
    --------
    >>> from outlines.runtime.executor import LocalExecutor
    >>> with using_executor(LocalExecutor()) as executor:
    ...     default_executor() is executor
    True
    >>> default_executor() is None
    True
    """
    token = _scoped_executor.set(executor)
    try:
        yield executor
    finally:
        _scoped_executor.reset(token)
