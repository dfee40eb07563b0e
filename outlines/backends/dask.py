"""Run model batches and blocking Python calls as tasks on a Dask cluster.

``as_executor(client)`` turns a ``distributed.Client`` into the executor the
scheduler calls. The graph walk, batching, deduplication and cache stay on the
caller; each model batch and each chunk of blocking Python calls becomes ONE
Dask task, awaited on the caller's event loop (never blocking it), so HTTP
branches keep running locally while workers compute.

Worker side: every worker process keeps a small registry (``_WORKER``): each
local model is loaded once per process, by the first batch that needs it, and
reused by every later batch; ``worker_stats()`` reports loads, batches and
calls per backend. Driver side: batches of a local model are routed to an idle
worker that already holds it, else left to Dask (which picks the least busy).

Failures: a task whose worker dies is rerun elsewhere by Dask (at-least-once;
its draws are cached when they arrive, so a rerun is invisible). A task that
kills ``allowed-failures + 1`` workers (Dask config
``distributed.scheduler.allowed-failures``, default 3) raises
``WorkerLostError`` for its elements. Payloads are pickled here, on the caller,
with cloudpickle: an unpicklable function fails at once with a clear error.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
import weakref
from typing import Any, Callable, Sequence

from distributed.scheduler import KilledWorker

from outlines.backends.base import Backend, BatchReport
from outlines.draws import Draw

__all__ = ["DaskExecutor", "WorkerLostError", "as_executor", "runs_on_workers", "worker_stats"]

PLACEMENTS = ("local", "workers")


class WorkerLostError(RuntimeError):
    """A task was running on every Dask worker that died under it."""


def runs_on_workers(backend: Backend, http: str = "local") -> bool:
    """Whether ``backend``'s batches go to Dask workers.

    Local models (``local_compute``) and synchronous Python functions always
    do; network backends (HTTP, ``async def`` functions) only with
    ``http="workers"``: they wait rather than compute, and the caller's event
    loop waits on many of them at once for free.
    """
    if backend.local_compute:
        return True
    if getattr(backend, "kind", None) == "function" and not getattr(backend, "is_async", True):
        return True
    return http == "workers"


class DaskExecutor:
    """Send model batches and blocking Python calls to a ``distributed.Client``.

    Implements ``outlines.runtime.executor.Executor``.

    Parameters
    ----------
    client
        A ``distributed.Client``, synchronous or ``asynchronous=True``.
    http
        ``"local"`` (default): network backends run on the caller's loop;
        ``"workers"``: their batches go to workers too (their credentials
        travel with them).
    resources
        Dask resources each local-model batch needs, e.g. ``{"GPU": 1}``.
    """

    def __init__(self, client: Any, *, http: str = "local", resources: dict[str, float] | None = None) -> None:
        if http not in PLACEMENTS:
            raise ValueError(f"http must be one of {PLACEMENTS}, got {http!r}")
        self.client = client
        self.http = http
        self.resources = dict(resources) if resources else None
        #: per backend identity: worker address -> batches routed there and running;
        #: shared by every executor of this client, so placement outlives one eval
        self.homes = _homes_of(client)
        self._lock = threading.Lock()  # evals on several threads may share it

    def __repr__(self) -> str:
        return f"DaskExecutor({self.client!r}, http={self.http!r}, resources={self.resources!r})"

    def max_concurrency(self, backend: Backend) -> int | None:
        """Bound on ``backend``'s batches in flight: none for local models on workers.

        A local model takes one batch at a time per process; on a cluster each
        worker holds its own copy, so Dask's queue is the right bound.
        """
        if backend.local_compute and runs_on_workers(backend, self.http):
            return None
        return backend.max_concurrency

    def check_not_on(self, blocked_loop: Any) -> None:
        """Refuse an asynchronous client whose loop is ``blocked_loop`` (waiting for a sync eval)."""
        if getattr(self.client, "_asynchronous", False) and self.client.loop.asyncio_loop is blocked_loop:
            raise RuntimeError(
                "an asynchronous distributed.Client lives on the loop that is waiting for this "
                "sync outlines.eval(); use `await outlines.aeval(...)` (or `await program.acall(...)`) instead"
            )

    async def generate(self, backend: Backend, draws: Sequence[Draw], report: BatchReport) -> tuple[list[str], str | None]:
        """Run one batch; returns the texts and the worker's address (``None``: here).

        On a worker the batch reports into a local ``BatchReport`` whose
        results, failures, usage and request count are replayed into
        ``report`` when it returns (request times are the worker's, so only
        the count travels). A batch of a backend that sends its own requests
        holds one of ``report``'s request permits while it runs there.
        """
        if not runs_on_workers(backend, self.http):
            return await backend.generate(draws, report), None
        async with report.request_permit() if backend.sends_requests else contextlib.nullcontext():
            return await self._generate_on_worker(backend, draws, report)

    async def _generate_on_worker(
        self, backend: Backend, draws: Sequence[Draw], report: BatchReport
    ) -> tuple[list[str], str | None]:
        payload = _dumps((backend, draws), f"a batch for {backend!r}")
        spec = backend.identity
        home = self._pick_home(spec) if backend.local_compute else None
        options: dict[str, Any] = {}
        if home is not None:
            options.update(workers=[home], allow_other_workers=True)
        if backend.local_compute and self.resources:
            options["resources"] = self.resources
        ran_on: str | None = None
        try:
            outcome, ran_on = await self._run(_generate_task, payload, "outlines-generate", options)
        except KilledWorker as exc:
            raise _lost(exc, f"a batch of {len(draws)} prompt(s) for {backend!r}") from exc
        finally:
            if backend.local_compute:
                self._settle_home(spec, home, ran_on)
        texts, error, worker_report = outcome
        report.usage(*worker_report.tokens)
        report.requests += worker_report.requests
        for index, text in worker_report.results.items():
            report.result(index, text)
        for index, failure in worker_report.failures.items():
            report.failure(index, failure)
        if error is not None:
            raise error
        return texts, ran_on

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one blocking Python call (a chunk of op calls) on a worker."""
        payload = _dumps((fn, args), f"Python call {getattr(fn, '__name__', fn)!r}")
        try:
            result, _ = await self._run(_call_task, payload, "outlines-call", {})
        except KilledWorker as exc:
            raise _lost(exc, "a Python op call") from exc
        return result

    # -- routing ----------------------------------------------------------------
    def _pick_home(self, spec: Any) -> str | None:
        with self._lock:
            homes = self.homes.setdefault(spec, {})
            for worker, running in homes.items():
                if running == 0:
                    homes[worker] = 1
                    return worker
            return None  # every holder is busy: let Dask choose (maybe a new holder)

    def _settle_home(self, spec: Any, home: str | None, ran_on: str | None) -> None:
        with self._lock:
            homes = self.homes.setdefault(spec, {})
            if home is not None and home in homes:
                if ran_on is not None and ran_on != home:
                    del homes[home]  # gone or overloaded; it returns when it runs a batch again
                else:
                    homes[home] = max(0, homes[home] - 1)
            if ran_on is not None:
                homes.setdefault(ran_on, 0)

    # -- the bridge between the caller's loop and the client's ------------------------
    async def _run(self, task: Callable[[bytes], Any], payload: bytes, prefix: str, options: dict[str, Any]) -> Any:
        client = self.client
        key = f"{prefix}-{uuid.uuid4().hex}"

        async def submit_and_wait() -> Any:
            future = client.submit(task, payload, key=key, pure=False, **options)
            try:
                return await future
            finally:
                future.release()

        client_loop = client.loop.asyncio_loop
        if client_loop is asyncio.get_running_loop():
            return await submit_and_wait()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(submit_and_wait(), client_loop))


def _dumps(value: Any, what: str) -> bytes:
    import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing
        raise TypeError(
            f"cannot send {what} to Dask workers: {type(exc).__name__}: {exc}. Use module-level "
            "functions and picklable state, or run it locally (executor=None)"
        ) from exc


def _lost(exc: KilledWorker, what: str) -> WorkerLostError:
    return WorkerLostError(
        f"{what} was running on {exc.allowed_failures + 1} Dask workers that died "
        f"(last {exc.last_worker.address}); it is not retried again"
    )


def as_executor(client: Any, *, http: str = "local", resources: dict[str, float] | None = None) -> DaskExecutor:
    """Wrap a ``distributed.Client`` as the executor of evaluations.

    Parameters
    ----------
    client
        A ``distributed.Client`` (sync or ``asynchronous=True``); a
        ``DaskExecutor`` is returned as it is.
    http
        ``"local"`` (default) keeps network backends on the caller;
        ``"workers"`` sends their batches to workers as well.
    resources
        Dask resources each local-model batch needs, e.g. ``{"GPU": 1}``.

    Returns
    -------
    DaskExecutor
        Pass it (or the client itself) as ``executor=`` or to
        ``outlines.common.config.set_executor``. Which workers hold which model is
        remembered per client, across evaluations.

    Raises
    ------
    ValueError
        For an unknown ``http`` placement.

    Examples
    --------
    >>> from distributed import Client  # doctest: +SKIP
    >>> outlines.eval(answers, executor=as_executor(Client("tcp://sched:8786")))  # doctest: +SKIP
    """
    if isinstance(client, DaskExecutor):
        return client
    return DaskExecutor(client, http=http, resources=resources)


_homes: weakref.WeakKeyDictionary[Any, dict[Any, dict[str, int]]] = weakref.WeakKeyDictionary()
_homes_lock = threading.Lock()


def _homes_of(client: Any) -> dict[Any, dict[str, int]]:
    with _homes_lock:
        try:
            return _homes.setdefault(client, {})
        except TypeError:  # not weak-referenceable: placement lasts one executor
            return {}


# -- worker side -------------------------------------------------------------------
class _WorkerState:
    """What one worker process holds: loaded models and counters, per backend identity."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # counters only: held for microseconds
        self.stats: dict[str, dict[str, int]] = {}
        self.loading: dict[str, threading.Lock] = {}  # one per model: a load holds only its own

    def entry(self, spec: Any) -> dict[str, int]:
        return self.stats.setdefault(repr(spec), {"loads": 0, "batches": 0, "calls": 0})

    def prepare(self, backend: Backend) -> None:
        """Load a local model the first time this process sees it."""
        with self.lock:
            entry = self.entry(backend.identity)
            entry["batches"] += 1
            loading = self.loading.setdefault(repr(backend.identity), threading.Lock())
        load = getattr(backend, "load", None)
        if not (backend.local_compute and callable(load)):
            return
        with loading:
            if entry["loads"] == 0:
                load()  # raises: the next batch tries again
                with self.lock:
                    entry["loads"] += 1


_WORKER = _WorkerState()


def worker_stats() -> dict[str, dict[str, int]]:
    """This process's counters: ``repr(backend identity) -> {loads, batches, calls}``.

    Run it on every worker with ``client.run(worker_stats)``.
    """
    with _WORKER.lock:
        return {spec: dict(entry) for spec, entry in _WORKER.stats.items()}


def _worker_address() -> str | None:
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:  # not inside a worker (a local test run)
        return None


def _generate_task(payload: bytes) -> tuple[tuple[list[str] | None, BaseException | None, BatchReport], str | None]:
    """Run one batch on a worker: (texts or the error, what it reported), the worker's address."""
    import pickle

    backend, draws = pickle.loads(payload)
    _WORKER.prepare(backend)
    report = BatchReport()
    texts: list[str] | None = None
    error: BaseException | None = None
    try:
        texts = asyncio.run(_generate_then_close(backend, draws, report))
    except Exception as exc:  # noqa: BLE001 - sent back with what the batch reported before it
        error = exc
    return (texts, error, report), _worker_address()


async def _generate_then_close(backend: Backend, draws: Sequence[Draw], report: BatchReport) -> list[str]:
    try:
        return await backend.generate(draws, report)
    finally:
        await backend.aclose()  # sessions belong to this task's loop


def _call_task(payload: bytes) -> tuple[Any, str | None]:
    import pickle

    fn, args = pickle.loads(payload)
    with _WORKER.lock:
        _WORKER.entry(("python", getattr(fn, "__name__", "call")))["calls"] += 1
    return fn(*args), _worker_address()
