"""Provider batch jobs: the values that cross the ``JobClient`` protocol, splitting and waiting.

A *job* is one provider batch job (OpenAI Batch, Anthropic Message Batches):
many requests sent at once, answered within a day at half the price. A job
client turns draws into ``JobLine``s (one request each, its ``custom_id`` the
hex cache key of its first draw, ``keys`` the hex keys of every draw it
answers, so a result can only land on the draws it answers, in any order),
creates jobs from them, reads a job's ``JobStatus``, parses its results into
``LineResult``s, lists and cancels jobs, and finds a job created by a process
that died before it could record the job's id (``find``).

A job whose fate the provider's answers cannot settle (a completed job whose
results cannot be read, a job the provider no longer knows, a lost create
that matches only batches still running) raises ``JobInDoubt``: nothing is
sent again until it is settled.

``split`` cuts lines into jobs at the provider's limits (``JobLimits``);
``wait`` polls a job with a capped exponential backoff on an injectable
``Clock`` (tests advance a fake one instead of sleeping); a poll that
fails for a transient reason (``transient``) is tried again at the next
pause. Job states use OpenAI's words for both providers: ``validating``,
``in_progress``, ``finalizing``, ``cancelling``, then one of the
``FINISHED`` states ``completed``, ``expired``, ``cancelled`` or ``failed``.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence, runtime_checkable

from outlines.backends.base import Backend, BackendError, BatchReport
from outlines.draws import Draw
from outlines.backends.usage import WireUsage

__all__ = [
    "FINISHED",
    "POLL_FAILURES",
    "STATES",
    "Backoff",
    "Clock",
    "JobClient",
    "JobInDoubt",
    "JobLimits",
    "JobLine",
    "JobStatus",
    "LineResult",
    "SystemClock",
    "split",
    "transient",
    "wait",
]

#: States after which a job changes no more.
FINISHED = frozenset({"completed", "expired", "cancelled", "failed"})
STATES = ("validating", "in_progress", "finalizing", "cancelling", "completed", "expired", "cancelled", "failed")
#: Polls in a row that may fail for a transient reason (``transient``) before ``wait`` gives up: with the
#: default backoff, minutes of a gateway's trouble, each poll after the HTTP client's own retries.
POLL_FAILURES = 10
#: What became of one line: answered, answered with an error, or never run
#: (its job expired or was cancelled first: sent again, never a failure).
OUTCOMES = ("succeeded", "errored", "expired", "cancelled")


@dataclass(frozen=True)
class JobLine:
    """One request of a job.

    ``custom_id`` is the hex cache key of the first draw the line answers;
    ``keys`` the hex keys of all of them, in sample order (its ``n``);
    ``data`` what the provider receives for it, as JSON (an OpenAI JSONL
    line, an Anthropic request with its ``params``); ``size`` the bytes it
    adds to its job's upload.
    """

    custom_id: str
    keys: tuple[str, ...]
    data: bytes = field(default=b"", compare=False, repr=False)
    size: int = 0


@dataclass(frozen=True)
class JobLimits:
    """The most requests and bytes one job may hold (a provider's limits, or lower).

    ``envelope`` is what a job's upload costs beyond its lines' sizes (the
    JSON around Anthropic's requests).
    """

    requests: int
    bytes: int
    envelope: int = 0

    def __post_init__(self) -> None:
        for name in ("requests", "bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"job limit {name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class JobStatus:
    """What the provider says about one job.

    ``succeeded`` and ``failed`` count lines so far (``failed`` includes lines
    that expired or were cancelled); ``reason`` quotes the provider's
    reason for a ``failed`` job; ``results`` locates its results (OpenAI: the
    output and error file ids; Anthropic: the results path); ``input`` its
    requests (OpenAI: the input file id; Anthropic: none).
    """

    id: str
    state: str
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    created_at: float = 0.0
    metadata: Mapping[str, str] = field(default_factory=dict)
    reason: str | None = None
    results: tuple[str, ...] = ()
    input: str | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the ledger keeps it)."""
        return {"id": self.id, "state": self.state, "total": self.total, "succeeded": self.succeeded,
                "failed": self.failed, "created_at": self.created_at, "metadata": dict(self.metadata),
                "reason": self.reason, "results": list(self.results), "input": self.input}


@dataclass(frozen=True)
class LineResult:
    """The result of one line: its texts (``n`` samples), or its error.

    ``outcome`` is one of ``OUTCOMES``. An ``errored`` line's ``error`` says
    whether it may go again (``BackendError.retryable``, by the shared retry
    rules); ``expired`` and ``cancelled`` lines never ran and simply go again.
    ``usage`` holds its tokens (``usage.WireUsage``: prompt, completion, cached, cache write).
    """

    custom_id: str
    outcome: str
    texts: tuple[str, ...] = ()
    error: BackendError | None = None
    usage: WireUsage = WireUsage(0, 0)


class JobInDoubt(BackendError):
    """A job whose fate the provider's answers do not settle; nothing is sent again until they do.

    ``jobs`` are the provider's ids of the jobs concerned; the message says
    what was paid and how to resolve it (run again later, or
    ``outlines.forget_job`` for a job known to be gone).
    """

    def __init__(self, message: str, jobs: Iterable[str] = (), *, endpoint: str | None = None,
                 model: str | None = None) -> None:
        super().__init__(message, endpoint=endpoint, model=model, retryable=False)
        self.jobs = list(jobs)


class Clock(Protocol):
    """Where waiting happens: the system's clock, or a test's that advances on ``sleep``."""

    def time(self) -> float:
        """Seconds since the epoch."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""


class SystemClock:
    """The real clock: ``time.time`` and ``asyncio.sleep``."""

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass(frozen=True)
class Backoff:
    """Polling pauses: ``first`` seconds, times ``factor`` after each poll, at most ``cap``."""

    first: float = 5.0
    factor: float = 1.5
    cap: float = 120.0

    def pauses(self) -> Iterator[float]:
        pause = self.first
        while True:
            yield pause
            pause = min(self.cap, pause * self.factor)


@runtime_checkable
class JobClient(Protocol):
    """One provider's batch-job API for one backend (its model, base URL and key).

    Every method that talks to the provider takes an optional ``BatchReport``
    that counts its wire requests (each retry too); without one they go
    uncounted.
    """

    @property
    def provider(self) -> str:
        """``"openai"`` or ``"anthropic"``: whose jobs these are (recorded in the ledger)."""

    @property
    def backend(self) -> Backend:
        """The backend whose draws the jobs answer (its identity is the ledger's, never its key)."""

    @property
    def limits(self) -> JobLimits:
        """The most requests and bytes per job."""

    def lines(
        self, draws: Sequence[Draw], keys: Sequence[bytes], report: BatchReport | None = None
    ) -> list[JobLine]:
        """The lines asking for ``draws`` (draws with equal keys share one).

        ``keys`` are the draws' cache keys (``outlines.cache.draw_keys``, made
        by the caller: backends know nothing of the cache); each line's
        ``custom_id`` is the hex key of its first draw.

        A draw whose request cannot be built, or cannot go in any job (a lone
        surrogate, which UTF-8 cannot encode; more bytes than a job may
        hold), is reported with ``report.failure(index, error)``, the error
        naming its prompt, and left out (raised without a report): it fails
        alone and the rest of the job goes.
        """

    async def create(
        self, lines: Sequence[JobLine], metadata: Mapping[str, str], report: BatchReport | None = None
    ) -> JobStatus:
        """Create one job of ``lines`` (within ``limits``), labelled with ``metadata``.

        A create whose answer is lost is not sent again before ``find`` has
        looked for the job it may have made: nothing is paid twice.
        """

    async def status(self, job_id: str, report: BatchReport | None = None) -> JobStatus:
        """The job's status now."""

    async def results(
        self, status: JobStatus, samples: Mapping[str, int], report: BatchReport | None = None
    ) -> list[LineResult]:
        """The results of a finished job, one per line it ran or gave up on.

        ``samples`` maps each line's ``custom_id`` to the texts it must hold
        (``len(line.keys)``); a line answering with another count errs.

        Raises
        ------
        BackendError
            When the results cannot be read: a line that is not JSON or names
            no ``custom_id`` (quoted), or a job with no results yet.
        """

    async def page(
        self, after: str | None = None, limit: int = 100, report: BatchReport | None = None
    ) -> tuple[list[JobStatus], str | None]:
        """One page of the account's jobs, newest first, and the cursor of the next (``None``: last)."""

    async def cancel(self, job_id: str, report: BatchReport | None = None) -> JobStatus:
        """Ask the provider to cancel the job; results finished so far are kept."""

    async def find(
        self, metadata: Mapping[str, str], requests: int, since: float, *, exclude: Iterable[str] = (),
        custom_ids: Iterable[str] = (), report: BatchReport | None = None,
    ) -> JobStatus | None:
        """The job a ``create(lines, metadata)`` of ``requests`` lines made at or after ``since``, if any.

        ``exclude`` holds job ids already accounted for (the ledger's);
        ``custom_ids`` those of the lines, for a provider whose jobs carry no
        metadata: a job is never taken on its size alone.

        Raises
        ------
        JobInDoubt
            When jobs that may be it cannot be told apart from strangers'
            yet (naming them): they can be once they have finished.
        """

    async def jobs_of(
        self, run: str, since: float, lines: Sequence[JobLine], *, exclude: Iterable[str] = (),
        report: BatchReport | None = None,
    ) -> list[tuple[JobStatus, list[JobLine]]]:
        """The jobs created at or after ``since`` that ask for some of ``lines``, each with those lines.

        For a ledger that lost them (a damaged row, a deleted cache): OpenAI
        lists the jobs whose metadata names ``run`` and reads their input
        files (a line is held when its request is the same); Anthropic's
        batches carry no metadata, so those that have ended (with at most
        ``len(lines)`` requests) are read by their results (a ``custom_id``
        is a whole draw's key). ``exclude`` holds the job ids the ledger
        already holds.
        """

    async def aclose(self) -> None:
        """Release the running loop's session."""


def split(lines: Sequence[JobLine], limits: JobLimits) -> list[list[JobLine]]:
    """Cut ``lines`` into jobs of at most ``limits.requests`` lines and ``limits.bytes`` bytes, in order.

    A job's bytes are its lines' sizes and ``limits.envelope``.

    Raises
    ------
    ValueError
        When one line alone is larger than a job may be (naming it).

    Examples
    --------
    >>> lines = [JobLine(str(i), (str(i),), b"", 40) for i in range(5)]
    >>> [len(job) for job in split(lines, JobLimits(requests=2, bytes=1000))]
    [2, 2, 1]
    >>> [len(job) for job in split(lines, JobLimits(requests=10, bytes=100))]
    [2, 2, 1]
    """
    jobs: list[list[JobLine]] = []
    current: list[JobLine] = []
    overhead = size = limits.envelope
    for line in lines:
        if line.size + overhead > limits.bytes:
            raise ValueError(f"the request {line.custom_id} takes {line.size} bytes, more than a job may hold "
                             f"({limits.bytes} bytes)")
        if current and (len(current) == limits.requests or size + line.size > limits.bytes):
            jobs.append(current)
            current, size = [], overhead
        current.append(line)
        size += line.size
    if current:
        jobs.append(current)
    return jobs


def transient(error: BackendError) -> bool:
    """Whether a failed poll may simply be tried again at the next pause.

    It may when the retry rules call its failure retryable (``retry.should_retry``:
    a 5xx, 429, a dropped connection, after the HTTP client's own retries) or
    when a 2xx answer held no job (a gateway's error body or page): reading a
    job's status costs nothing, and a hiccup must not end a day-long wait.
    A refusal (401, 403, 404...) is not transient.
    """
    return error.retryable or error.status == 200


async def wait(
    client: JobClient,
    job_id: str,
    *,
    clock: Clock | None = None,
    backoff: Backoff = Backoff(),
    deadline: float | None = None,
    on_status: Callable[[JobStatus], None] | None = None,
    report: BatchReport | None = None,
    failures: int = POLL_FAILURES,
) -> JobStatus:
    """Poll a job until it finishes, or until ``deadline`` seconds have passed.

    Parameters
    ----------
    client, job_id
        The job.
    clock
        Where time passes (default ``SystemClock()``).
    backoff
        The pauses between polls (capped exponential).
    deadline
        Seconds after which the last status is returned, finished or not
        (the caller may then send the stragglers live); ``None``: no limit.
    on_status
        Called with every status read (progress).
    report
        Counts the polls' wire requests.
    failures
        Polls in a row that may fail for a transient reason (``transient``)
        before the wait gives up: each is tried again at the next pause.

    Returns
    -------
    JobStatus
        Finished, or the last one read when the deadline passed.

    Raises
    ------
    BackendError
        For a poll refused for good, for more than ``failures`` transient
        failures in a row, or when the deadline passes before any poll
        answered.
    """
    clock = clock or SystemClock()
    start = clock.time()
    last: JobStatus | None = None
    failed = 0
    for pause in backoff.pauses():
        try:
            status = await client.status(job_id, report)
        except BackendError as error:
            failed += 1
            late = deadline is not None and clock.time() >= start + deadline
            if not transient(error) or failed > failures or (late and last is None):
                raise
        else:
            last, failed = status, 0
            if on_status is not None:
                on_status(status)
            if status.finished:
                return status
        if deadline is not None:
            left = start + deadline - clock.time()
            if left <= 0 and last is not None:
                return last
            pause = min(pause, max(0.0, left))
        await clock.sleep(pause)
    raise AssertionError("unreachable")  # pauses() never ends
