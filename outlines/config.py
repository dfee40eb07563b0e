"""Process-wide defaults for evaluation, settable globally or in a ``with`` block."""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

__all__ = ["default_executor", "set_executor", "using_executor"]

_global_executor: Any = None
_scoped_executor: contextvars.ContextVar[Any] = contextvars.ContextVar("outlines_executor", default=None)


def default_executor() -> Any:
    """The executor evaluations use when none is passed (``None``: local)."""
    scoped = _scoped_executor.get()
    return scoped if scoped is not None else _global_executor


def set_executor(executor: Any) -> None:
    """Set the default executor (e.g. a ``distributed.Client``); ``None`` resets it."""
    global _global_executor
    _global_executor = executor


@contextlib.contextmanager
def using_executor(executor: Any) -> Iterator[Any]:
    """Use ``executor`` for every evaluation inside the ``with`` block."""
    token = _scoped_executor.set(executor)
    try:
        yield executor
    finally:
        _scoped_executor.reset(token)
