"""Where model batches and blocking Python calls run: the ``Executor`` protocol.

The scheduler decides *what* runs and *when*; an executor decides *where*.
``LocalExecutor`` runs everything in this process; ``outlines.backends.dask``
implements the same protocol on a Dask cluster.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from outlines.backends.base import Backend, BatchReport
from outlines.draws import Draw
from outlines.common.threads import run_blocking

__all__ = ["Executor", "LocalExecutor", "resolve_executor"]


@runtime_checkable
class Executor(Protocol):
    """Runs one batch or one blocking call for the scheduler, awaited on its loop."""

    async def generate(self, backend: Backend, draws: Sequence[Draw], report: BatchReport) -> tuple[list[str], str | None]:
        """One completion per draw, and where the batch ran (``None``: in this process)."""

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, a blocking call, run off the event loop."""

    def max_concurrency(self, backend: Backend) -> int | None:
        """Bound on ``backend``'s batches in flight (``None``: unbounded)."""


class LocalExecutor:
    """Runs batches on this event loop and blocking calls in the shared thread pool."""

    async def generate(self, backend: Backend, draws: Sequence[Draw], report: BatchReport) -> tuple[list[str], str | None]:
        return await backend.generate(draws, report), None

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await run_blocking(fn, *args)

    def max_concurrency(self, backend: Backend) -> int | None:
        return backend.max_concurrency


def resolve_executor(executor: Any, default: Any = None) -> Executor:
    """The executor for ``eval(executor=...)``: an ``Executor``, a ``distributed.Client`` or ``None``.

    ``None`` means ``default`` (what ``outlines.common.config.default_executor``
    gives, read by ``Evaluation.open``), and local when that is ``None`` too.

    Raises
    ------
    TypeError
        For anything else, naming what was given.
    """
    if executor is None:
        executor = default
        if executor is None:
            return LocalExecutor()
    if isinstance(executor, Executor):
        return executor
    try:
        from distributed import Client
    except ImportError:
        Client = None  # noqa: N806
    if Client is not None and isinstance(executor, Client):
        from outlines.backends import dask

        return dask.as_executor(executor)
    raise TypeError(
        f"executor must be an outlines Executor (generate, call, max_concurrency) or a "
        f"distributed.Client, got {type(executor).__name__} {executor!r:.60}"
    )
