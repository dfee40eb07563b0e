"""``outlines.eval`` and ``outlines.aeval``: plan a graph and run its schedule.

Evaluation is asynchronous inside. The sync ``eval`` runs the schedule with
``asyncio.run`` in a plain script, and on a private event loop in a helper
thread when the caller's thread already runs a loop (Jupyter, or sync code inside
``asyncio.run``), with no patching of the caller's loop; Ctrl-C while it waits
cancels the schedule at once (what finished stays cached) and raises
``KeyboardInterrupt``. Each call checks its options once (``session.Options``)
and runs as ONE ``Evaluation`` (``run_plan``), whose recorder is composed
from the active trace and the progress counter. The tuning values in force
where it is called (``outlines.common.config.tuning``) apply: ``stack_min`` to its
plan, the rest through the evaluation.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import signal
import threading
from typing import Any, Callable, Coroutine, Iterator, Mapping, TypeVar, overload

from outlines.common.threads import FOREGROUND, watched_loop
from outlines.graph.basic import Variable
from outlines.runtime.plan import Plan, bind_givens, check_shapes
from outlines.runtime.progress import Counter, shown
from outlines.runtime.scheduler import Scheduler, quiet_collector
from outlines.runtime.session import Evaluation, Options
from outlines.runtime.termination import terminating_gracefully

__all__ = ["aeval", "eval", "interrupt_raises", "run_plan", "run_sync", "run_watched"]

T = TypeVar("T")

async def run_plan(
    plan: Plan,
    givens: Mapping[Any, Any] | None,
    options: Options,
    blocked_loop: asyncio.AbstractEventLoop | None = None,
    *,
    check: bool = True,
) -> list[Any]:
    """Evaluate ``plan`` on the running loop as one ``Evaluation``; returns the output values in order.

    ``blocked_loop`` is the caller's loop that a sync ``eval`` is blocking
    (see ``run_sync``): an executor must not need it. ``check``: propagate
    the givens' shapes through the plan first (``check_shapes``), so a
    pairing that cannot work raises ``GraphBuildError`` before any draw is
    sent; a ``Program`` checked them already.
    """
    values = bind_givens(plan, givens)
    if check:
        check_shapes(plan, values)  # before anything is sent
    counter = Counter() if options.progress is not False else None  # shown after a delay when None
    evaluation = Evaluation.open(options, counter, blocked_loop=blocked_loop)
    async with evaluation.running(plan):
        scheduler = Scheduler(plan, values, evaluation)
        async with shown(counter, scheduler, options.progress, evaluation.tuning):
            return await scheduler.run()


@contextlib.contextmanager
def interrupt_raises() -> Iterator[None]:
    """Make Ctrl-C raise ``KeyboardInterrupt`` in this (main) thread while it waits.

    ``asyncio.run`` installs a SIGINT handler that only cancels its main task,
    which cannot run while that task is blocked in this sync call: the
    interrupt would wait for the whole evaluation. ``SIG_IGN``/``SIG_DFL`` stay.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or previous is signal.default_int_handler:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_sync(factory: Callable[[asyncio.AbstractEventLoop | None], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from sync code, even inside a running loop.

    ``factory`` receives the caller's loop that this call blocks (``None``
    when the caller runs no loop). SIGTERM meanwhile stops it like Ctrl-C and
    ends the process once the cache has stored what finished
    (``outlines.runtime.termination``).
    """
    with terminating_gracefully() as termination:
        return _run_sync(termination.watching(factory))


def _run_sync(factory: Callable[[asyncio.AbstractEventLoop | None], Coroutine[Any, Any, T]]) -> T:
    try:
        caller_loop = asyncio.get_running_loop()
    except RuntimeError:
        return run_watched(factory(None))
    outcome: dict[str, Any] = {}
    started = threading.Event()
    context = contextvars.copy_context()

    async def main() -> T:
        outcome["loop"], outcome["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await factory(caller_loop)

    def target() -> None:
        try:
            outcome["value"] = context.run(run_watched, main())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=target, name="outlines-eval", daemon=True)
    thread.start()
    try:
        with interrupt_raises():
            thread.join()
    except KeyboardInterrupt:
        # Ctrl-C in the caller (a notebook): cancel the schedule so it stops
        # dispatching and cleans up, then re-raise.
        started.wait()
        if "task" in outcome:
            with contextlib.suppress(RuntimeError):  # the loop may have just closed: nothing to cancel
                outcome["loop"].call_soon_threadsafe(outcome["task"].cancel)
        thread.join()
        raise
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


def run_watched(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a loop that tells the cache writer when it is busy (``outlines.common.threads.watched_loop``)."""
    with FOREGROUND, asyncio.Runner(loop_factory=watched_loop) as runner:
        return runner.run(coroutine)


@overload
async def aeval(variable: Variable, /, *, givens: Mapping[Any, Any] | None = None, **options: Any) -> Any: ...
@overload
async def aeval(
    first: Variable, second: Variable, /, *more: Variable, givens: Mapping[Any, Any] | None = None, **options: Any
) -> tuple[Any, ...]: ...
async def aeval(*variables: Variable, givens: Mapping[Any, Any] | None = None, **options: Any) -> Any:
    """Evaluate Variables on the running event loop, in ONE schedule; see ``eval``.

    One Variable gives its bare value; several give a tuple of values, in order.

    Parameters
    ----------
    *variables
        The Variables to compute.
    givens
        Values of the free inputs, keyed by Variable or by name.
    **options
        The options of ``eval``.

    Returns
    -------
    Any or tuple
        The bare value for one Variable; a tuple of values, in order, for several.

    Raises
    ------
    UnboundInputError, GraphBuildError, NodeError, BudgetExceeded
        As ``eval``.

    Examples
    --------
    >>> import asyncio, outlines
    >>> q = outlines.string("q")
    >>> asyncio.run(outlines.aeval(q + "!", q + "?", givens={"q": "hi"}))
    ('hi!', 'hi?')
    """
    if not variables:
        raise TypeError("aeval needs at least one Variable")
    return await _evaluate(variables, givens, Options.check(options), None)


async def _evaluate(
    variables: tuple[Variable, ...],
    givens: Mapping[Any, Any] | None,
    options: Options,
    blocked_loop: asyncio.AbstractEventLoop | None,
) -> Any:
    with quiet_collector():  # planning walks and copies the whole graph: no collections over it meanwhile
        plan = Plan(variables)
    results = plan.pick(await run_plan(plan, givens, options, blocked_loop))
    return results[0] if len(variables) == 1 else tuple(results)


@overload
def eval(variable: Variable, /, *, givens: Mapping[Any, Any] | None = None, **options: Any) -> Any: ...  # noqa: A001
@overload
def eval(  # noqa: A001
    first: Variable, second: Variable, /, *more: Variable, givens: Mapping[Any, Any] | None = None, **options: Any
) -> tuple[Any, ...]: ...
def eval(*variables: Variable, givens: Mapping[Any, Any] | None = None, **options: Any) -> Any:  # noqa: A001
    """Evaluate one or several Variables in ONE schedule.

    ``eval(v)`` returns ``v``'s value itself; ``eval(a, b, ...)`` returns a
    tuple of their values, in order (unpack it: ``x, y = eval(a, b)``).

    Parameters
    ----------
    *variables
        The Variables to compute. Work they share is done once.
    givens
        Values of the free inputs, keyed by Variable or by name. Lists and
        tuples of strings are arrays.
    cache
        ``True`` (the default store), ``False``, or a ``outlines.cache.Cache``.
    max_concurrency
        Bound on wire requests in flight across the whole evaluation, all
        backends together (a positive integer; ``None``: no bound beyond
        each backend's own). A chat batch is one request per prompt, each
        holding a permit; a backend that does not send its own requests
        (a local model, a Python function) holds one permit per batch.
    errors
        ``"raise"`` (default): the first failure cancels the rest and raises a
        ``NodeError``. ``"return"``: failed elements hold ``outlines.Failure``.
    progress
        ``True``/``False`` to force the progress bar on/off; ``None`` shows it
        for evaluations that run longer than about two seconds.
    executor
        An ``outlines.runtime.executor.Executor`` (e.g. ``LocalExecutor``), or
        a Dask ``distributed.Client`` to run model batches and blocking Python
        ops on its workers.
    budget
        An ``outlines.Budget(tokens=..., cost=...)``: no batch is sent that
        could take the evaluation past it (prompt tokens counted, completions
        bounded by ``max_tokens``). Refused draws fail with ``BudgetExceeded``
        (a ``Failure`` with ``errors="return"``); what finished is cached.
    jobs
        ``True`` or an ``outlines.Jobs(...)``: the draws of OpenAI and
        Anthropic models go as provider batch jobs at half price, one round
        of ready draws at a time, recorded in the cache's ledger so that a
        re-run after a crash waits for them instead of paying again
        (``outlines.runtime.jobs``; guide: "Large jobs at half price").
        ``batch=`` is its deprecated name (a ``DeprecationWarning``; it goes
        in the next release).

    Returns
    -------
    Any or tuple
        For ONE Variable, its bare value (a ``str``, a Python value or a
        NumPy object array), not a 1-tuple; for several, a tuple of their
        values in the order given.

    Raises
    ------
    UnboundInputError
        When ``givens`` misses free inputs (all are listed).
    GraphBuildError
        When the givens' shapes cannot pair somewhere in the graph (naming
        the node and both shapes), before anything is sent.
    NodeError
        When a node fails (with ``errors="raise"``), naming the node and op.
    BudgetExceeded
        When the next batch could pass ``budget`` (with ``errors="raise"``),
        after the batches in flight have finished and been cached.
    JobsRunning
        With ``jobs=Jobs(wait=False)``, once the jobs of the first round
        that needs them are running.
    ValueError
        For ``max_concurrency`` that is not a positive integer, or ``errors``
        other than ``"raise"``/``"return"``.
    TypeError
        For an ``executor`` that is neither an Executor nor a Client.

    Examples
    --------
    >>> import outlines
    >>> q = outlines.string("q")
    >>> outlines.eval(q + "!", givens={"q": "hi"})
    'hi!'
    >>> outlines.eval(q + "!", q + "?", givens={"q": "hi"})
    ('hi!', 'hi?')
    """
    if not variables:
        raise TypeError("eval needs at least one Variable")
    checked = Options.check(options)
    return run_sync(lambda blocked_loop: _evaluate(variables, givens, checked, blocked_loop))
