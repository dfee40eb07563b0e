"""One evaluation's state, named once and handed down: ``Options`` and the ``Evaluation``.

An entry point (``eval``, ``aeval``, a ``Program`` call, ``as_completed``,
``Program.stream``, ``explain``) checks its options once (``Options.check``:
a ``Program`` at construction) and builds one ``Evaluation`` per run
(``Evaluation.open``). Every schedule of that run reads its state from it,
never from another schedule:

- ``options``: the checked options (``errors``, ``batch_window``, ``progress``,
  ``jobs``: provider batch jobs...);
- ``cache``: the resolved ``Cache`` (``None``: off);
- ``executor``: where batches and blocking Python calls run;
- ``request_limit``: the bound on wire requests in flight (``max_concurrency``;
  a backend that sends no requests of its own takes one permit per batch), and
  ``backend_limits``: each backend's own bound on its batches in flight;
- ``budget``: the ``BudgetGuard`` that admits every batch (``None``: no budget);
- ``recorder``: the one recorder, composed from the listeners when the
  evaluation is built (``outlines.runtime.events.compose``); ``listening``
  says whether anyone listens, so per-batch details are computed only then;
- ``backends``: the backends its batches used, closed once, at its end;
- ``draw_base``: its draw namespace (below), and the batch-id counter its
  schedules share (``batch_id``);
- ``state``: the process's state (``outlines.common.config.ProcessState``: learned
  step timings, control bodies' plans), and ``tuning``: the tuning values
  in force where it opened (``outlines.common.config.current_tuning``). Nothing
  below reads process-wide state but through these two.

``Evaluation.running(plan)`` wraps the whole run: one ``eval_started``, one
``eval_finished``, the backends closed in between. A loop iteration (or a
cond's branches) is a schedule of its own on ``evaluation.child(tag)``: the
same state, in the draw namespace of that iteration. The chunks of a
``Program.stream`` are schedules on the evaluation itself (nothing differs).

Draw namespaces: a random model call's draw numbers are
``plan.draw_offsets[node] + (draw_base << DRAW_SHIFT)``. ``child(tag)`` sets
``draw_base`` to ``(draw_base << TAG_BITS) + tag + 1``, so each iteration of a
loop (and of a loop nested in it) draws anew, outer draws stay below
``1 << DRAW_SHIFT``, and the numbers fit a 64-bit seed. The control nodes
of one plan take consecutive tags (``Plan.tag_offsets``: a loop takes
``max_iter + 1``), so two loops making the same calls draw apart; their
tags together should stay below ``1 << TAG_BITS``. A stacked loop runs the
elements of many loops at once, each in its own namespace: ``child`` of an
array of tags (one per element of the schedule's leading axis) makes
``draw_base`` an array of Python ints, one namespace per element, and the
batcher numbers each element's draws in its own (``Batcher.start``).
"""
from __future__ import annotations

import asyncio
import contextlib
import difflib
import itertools
import sys
import time
import warnings
from dataclasses import dataclass, field, fields, replace
from types import FrameType
from typing import Any, AsyncIterator, Iterator, Mapping

import numpy as np

from outlines import cache as cache_module
from outlines.backends.base import Backend
from outlines.common.config import ProcessState, Tuning, current_tuning, default_executor, process_state
from outlines.runtime.budget import Budget, BudgetGuard, resolve_budget
from outlines.runtime.events import NULL, Recorder, compose
from outlines.runtime.executor import Executor, resolve_executor
from outlines.runtime.jobs import Jobs
from outlines.runtime.tracing import active_recorder

__all__ = ["DRAW_SHIFT", "Evaluation", "Options", "TAG_BITS"]

#: Bits of a draw number below a control node's namespace (see the module docstring).
DRAW_SHIFT = 20
#: Bits of one level of namespace: the iteration number (plus one).
TAG_BITS = 16


@dataclass(frozen=True)
class Options:
    """The options of ``eval``/``aeval``/Program calls, checked once; see ``outlines.eval``."""

    cache: Any = True
    max_concurrency: int | None = None
    errors: str = "raise"
    progress: bool | None = None
    executor: Any = None
    batch_window: float = 0.005
    budget: Budget | None = None
    jobs: Any = False

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> Options:
        """The options given by name, checked.

        ``batch=`` is the deprecated name of ``jobs=`` (kept for one release):
        it warns and means the same.

        Raises
        ------
        TypeError
            For an unknown option (naming the closest valid one), ``jobs=``
            and ``batch=`` given together, or a ``budget`` that is not a
            ``Budget``.
        ValueError
            For ``max_concurrency`` that is not a positive integer, or
            ``errors`` other than ``"raise"``/``"return"``.
        """
        options = _renamed(options)
        names = sorted(f.name for f in fields(cls))
        for name in options:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                raise TypeError(f"unknown evaluation option {name!r}{hint} (valid: {', '.join(names)})")
        bound = options.get("max_concurrency")
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 1):
            raise ValueError(f"max_concurrency must be a positive integer (requests in flight) or None, got {bound!r}")
        errors = options.get("errors", "raise")
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
        resolve_budget(options.get("budget"))
        Jobs.of(options.get("jobs"))
        return cls(**options)

    def with_changes(self, **changes: Any) -> Options:
        """These options with ``changes`` applied (checked)."""
        return Options.check({**{f.name: getattr(self, f.name) for f in fields(self)}, **_renamed(changes)})


def _renamed(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``options`` with the deprecated ``batch=`` as ``jobs=``, warning where the caller gave it."""
    if "batch" not in options:
        return options
    if "jobs" in options:
        raise TypeError("give jobs= or batch= (its deprecated alias), not both")
    warnings.warn("the evaluation option batch= is deprecated and goes in the next release: use jobs= "
                  "(the same values: True or outlines.Jobs(...))", DeprecationWarning, stacklevel=_callers_level())
    renamed = {name: value for name, value in options.items() if name != "batch"}
    renamed["jobs"] = options["batch"]
    return renamed


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside the package: the user's line that gave the option."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] == "outlines":
        frame = frame.f_back
        level += 1
    return level


@dataclass(eq=False)
class Evaluation:
    """The state of one evaluation; see the module docstring. Build it with ``open``."""

    options: Options
    cache: Any
    executor: Executor
    state: ProcessState
    tuning: Tuning
    recorder: Recorder = NULL
    request_limit: asyncio.Semaphore | None = None
    budget: BudgetGuard | None = None
    backend_limits: dict[Backend, asyncio.Semaphore | None] = field(default_factory=dict)
    backends: dict[Backend, None] = field(default_factory=dict)  # in first-use order
    draw_base: int | np.ndarray = 0  # an object array of Python ints: a namespace per element
    batch_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @classmethod
    def open(
        cls, options: Options, *listeners: Recorder | None, blocked_loop: asyncio.AbstractEventLoop | None = None,
        state: ProcessState | None = None,
    ) -> Evaluation:
        """The evaluation of ``options``, reporting to the active trace and ``listeners``.

        ``blocked_loop`` is the caller's loop that a sync entry point is
        blocking (``outlines.runtime.evaluate.run_sync``): an executor must not
        need it. ``state``: the process state it reads its defaults (executor,
        cache, tuning) from and learns into (default: ``process_state()``).
        """
        state = state if state is not None else process_state()
        executor = resolve_executor(options.executor, default_executor(state))
        if blocked_loop is not None and "outlines.backends.dask" in sys.modules:
            from outlines.backends.dask import DaskExecutor

            if isinstance(executor, DaskExecutor):
                executor.check_not_on(blocked_loop)
        bound = options.max_concurrency
        return cls(
            options,
            cache_module.resolve(options.cache, state),
            executor,
            state,
            current_tuning(state),
            recorder=compose(active_recorder(), *listeners),
            request_limit=asyncio.Semaphore(bound) if bound else None,
            budget=BudgetGuard(options.budget) if options.budget is not None else None,
        )

    def child(self, tag: int | np.ndarray) -> Evaluation:
        """The same evaluation in the draw namespace of iteration ``tag`` (see the module docstring).

        ``tag`` may be an array: one tag per element of the schedule's leading
        axis, each element in a namespace of its own (as may ``draw_base``).

        Raises
        ------
        ValueError
            When an array tag and an array namespace differ in length.
        """
        base = self.draw_base
        if type(base) is int and not isinstance(tag, np.ndarray):
            return replace(self, draw_base=(base << TAG_BITS) + tag + 1)
        tags = tag.tolist() if isinstance(tag, np.ndarray) else None  # Python ints: numbers outgrow 64 bits
        bases = base.tolist() if isinstance(base, np.ndarray) else None
        if tags is not None and bases is not None and len(tags) != len(bases):
            raise ValueError(f"{len(tags)} namespace tags for {len(bases)} elements")
        size = len(tags) if tags is not None else len(bases or ())  # one of the two is an array (else returned above)
        per_element = np.empty(size, dtype=object)
        per_element[:] = [((base if bases is None else bases[e]) << TAG_BITS) + (tag if tags is None else tags[e]) + 1
                          for e in range(size)]
        return replace(self, draw_base=per_element)

    @property
    def return_failures(self) -> bool:
        """``errors="return"``: failed elements hold ``outlines.Failure``."""
        return self.options.errors == "return"

    @property
    def jobs(self) -> Jobs | None:
        """``jobs=...``: how draws go as provider batch jobs (``None``: live)."""
        return Jobs.of(self.options.jobs)

    @property
    def listening(self) -> bool:
        """Whether anyone listens to the events (else per-batch details are not computed)."""
        return self.recorder is not NULL

    @property
    def draw_shift(self) -> int | np.ndarray:
        """What this namespace adds to a random model call's draw numbers (per element: an array)."""
        return self.draw_base << DRAW_SHIFT

    def batch_id(self) -> int:
        """A new batch id (one numbering for all the evaluation's schedules)."""
        return next(self.batch_ids)

    def limit_for(self, backend: Backend) -> asyncio.Semaphore | None:
        """``backend``'s bound on its batches in flight (the executor's), made on first use."""
        limits = self.backend_limits
        if backend not in limits:
            bound = self.executor.max_concurrency(backend)
            limits[backend] = asyncio.Semaphore(bound) if bound else None
        return limits[backend]

    def uses(self, backend: Backend) -> None:
        """Note that a batch will go to ``backend`` (closed at the end)."""
        self.backends[backend] = None

    @contextlib.asynccontextmanager
    async def running(self, plan: Any) -> AsyncIterator[Evaluation]:
        """The whole run: ``eval_started``, then the block, its backends closed, ``eval_finished``."""
        self.recorder.eval_started(plan, time.perf_counter())
        error: BaseException | None = None
        try:
            yield self
        except GeneratorExit:  # a stream left early: no error of the evaluation
            raise
        except BaseException as exc:
            error = exc
            raise
        finally:
            try:
                for backend in sorted(self.backends, key=repr):
                    await backend.aclose()
            finally:
                self.recorder.eval_finished(time.perf_counter(), error)
