"""Process-wide state and defaults for evaluation, settable globally or in a ``with`` block.

The state a process keeps between evaluations lives on ONE object, the
``ProcessState`` (``process_state()``), and nowhere else:

- ``timings``: what each Python step (an ``outlines.fn``) has taken per call,
  learned as evaluations run (``StepTimings``); the scheduler runs a step
  known to be fast on the event loop, others in the thread pool;
- ``plans``: the plans of control-flow bodies, built once per op (``PlanCache``);
- ``executor``: the default executor (``set_executor``);
- the default cache: ``cache_enabled``, ``cache_path`` and the ``Cache`` of
  each path opened (``caches``), set by ``outlines.cache.enable``/``disable``;
- server quirks: those noted or read in this process (``quirks_known``,
  ``quirks_accepted``) and ``quirk_store``, where they outlive the process
  (``outlines.backends.quirks``, ``use_store``);
- ``tuning``: the process-wide ``Tuning`` values;
- ``warned``: the warnings given once per process (a key each).

``Evaluation.open`` (``outlines.runtime.session``) reads it once and hands it
down; a ``with using_executor(...)`` or ``with tuning(...)`` block overrides
the executor or tuning values in its context (this thread, or this async
task), never another's. ``using_process_state`` runs a block with a state of
its own (a fresh one: as a new process starts).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import threading
import weakref
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterator

__all__ = [
    "PlanCache", "ProcessState", "StepTimings", "Tuning", "current_tuning", "default_executor", "process_state",
    "set_executor", "set_tuning", "tuning", "using_executor", "using_process_state",
]


@dataclass(frozen=True)
class Tuning:
    """Tuning values: thresholds and periods with a default that fits most runs.

    Attributes
    ----------
    stack_min
        The fewest sibling uses of an op that the plan stacks into one node.
    peek_min
        A model call with at least this many draws asks the cache's memory for
        them before it joins its queue; a smaller one is looked up at the flush.
    render_chunk
        Elements concatenated per pass of a bulk prompt render.
    thread_patience
        The longest (seconds) a background chunk (the cache writer) waits for
        the event loops' bursts to end.
    thread_idle_seconds
        An idle worker of a ``DaemonPool`` ends after this many seconds.
    progress_refresh
        Seconds between redraws of the progress line (terminal, Jupyter).
    progress_log_every
        Seconds between progress lines in a log or pipe.
    progress_auto_delay
        Seconds an evaluation runs (``progress=None``) before its progress shows.

    ``thread_patience`` and ``thread_idle_seconds`` are read by background
    threads, which see the process-wide values (``set_tuning``), not a
    ``with tuning(...)`` block's.
    """

    stack_min: int = 128
    peek_min: int = 64
    render_chunk: int = 8192
    thread_patience: float = 0.05
    thread_idle_seconds: float = 60.0
    progress_refresh: float = 0.5
    progress_log_every: float = 30.0
    progress_auto_delay: float = 2.0

    def with_changes(self, **changes: Any) -> Tuning:
        """These values with ``changes`` applied, checked.

        Raises
        ------
        TypeError
            For an unknown name (naming the closest one) or a value that is not a number.
        ValueError
            For a count below 1 or a negative number of seconds.

        Examples
        --------
        >>> Tuning().with_changes(stack_min=2).stack_min
        2
        >>> Tuning().with_changes(stack_mim=2)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: unknown tuning value 'stack_mim'; did you mean stack_min? (valid: ...)
        """
        kinds = {f.name: f.type for f in fields(self)}
        for name, value in changes.items():
            if name not in kinds:
                close = difflib.get_close_matches(name, list(kinds), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise TypeError(f"unknown tuning value {name!r}{hint} (valid: {', '.join(kinds)})")
            counted = kinds[name] == "int"
            if isinstance(value, bool) or not isinstance(value, int if counted else (int, float)):
                raise TypeError(f"tuning value {name} must be {'an int' if counted else 'a number'}, got {value!r}")
            if value < (1 if counted else 0):
                raise ValueError(f"tuning value {name} must be {'at least 1' if counted else '>= 0'}, got {value!r}")
        return dataclasses.replace(self, **changes) if changes else self


class StepTimings:
    """Mean seconds per call of each Python step, learned as evaluations run.

    Keyed by the step (an ``outlines.fn``), weakly: a step that is gone
    takes its timing with it. A new measurement counts for a fifth of the mean.
    """

    def __init__(self) -> None:
        # Keyed by id(step), each entry dropped when its step is collected (before the id can be reused):
        # read at every call of a step, and a dict of ints is ten times faster than a WeakKeyDictionary.
        self._means: dict[int, float] = {}

    def mean(self, step: Any) -> float | None:
        """The mean seconds per call of ``step`` (``None``: never measured)."""
        return self._means.get(id(step))

    def record(self, step: Any, seconds: float) -> None:
        """Fold one measured call duration of ``step`` into its mean."""
        key = id(step)
        previous = self._means.get(key)
        if previous is None:
            weakref.finalize(step, self._means.pop, key, None)
            self._means[key] = seconds
        else:
            self._means[key] = 0.8 * previous + 0.2 * seconds


class PlanCache:
    """Plans of sub-graphs (control-flow bodies), built once per op and key; weakly keyed by the op."""

    def __init__(self) -> None:
        self._plans: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, op: Any, key: Any, build: Callable[[], Any]) -> Any:
        """The plan of ``op`` under ``key``, built by ``build()`` the first time."""
        with self._lock:
            plans = self._plans.setdefault(op, {})
            found = plans.get(key)
        if found is None:
            found = build()
            with self._lock:
                found = plans.setdefault(key, found)
        return found


class ProcessState:
    """The state a process keeps between evaluations; see the module docstring.

    Parameters
    ----------
    quirk_store
        Where server quirks outlive the process (``None``: in memory only).

    Examples
    --------
    >>> state = ProcessState()
    >>> state.tuning.stack_min, state.executor, state.cache_enabled
    (128, None, None)
    """

    def __init__(self, quirk_store: Any = None) -> None:
        self.timings = StepTimings()
        self.plans = PlanCache()
        self.tuning = Tuning()
        self.executor: Any = None
        self.cache_enabled: bool | None = None  # None: follow OUTLINES_CACHE
        self.cache_path: str | None = None  # None: OUTLINES_CACHE_DIR, else ~/.cache/outlines
        self.caches: dict[str, Any] = {}  # location -> the Cache opened there
        self.cache_lock = threading.Lock()
        self.quirk_store = quirk_store
        self.quirks_known: dict[str, set[str]] = {}  # base URL (or scope) -> quirks, each looked up once
        self.quirks_accepted: set[tuple[str, str]] = set()  # (scope, field): a probe found the field taken
        self.warned: set[str] = set()  # warnings given once per process, by key

    def fresh(self) -> ProcessState:
        """A state as a new process starts with: nothing learned or set, the same quirk store."""
        return ProcessState(quirk_store=self.quirk_store)


_process = ProcessState()
_scoped_executor: contextvars.ContextVar[Any] = contextvars.ContextVar("outlines_executor", default=None)
_scoped_tuning: contextvars.ContextVar[Tuning | None] = contextvars.ContextVar("outlines_tuning", default=None)


def process_state() -> ProcessState:
    """The state of this process (the one ``using_process_state`` put in force, if any).

    Returns
    -------
    ProcessState
        The one object holding what the process keeps between evaluations.

    Examples
    --------
    >>> process_state() is process_state()
    True
    """
    return _process


@contextlib.contextmanager
def using_process_state(state: ProcessState | None = None) -> Iterator[ProcessState]:
    """Run the block with ``state`` as the process's (``None``: a fresh one), then put the old one back.

    Process-wide, not per context: every thread sees it meanwhile. For a run
    that must not learn from or teach earlier ones (a cold benchmark, a test).

    Parameters
    ----------
    state
        The state to use; ``None``: a fresh one (``ProcessState.fresh``:
        nothing learned or set, the same quirk store).

    Returns
    -------
    contextlib.AbstractContextManager
        Yields the state in force inside the block.

    Examples
    --------
    >>> with using_process_state() as state:
    ...     process_state() is state
    True
    """
    global _process
    previous = _process
    _process = previous.fresh() if state is None else state
    try:
        yield _process
    finally:
        _process = previous


def default_executor(state: ProcessState | None = None) -> Any:
    """The executor evaluations use when none is passed (``None``: local).

    Parameters
    ----------
    state
        The process state to read (default: ``process_state()``).

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
    return scoped if scoped is not None else (state or _process).executor


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
    _process.executor = executor


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


def current_tuning(state: ProcessState | None = None) -> Tuning:
    """The tuning values in force here: a ``with tuning(...)`` block's, else the process's.

    Parameters
    ----------
    state
        The process state to read (default: ``process_state()``).

    Returns
    -------
    Tuning
        The values in force.

    Examples
    --------
    >>> current_tuning().peek_min
    64
    """
    scoped = _scoped_tuning.get()
    return scoped if scoped is not None else (state or _process).tuning


def set_tuning(values: Tuning | None = None, /, **changes: Any) -> Tuning:
    """Set tuning values for the whole process; returns the values it replaced.

    Parameters
    ----------
    values
        A whole ``Tuning`` to start from (default: the process's own), e.g.
        what an earlier call returned, to put it back.
    **changes
        Values by name (the attributes of ``Tuning``).

    Returns
    -------
    Tuning
        The process's values before this call.

    Raises
    ------
    TypeError, ValueError
        As ``Tuning.with_changes``: unknown names are refused, naming the closest one.

    Examples
    --------
    >>> previous = set_tuning(progress_log_every=5.0)
    >>> current_tuning().progress_log_every
    5.0
    >>> _ = set_tuning(previous)
    >>> current_tuning().progress_log_every
    30.0
    """
    state = _process
    previous = state.tuning
    state.tuning = (values if values is not None else previous).with_changes(**changes)
    return previous


@contextlib.contextmanager
def tuning(**changes: Any) -> Iterator[Tuning]:
    """Use these tuning values inside the ``with`` block, in this context (this thread, or this async task).

    The block starts from the values in force where it opens. Background
    threads (``thread_patience``, ``thread_idle_seconds``) read the
    process-wide values: set those with ``set_tuning``.

    Parameters
    ----------
    **changes
        Values by name (the attributes of ``Tuning``).

    Returns
    -------
    contextlib.AbstractContextManager
        Yields the ``Tuning`` in force inside.

    Raises
    ------
    TypeError, ValueError
        As ``Tuning.with_changes``: unknown names are refused, naming the closest one.

    Examples
    --------
    >>> with tuning(stack_min=2) as values:
    ...     values.stack_min, current_tuning().stack_min
    (2, 2)
    >>> current_tuning().stack_min
    128
    """
    values = current_tuning().with_changes(**changes)
    token = _scoped_tuning.set(values)
    try:
        yield values
    finally:
        _scoped_tuning.reset(token)
