"""The events of an evaluation: the ``Recorder`` protocol and its one fan-out.

The scheduler, the batcher and the control-flow runner report what happens
(an evaluation starts and ends, nodes start and finish, batches go out and come
back, wire requests end, cache hits, loop iterations, a cascade stage's counts,
provider batch jobs) to ONE recorder: the evaluation's (``outlines.runtime.session.Evaluation.recorder``). It is composed
once, when the evaluation is built, from the listeners that want the events:
the active trace (``outlines.trace()``), the progress counter, a stream's
watcher. ``compose`` gives ``NULL`` when nobody listens, the listener itself
when one does, and a ``FanOut`` that calls each listener in turn otherwise.

A listener derives from ``Listener``, where every event is a no-op, and
overrides the events it acts on; an event added to ``Recorder`` is added to
``Listener`` and ``FanOut`` (``tests/runtime/test_events.py`` checks both).
Batch ids are numbered by the evaluation (``Evaluation.batch_id``), once for
all its schedules, so events of a loop's iterations need no renumbering.
``listening`` tells a caller that reports an event once per node whether
anyone acts on it, so a schedule of 100k nodes skips the calls nobody hears.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from outlines.graph.basic import Apply

__all__ = ["FanOut", "Listener", "NULL", "Recorder", "compose", "listening"]


class Recorder(Protocol):
    """What an evaluation reports, as it happens; times are ``time.perf_counter()`` seconds."""

    def eval_started(self, plan: Any, t: float) -> None:
        """The evaluation of ``plan`` started (once per evaluation, whatever its schedules)."""

    def eval_finished(self, t: float, error: BaseException | None) -> None:
        """The evaluation ended, with ``error`` when it raised."""

    def node_started(self, node: Apply, t: float) -> None:
        """``node`` became ready and was dispatched."""

    def node_finished(self, node: Apply, t: float, error: BaseException | None = None) -> None:
        """``node`` finished (``error``: it failed)."""

    def node_cache(self, node: Apply, hits: int, misses: int) -> None:
        """A model call's draws: ``hits`` came from the cache, ``misses`` were sent."""

    def node_failures(self, node: Apply, outputs: tuple[Any, ...]) -> None:
        """``node`` finished with ``outputs`` holding ``outlines.Failure`` elements (``errors="return"``)."""

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None:
        """Batch ``batch_id`` of ``size`` draws, for the model calls labelled ``nodes``, went to ``backend``."""

    def batch_finished(
        self, batch_id: int, t: float, error: BaseException | None, usage: Sequence[int], worker: str | None,
        requests: int = 0,
    ) -> None:
        """Batch ``batch_id`` came back: its token ``usage``, where it ran, the wire ``requests`` it sent.

        ``usage`` is ``(prompt, completion, cached, cache_write)`` tokens as
        the backend reported them (``BatchReport.tokens``): cached and
        cache-write tokens are the parts of the prompt tokens read from and
        written to a prompt cache.
        """

    def request_finished(
        self, batch_id: int, start: float, end: float, error: BaseException | None = None, model: str | None = None
    ) -> None:
        """One wire request of batch ``batch_id`` ran from ``start`` to ``end`` (retries count).

        ``model`` names the model asked when it is not the batch's backend (a fallback chain).
        """

    def model_loaded(self, backend: Any, start: float, end: float) -> None:
        """``backend`` loaded its local model from ``start`` to ``end``."""

    def draws_answered(self, batch_id: int, answered_by: dict[str, int]) -> None:
        """Draws of batch ``batch_id`` answered per model (``repr``), for a fallback chain's batches."""

    def loop_iteration(self, node: Apply, iteration: int, active: int, batches: int, start: float, end: float) -> None:
        """One iteration of a loop (``outlines.runtime.control``) finished."""

    def loop_limited(self, loop: str, stopped: int, elements: int, max_iter: int) -> None:
        """``stopped`` of the ``elements`` of loop ``loop`` (its label) were stopped by ``max_iter``, not ``cond``."""

    def branch_counted(self, node: str, counts: dict[str, Any]) -> None:
        """A counted ``cond`` (a ``cascade`` stage, ``Cond.tally``) ran its branch: what its elements did."""

    def job_event(self, batch_id: int, event: Any) -> None:
        """A job answering batch ``batch_id`` was created, resumed, read or collected (``runtime.jobs.JobEvent``)."""


class Listener:
    """A ``Recorder`` whose every event is a no-op: listeners override the events they act on."""

    def eval_started(self, plan: Any, t: float) -> None: ...

    def eval_finished(self, t: float, error: BaseException | None) -> None: ...

    def node_started(self, node: Apply, t: float) -> None: ...

    def node_finished(self, node: Apply, t: float, error: BaseException | None = None) -> None: ...

    def node_cache(self, node: Apply, hits: int, misses: int) -> None: ...

    def node_failures(self, node: Apply, outputs: tuple[Any, ...]) -> None: ...

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None: ...

    def batch_finished(
        self, batch_id: int, t: float, error: BaseException | None, usage: Sequence[int], worker: str | None,
        requests: int = 0,
    ) -> None: ...

    def request_finished(
        self, batch_id: int, start: float, end: float, error: BaseException | None = None, model: str | None = None
    ) -> None: ...

    def model_loaded(self, backend: Any, start: float, end: float) -> None: ...

    def draws_answered(self, batch_id: int, answered_by: dict[str, int]) -> None: ...

    def loop_iteration(self, node: Apply, iteration: int, active: int, batches: int, start: float, end: float) -> None: ...

    def loop_limited(self, loop: str, stopped: int, elements: int, max_iter: int) -> None: ...

    def branch_counted(self, node: str, counts: dict[str, Any]) -> None: ...

    def job_event(self, batch_id: int, event: Any) -> None: ...


#: The recorder of an evaluation nobody listens to.
NULL: Recorder = Listener()


class FanOut:
    """Passes every event to each of its listeners, in order."""

    def __init__(self, listeners: Sequence[Recorder]) -> None:
        self.listeners = tuple(listeners)

    def eval_started(self, plan: Any, t: float) -> None:
        for listener in self.listeners:
            listener.eval_started(plan, t)

    def eval_finished(self, t: float, error: BaseException | None) -> None:
        for listener in self.listeners:
            listener.eval_finished(t, error)

    def node_started(self, node: Apply, t: float) -> None:
        for listener in self.listeners:
            listener.node_started(node, t)

    def node_finished(self, node: Apply, t: float, error: BaseException | None = None) -> None:
        for listener in self.listeners:
            listener.node_finished(node, t, error)

    def node_cache(self, node: Apply, hits: int, misses: int) -> None:
        for listener in self.listeners:
            listener.node_cache(node, hits, misses)

    def node_failures(self, node: Apply, outputs: tuple[Any, ...]) -> None:
        for listener in self.listeners:
            listener.node_failures(node, outputs)

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None:
        for listener in self.listeners:
            listener.batch_started(batch_id, backend, nodes, size, t)

    def batch_finished(
        self, batch_id: int, t: float, error: BaseException | None, usage: Sequence[int], worker: str | None,
        requests: int = 0,
    ) -> None:
        for listener in self.listeners:
            listener.batch_finished(batch_id, t, error, usage, worker, requests)

    def request_finished(
        self, batch_id: int, start: float, end: float, error: BaseException | None = None, model: str | None = None
    ) -> None:
        for listener in self.listeners:
            listener.request_finished(batch_id, start, end, error, model)

    def model_loaded(self, backend: Any, start: float, end: float) -> None:
        for listener in self.listeners:
            listener.model_loaded(backend, start, end)

    def draws_answered(self, batch_id: int, answered_by: dict[str, int]) -> None:
        for listener in self.listeners:
            listener.draws_answered(batch_id, answered_by)

    def loop_iteration(self, node: Apply, iteration: int, active: int, batches: int, start: float, end: float) -> None:
        for listener in self.listeners:
            listener.loop_iteration(node, iteration, active, batches, start, end)

    def loop_limited(self, loop: str, stopped: int, elements: int, max_iter: int) -> None:
        for listener in self.listeners:
            listener.loop_limited(loop, stopped, elements, max_iter)

    def branch_counted(self, node: str, counts: dict[str, Any]) -> None:
        for listener in self.listeners:
            listener.branch_counted(node, counts)

    def job_event(self, batch_id: int, event: Any) -> None:
        for listener in self.listeners:
            listener.job_event(batch_id, event)


def compose(*listeners: Recorder | None) -> Recorder:
    """The one recorder of ``listeners`` (``None`` entries skipped): ``NULL``, the only one, or a ``FanOut``.

    Examples
    --------
    >>> compose() is NULL and compose(None) is NULL
    True
    >>> only = Listener()
    >>> compose(None, only) is only
    True
    """
    present = [listener for listener in listeners if listener is not None and listener is not NULL]
    if not present:
        return NULL
    return present[0] if len(present) == 1 else FanOut(present)


def listening(recorder: Recorder, event: str) -> Callable[..., None] | None:
    """``recorder``'s method for ``event``, or ``None`` when it is ``Listener``'s no-op (nobody acts on it).

    Examples
    --------
    >>> listening(NULL, "node_finished") is None
    True
    >>> class Starts(Listener):
    ...     def node_started(self, node, t): print("started", node)
    >>> listening(Starts(), "node_started")("n", 0.0)
    started n
    >>> listening(Starts(), "node_finished") is None
    True
    """
    method: Callable[..., None] = getattr(recorder, event)
    if getattr(method, "__func__", None) is getattr(Listener, event):
        return None
    return method
