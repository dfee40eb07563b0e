"""Job mode: a round's uncached draws of one backend sent as provider batch jobs, through the ledger.

``eval(..., jobs=True)`` (or ``jobs=Jobs(...)``, and the same option on a
``Program`` call) makes the batcher hand each round's ready, uncached draws of
an OpenAI or Anthropic backend to ``generate_as_jobs`` instead of the live
API; other backends stay live. The round's draws become lines (``custom_id`` =
the hex cache key of the draw, ``JobClient.lines``), cut into jobs at the
provider's limits (``jobs.split``); each job goes through the cache file's
``Ledger``:

1. ``record_intent`` before ``create``, ``record_created`` after;
2. every status read is kept (``advance``) while the job is waited for;
3. its results land in the cache (flushed to disk), then ``collected``.

Before sending anything, the draws already in an open job of the ledger (a
previous process's, killed at any step) are waited for instead: an intent
with no job id is looked for at the provider by its metadata
(``JobClient.find``) and abandoned only when it was never created. Lines of
such a job that the current round does not ask for are cached too: nothing
paid for is lost. Before the first job of fresh draws is created, the
provider's recent jobs of the run that the ledger does not hold (a damaged
row, a deleted cache file) are looked at (``JobClient.jobs_of``): those
whose requests are the draws' keys are recorded and waited for instead.

A draw whose constraint the provider's job lines cannot carry
(``HostedBackend.constraint_field(constraint, job=True)`` is ``None``:
Anthropic, OpenAI's ``/completions``) never reaches this module: the
batcher packs such draws in live calls (``batching.batches.pack_draws``),
at the live price, its text checked there, so that a draw breaking the
constraint is asked again at once rather than in a new job; ``explain``
says so.

Every doubt about a job is settled by asking the provider before anything
is sent again (``settle``): a create answered with an error body (or not at
all) is looked for; a finished job whose results do not name all its lines
is read again, and when the provider's counts say it answered lines its
results do not hold, or the job is unknown to it (404), ``JobInDoubt``
stops the round with the job open, naming it and what was paid
(``forget_job`` closes a job known to be gone). Lines whose fate nothing
settles go again once, never more.

Two processes on one cache: each open job has a lease in the ledger
(``Ledger.take``/``renew``). The round that records a job's intent holds its
lease, and a heartbeat task renews the leases it holds every
``Jobs(heartbeat=...)`` seconds while it uploads, creates, waits and
collects; it releases them when it returns or raises. A round that finds an
open job with pending draws whose lease another holds waits for it (it polls
the ledger every ``heartbeat`` seconds of the jobs' clock) and then reads
the draws from the cache; it takes the job over only once the lease has
expired (``Jobs(lease=...)`` seconds without a heartbeat: its holder died),
reconciling with the provider first. A round never creates a job whose
lease it lost: it checks right before ``create``, and a heartbeat that finds
the lease taken cancels a create still uploading. Two rounds asking the same
draws at once cannot both record them (``Claimed``): the second waits for
the first's job. A round whose lease ran out unnoticed (a loaded machine, a
stopped process) defers to the ledger when it next writes there (a poll, the
job id after ``create`` or after looking the job up): a job another process
holds now is waited for as theirs; one it closed meanwhile lands from the
cache, and the draws the cache lacks are settled from the job's results as
its collector settled them (``_JobRun.yield_job``), never sent again without
that; a job its intent no longer holds is recorded again (``Ledger.adopt``).

Faults: the lines of an expired or cancelled job that never ran, and error
lines the retry rules call retryable (up to the client's ``max_retries``
times), go again in the next job; other error lines fail their draws; a job
that ``failed`` fails its draws with the provider's reason quoted. With a
``deadline``, jobs still running after it are cancelled, what they finish
before they stop (within ``cancel_wait``) is kept, and their missing draws go
through the live API. A job still cancelling after that stays open in the
ledger (a later run that asks for its draws collects it); its unanswered
draws go live at once, so a line it finishes while cancelling is paid twice.
With ``wait=False`` the jobs are created (or found) and ``JobsRunning`` is
raised at once: a later call collects them.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from outlines.backends.base import Backend, BackendError, BatchReport
from outlines.draws import DrawColumns
from outlines.backends.jobs import (
    Backoff,
    Clock,
    JobClient,
    JobInDoubt,
    JobLine,
    JobStatus,
    LineResult,
    SystemClock,
    job_client,
    split,
    wait,
)
from outlines.cache import Cache, draw_keys
from outlines.cache.ledger import LEASE, Claimed, JobRecord, LeaseLost, Ledger, LedgerError
from outlines.common.errors import JobsRunning
from outlines.common.threads import pool, run_blocking

__all__ = ["MAX_ASKS", "JobEvent", "Jobs", "cancel_jobs", "forget_job", "generate_as_jobs", "has_jobs", "jobs"]

#: Jobs a request may be sent in (it expired, was cancelled or went unanswered) before its draws fail.
MAX_ASKS = 8
#: Seconds a job lives at the provider (its 24-hour window, and an hour to finish): how far back a
#: run looks for jobs its ledger lost.
JOB_LIFETIME = 25 * 3600.0
#: The metadata of a job holding lines sent again without evidence that the last job did not answer them.
RESENT = {"outlines_resent": "unread"}
#: The longest ``Jobs(run=...)``: the provider's limit on one metadata value (OpenAI's ``Metadata``).
MAX_RUN = 512


@dataclass(frozen=True)
class Jobs:
    """How an evaluation sends its draws as provider batch jobs (``eval(..., jobs=Jobs(...))``).

    Parameters
    ----------
    run
        The name the jobs carry (the provider's metadata and the ledger's
        ``run``), e.g. the program's name.
    wait
        ``False``: create (or find) the round's jobs and raise ``JobsRunning``
        at once instead of waiting; a later call with the same graph collects.
    deadline
        Seconds to wait for a job; after it the job is cancelled (what it
        finished is kept) and its missing draws go through the live API.
        ``None``: no deadline (the provider's 24 hours). A job another
        process holds is waited for to its end: its draws are paid already.
    cancel_wait
        Seconds past the deadline that a cancelled job may take to stop
        (OpenAI's take up to 10 minutes), so that what it finished is
        collected rather than bought again live. One still ``cancelling``
        after it stays open in the ledger (``outlines.jobs()``) and its
        unanswered draws go live at once: a line it finishes meanwhile is
        paid twice. With a deadline every wait is bounded: ``deadline +
        cancel_wait`` in all.
    backoff
        Pauses between polls of a job (capped exponential).
    clock
        Where waiting happens (default: the system's; tests pass a fake one).
    max_requests, max_bytes
        Per-job limits (default: the provider's: OpenAI 50,000 requests /
        200 MB, Anthropic 100,000 / 256 MB).
    lease
        Seconds, on the jobs' clock, after which another process may take over
        a job whose holder stopped renewing it (died): a re-run after a
        ``kill -9`` waits at most this long for the dead process's jobs.
    heartbeat
        Seconds between renewals of the leases this evaluation holds (real
        time, while anything is awaited), and between looks at the ledger
        while another process holds a job; less than ``lease``.

    Examples
    --------
    >>> Jobs(run="labels", deadline=3600.0).deadline
    3600.0
    >>> Jobs.of(True) == Jobs(), Jobs.of(False)
    (True, None)
    """

    run: str = "outlines"
    wait: bool = True
    deadline: float | None = None
    cancel_wait: float = 600.0
    backoff: Backoff = Backoff()
    clock: Any = field(default=None, compare=False)
    max_requests: int | None = None
    max_bytes: int | None = None
    lease: float = LEASE
    heartbeat: float = LEASE / 6

    def __post_init__(self) -> None:
        if not isinstance(self.run, str) or not self.run:
            raise ValueError(f"Jobs(run=...) must be a non-empty string, got {self.run!r}")
        if len(self.run) > MAX_RUN:  # it travels as a metadata value, which OpenAI caps at 512 characters
            raise ValueError(f"Jobs(run=...) must be at most {MAX_RUN} characters (OpenAI's limit on a metadata "
                             f"value), got {len(self.run)}")
        if isinstance(self.lease, bool) or not isinstance(self.lease, (int, float)) or not self.lease > 0:
            raise ValueError(f"Jobs(lease=...) must be seconds > 0, got {self.lease!r}")
        if (isinstance(self.heartbeat, bool) or not isinstance(self.heartbeat, (int, float))
                or not 0 < self.heartbeat < self.lease):
            raise ValueError(f"Jobs(heartbeat=...) must be seconds > 0 and less than the lease "
                             f"({self.lease!r}), got {self.heartbeat!r}")
        if self.deadline is not None and (isinstance(self.deadline, bool) or not self.deadline >= 0):
            raise ValueError(f"Jobs(deadline=...) must be seconds >= 0 or None, got {self.deadline!r}")
        if isinstance(self.cancel_wait, bool) or not isinstance(self.cancel_wait, (int, float)) \
                or not self.cancel_wait >= 0:
            raise ValueError(f"Jobs(cancel_wait=...) must be seconds >= 0, got {self.cancel_wait!r}")

    @classmethod
    def of(cls, value: Any) -> Jobs | None:
        """The settings an ``eval(jobs=...)`` option means: ``True``/``Jobs``, or ``None`` (live).

        Raises
        ------
        TypeError
            For anything but a bool, ``None`` or a ``Jobs``.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        raise TypeError(f"jobs= must be True, False or outlines.Jobs(...), got {value!r}")

    def limits(self) -> dict[str, int]:
        """The per-job limits given, as ``job_client`` keywords."""
        given = {"max_requests": self.max_requests, "max_bytes": self.max_bytes}
        return {name: value for name, value in given.items() if value is not None}


@dataclass(frozen=True)
class JobEvent:
    """What happened to one job, for progress and traces.

    ``kind`` is ``"created"``, ``"resumed"``, ``"status"`` or ``"collected"``;
    ``requests`` its lines and ``draws`` the draws they answer; ``bytes`` its
    upload; ``status`` the provider's last word; ``waited`` seconds since this
    evaluation created (or found) it, on the jobs' clock.
    """

    kind: str
    provider: str
    backend: str
    status: JobStatus
    requests: int = 0
    draws: int = 0
    bytes: int = 0
    waited: float = 0.0


class _NotOurs(Exception):
    """A poll found that the job is not this round's to wait for (``_JobRun.keep``); ``status`` is what it read."""

    def __init__(self, status: JobStatus) -> None:
        super().__init__(status.id)
        self.status = status


def has_jobs(backend: Backend) -> bool:
    """Whether ``backend``'s provider takes batch jobs (OpenAI and Anthropic backends)."""
    try:
        job_client(backend)
    except TypeError:
        return False
    return True


class _JobRun:
    """One call of ``generate_as_jobs``: the draws by key, what has landed, what is still missing."""

    def __init__(self, settings: Jobs, cache: Cache, backend: Backend, draws: DrawColumns, report: BatchReport,
                 on_job: Callable[[JobEvent], None] | None) -> None:
        self.settings, self.cache, self.backend, self.draws, self.report = settings, cache, backend, draws, report
        self.on_job = on_job
        self.client: JobClient = job_client(backend, **settings.limits())
        self.clock: Clock = settings.clock or SystemClock()
        self.ledger = Ledger(cache, clock=self.clock.time, lease=settings.lease)  # one holder of leases
        self.holding: set[str] = set()  # intents whose lease this round holds: the heartbeat renews them
        self.others: set[str] = set()  # intents with pending draws whose live lease another process holds
        self.creating: dict[str, asyncio.Future[JobStatus]] = {}  # creates in flight, by intent
        self.identity = backend.cache_identities[0]
        self.texts = [""] * len(draws)
        self.where: dict[str, list[int]] = {}
        for index, key in enumerate(draw_keys(self.identity, draws)):
            self.where.setdefault(key.hex(), []).append(index)
        self.pending: dict[str, None] = dict.fromkeys(self.where)  # keys still unanswered, in order
        self.asked: collections.Counter[str] = collections.Counter()  # jobs each key was sent in
        self.errors: collections.Counter[str] = collections.Counter()  # error lines per key: the retry policy's
        self.max_retries = int(getattr(getattr(backend, "client", None), "max_retries", 2))
        self.started = self.clock.time()
        self.late = False  # the deadline passed: what is left goes live
        self.since: dict[str, float] = {}  # job id -> when this round created or found it
        self.unread: set[str] = set()  # keys a finished job's results did not name, with nothing to say why
        self.looked = False  # the provider's jobs the ledger lost were looked for

    # -- landing ---------------------------------------------------------------------
    def land(self, texts: Mapping[str, str]) -> None:
        """Cache the texts of these keys; hand this round's over (the batcher caches those)."""
        foreign = {bytes.fromhex(key): text for key, text in texts.items() if key not in self.where}
        if foreign:  # a previous run's job answered draws this round does not ask for: keep them,
            # unless the cache holds them already (answered live meanwhile: that text was shown, it stays)
            held = self.cache.get_many(list(foreign), record=False, expect=str)
            self.cache.put_many({key: text for key, text in foreign.items() if key not in held})
        for key, text in texts.items():
            for index in self.where.get(key, ()):
                self.texts[index] = text
                self.report.result(index, text)
            self.pending.pop(key, None)

    def fail(self, keys: Sequence[str], error: BaseException) -> None:
        for key in keys:
            if self.pending.pop(key, 0) is None:
                for index in self.where[key]:
                    self.report.failure(index, error)

    def emit(self, kind: str, status: JobStatus, requests: int = 0, draws: int = 0, size: int = 0) -> None:
        # Waits on our clock, from when this round created or found the job (the provider's may be skewed).
        since = self.since.setdefault(status.id, self.clock.time())
        if self.on_job is not None:
            self.on_job(JobEvent(kind, self.client.provider, repr(self.backend), status, requests, draws, size,
                                 self.clock.time() - since))

    # -- the jobs --------------------------------------------------------------------
    async def open_jobs(self) -> list[str]:
        """Intents of the ledger's open jobs holding pending keys, reconciled with the provider.

        Only the jobs whose lease this round takes (free, expired or its own);
        those another process holds are left in ``others``, to wait for.
        """
        intents: list[str] = []
        for intent in sorted({ref.intent for ref in self.ledger.find(self.pending).values()}):
            if not self.ledger.take(intent):
                self.others.add(intent)
                continue
            self.holding.add(intent)
            record = self.ledger.get(intent)
            if record is None or not record.open:
                self.release(intent)
                continue
            if record.job_id is None and not await self.reconcile(record):
                self.release(intent)
                continue
            intents.append(intent)
            record = self.ledger.get(intent) or record
            status = JobStatus(record.job_id or "", record.state, total=record.requests)
            self.emit("resumed", status, record.requests)
        return intents

    async def reconcile(self, record: JobRecord) -> bool:
        """An intent with no job id: was the job created before the process died? Record it, or abandon."""
        found = await self.settle(record)
        try:
            if found is None:
                self.ledger.abandon(record.intent, "never created: the provider holds no job with its metadata")
                return False
            self.ledger.record_created(record.intent, found)
        except LedgerError:
            # Its lease ran out while the provider was asked: another process took the intent over and recorded
            # the job (closed it, even). The ledger's word stands: wait for it, or land what it cached.
            now = self.ledger.get(record.intent)
            if now is None or now.job_id is None:
                raise
            if found is None:  # the other process found the job this one did not: the provider's answer now
                found = await self.client.status(now.job_id, self.report)
            await self.yield_job(record.intent, self.ledger.lines(record.intent), found, record.metadata)
            return False
        return True

    def known(self, open: bool | None = None) -> list[str]:
        """The job ids the ledger holds for this provider (``open``: only those open, or closed)."""
        return [r.job_id for r in self.ledger.jobs(provider=self.client.provider, open=open) if r.job_id]

    async def settle(self, record: JobRecord) -> JobStatus | None:
        """Ask the provider whether the job of an intent was made: its status, or ``None`` when it was not.

        Jobs that may be it but cannot be told apart yet (Anthropic's batches
        carry no metadata: their results tell, once they end) are waited for
        (they cost nothing more); without waiting, or past the deadline, the
        ``JobInDoubt`` naming them stops the round, the intent kept.
        """
        custom_ids = list(self.ledger.lines(record.intent))
        for attempt in range(3):  # new look-alikes may start while we wait: a bounded number of looks
            try:
                return await self.client.find(record.metadata, record.requests, record.created,
                                              exclude=self.known(), custom_ids=custom_ids, report=self.report)
            except JobInDoubt as doubt:
                if not self.settings.wait or attempt == 2:
                    raise
                for job_id in doubt.jobs:
                    status = await wait(self.client, job_id, clock=self.clock, backoff=self.settings.backoff,
                                        deadline=self.left(), report=self.report)
                    if not status.finished:
                        raise
        raise AssertionError("unreachable")

    async def adopt(self, keys: Sequence[str]) -> list[str]:
        """The provider's jobs of this run that the ledger lost and that ask for some of ``keys``: recorded.

        A damaged ledger row or a deleted cache file forgets a job (or some
        of its lines) the provider still holds (for a day); its requests'
        ``custom_ids`` are draw keys, so a job asking for ours is ours to
        wait for, not to pay for again.
        """
        batch = self.draws.take([self.where[key][0] for key in keys])
        lines = self.client.lines(batch, [bytes.fromhex(key) for key in keys], BatchReport())
        # An open job is looked at too: a damaged line row forgets one of its draws.
        found = await self.client.jobs_of(self.settings.run, self.clock.time() - JOB_LIFETIME, lines,
                                          exclude=self.known(open=False), report=self.report)
        intents: list[str] = []
        taken: set[str] = set()
        for status, held in found:
            held = [line for line in held if line.custom_id not in taken]  # a line waits for one job
            if not held:
                continue
            taken.update(line.custom_id for line in held)
            record = self.ledger.adopt(
                provider=self.client.provider, backend=list(self.backend.identity), run=self.settings.run,
                lines=[(line.custom_id, line.keys) for line in held], status=status, metadata=status.metadata)
            intents.append(record.intent)
            self.emit("resumed", status, len(held), sum(len(line.keys) for line in held))
        return intents

    async def send(self, keys: Sequence[str]) -> list[str]:
        """Jobs for keys no open job holds: the run's jobs the ledger lost first, then new ones."""
        if not self.looked:  # once a round: jobs the ledger lost are waited for, not paid again
            self.looked = True
            intents = await self.adopt(keys)
            held = self.ledger.find(keys)
            keys = [key for key in keys if key not in held]
        else:
            intents = []
        again = [key for key in keys if key in self.unread]
        if again:  # sent again without evidence that they were not answered: once, in a marked job
            intents += await self.create_jobs(again, RESENT)
        fresh = [key for key in keys if key not in self.unread]
        if fresh:
            intents += await self.create_jobs(fresh)
        return intents

    async def create_jobs(self, keys: Sequence[str], metadata: Mapping[str, str] | None = None) -> list[str]:
        """Lines for the first draw of each key, cut at the limits; each job through the ledger."""
        first = [self.where[key][0] for key in keys]
        batch = self.draws.take(first)

        def refused(position: int, error: BaseException) -> None:  # a request that cannot be built
            self.fail([keys[position]], error)

        lines = self.client.lines(batch, [bytes.fromhex(key) for key in keys], BatchReport(on_failure=refused))
        intents = []
        for job in split(lines, self.client.limits):
            try:
                record = self.ledger.record_intent(
                    provider=self.client.provider, backend=list(self.backend.identity), run=self.settings.run,
                    lines=[(line.custom_id, line.keys) for line in job], metadata=metadata)
            except Claimed as claimed:  # another process recorded some of these draws first: wait for its job
                self.others.update(claimed.intents)
                continue
            self.asked.update(key for line in job for key in line.keys)
            self.holding.add(record.intent)
            try:
                status = await self.create(record.intent, job, record.metadata)
            except LeaseLost:  # taken over while uploading: the job is the new holder's, to wait for
                self.others.add(record.intent)
                continue
            except BackendError as error:
                if _refused(error):  # refused (a 4xx): no job was made, and none will be
                    self.ledger.abandon(record.intent, f"refused: {error}")
                    raise
                # Anything else (a 200 whose body is an error, an answer lost, a 5xx) may have made the job:
                # the provider is asked. Not found, the intent stays: the next run looks again.
                found = await self.settle(record)
                if found is None:
                    raise
                status = found
            try:
                self.ledger.record_created(record.intent, status)
            except LedgerError:
                # Its lease ran out while it was created: another process took the intent over, found the job
                # and recorded it (closed it, even), or the ledger lost the intent. The ledger's word stands.
                if not self.changed(record.intent, status.id):
                    raise
                await self.yield_job(record.intent, {line.custom_id: line.keys for line in job}, status,
                                     record.metadata)
                continue
            intents.append(record.intent)
            self.emit("created", status, len(job), sum(len(line.keys) for line in job),
                      sum(line.size for line in job))
        return intents

    async def create(self, intent: str, job: Sequence[JobLine], metadata: Mapping[str, str]) -> JobStatus:
        """``client.create``, only while this round holds the intent's lease; ``LeaseLost`` when it lost it."""
        self.ledger.renew(intent)  # raises LeaseLost: a job taken over is never created here
        creating = asyncio.ensure_future(self.client.create(job, metadata, self.report))
        self.creating[intent] = creating
        try:
            return await creating
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if intent in self.holding or (task is not None and task.cancelling()):
                raise  # not the heartbeat's doing: a Ctrl-C, a deadline
            raise LeaseLost(f"job intent {intent} was taken over by another process while it was created") from None
        finally:
            del self.creating[intent]

    def renew(self) -> None:
        """One heartbeat: renew each lease held; a create whose lease was taken over is stopped."""
        for intent in sorted(self.holding):
            try:
                self.ledger.renew(intent)
            except LeaseLost:
                self.holding.discard(intent)
                creating = self.creating.get(intent)
                if creating is not None:
                    creating.cancel()
            except sqlite3.Error:  # the file is busy: the next beat tries again, well within the lease
                pass

    async def heartbeat(self) -> None:
        """Renew the leases this round holds every ``heartbeat`` seconds, whatever the round awaits.

        It sleeps on the loop's real time, not the jobs' clock: a test's fake
        clock moves only when the round waits on it.
        """
        while True:
            await asyncio.sleep(self.settings.heartbeat)
            self.renew()

    def release(self, intent: str) -> None:
        self.holding.discard(intent)
        self.ledger.release(intent)

    async def wait_for_others(self) -> None:
        """Wait while other processes hold the jobs in ``others``; land what their collection cached.

        A job stops being waited for once closed (its draws are in the cache),
        or once its lease is free or expired (the next look takes it over).
        """
        if not self.others:
            return
        while self.others:
            await self.clock.sleep(self.settings.heartbeat)
            for intent in sorted(self.others):
                record, lease = self.ledger.get(intent), self.ledger.leased(intent)
                if record is None or not record.open or lease is None or lease.expires <= self.clock.time():
                    self.others.discard(intent)
        found = self.cache.get_many([bytes.fromhex(key) for key in self.pending], record=False, expect=str)
        self.land({key.hex(): text for key, text in found.items()})

    async def wait_for(self, intent: str) -> JobStatus | None:
        """The job's status once it has finished, or once the deadline (and ``cancel_wait``) passed.

        After the deadline the job is cancelled and waited for ``cancel_wait``
        more seconds, so what it finished is kept. One still ``cancelling``
        then is returned unfinished: it stays open in the ledger and ``run``
        sends its unanswered draws live. ``None`` when a poll finds the job is
        no longer this round's to wait for (``yield_job``).
        """
        record = self.ledger.get(intent)
        assert record is not None and record.job_id is not None
        lines = self.ledger.lines(intent)

        def seen(status: JobStatus) -> None:
            self.keep(intent, record, status)
            self.emit("status", status, len(lines))

        try:
            with self.still_known(record):
                status = await wait(self.client, record.job_id, clock=self.clock, backoff=self.settings.backoff,
                                    deadline=self.left(), on_status=seen, report=self.report)
            if not status.finished:  # the deadline passed: stop it, keep what it finished
                self.keep(intent, record, status)  # not one another process took over: it waits to the end
                self.late = True
                try:
                    status = await self.client.cancel(record.job_id, self.report)
                except BackendError as error:  # refused: it may have finished since the last poll
                    status = await self.client.status(record.job_id, self.report)
                    if not status.finished:
                        raise error from None
                self.keep(intent, record, status)
                grace = self.left(self.settings.cancel_wait)
                if not status.finished and grace:  # bounded too: a job may stay "cancelling" for good
                    status = await wait(self.client, record.job_id, clock=self.clock, backoff=self.settings.backoff,
                                        deadline=grace, on_status=seen, report=self.report)
        except _NotOurs as not_ours:
            await self.yield_job(intent, lines, not_ours.status, record.metadata)
            return None
        return status

    def keep(self, intent: str, record: JobRecord, status: JobStatus) -> None:
        """Keep a status read of the job of ``record`` in the ledger; ``_NotOurs`` when the job is not ours to wait for.

        Not ours: the ledger refuses the read because the job was closed (by
        another process that took it over once this one's lease ran out, or by
        its owner) or the intent no longer holds it (a damaged row); or its
        lease is another's now. The ledger's word stands, and ``yield_job``
        goes on from it.
        """
        try:
            self.ledger.advance(intent, status)
        except LedgerError:
            if not self.changed(intent, status.id):
                raise  # a refusal that nothing another process or the owner did explains
            raise _NotOurs(status) from None
        lease = self.ledger.leased(intent)
        if lease is None or lease.holder != self.ledger.holder:
            raise _NotOurs(status)

    def changed(self, intent: str, job_id: str) -> bool:
        """Whether the ledger's record of ``intent`` is no longer an open one of job ``job_id`` (a refusal's cause)."""
        now = self.ledger.get(intent)
        return now is None or not now.open or now.job_id != job_id

    async def yield_job(self, intent: str, lines: Mapping[str, Sequence[str]], status: JobStatus,
                        metadata: Mapping[str, str]) -> None:
        """Go on from the ledger's word about a job of this round's that turned out not to be its own.

        ``status`` is this round's last read of the job (``lines`` its lines,
        ``metadata`` what its intent sent). A lease of this round's ran out (a
        loaded machine, a stopped process) and another process took the job
        over; or its owner closed it; or the ledger lost it:

        - still open, another process's lease on it: waited for as theirs
          (``others``), taken over again only if that lease runs out too;
        - closed: what it cached lands from the cache. ``collected`` (or
          abandoned as ``failed``): the draws the cache lacks are settled as
          ``collect`` settles them, from the job's results once the provider
          says it ended (reads, not paid again), the closed record left as it
          is: error lines follow the retry policy, lines that never ran stay
          pending; a provider that says such a job still runs fails them,
          sent again only once the user forgets the job. Closed any other way (``forget_job``): the draws the cache
          lacks go on as for a run that came after it, sent again;
        - the intent no longer holds the job (a damaged row, another job id):
          the job is recorded again (``Ledger.adopt``), waited for and
          collected, never lost.
        """
        self.holding.discard(intent)  # the heartbeat no longer renews it; its lease is not ours to release
        now = self.ledger.get(intent)
        if now is None or now.job_id != status.id:
            self.ledger.adopt(provider=self.client.provider, backend=list(self.backend.identity),
                              run=self.settings.run, lines=list(lines.items()), status=status, metadata=metadata)
            return
        if now.open:
            self.others.add(intent)
            return
        keys = [key for keys in lines.values() for key in keys if key in self.pending]
        found = self.cache.get_many([bytes.fromhex(key) for key in keys], record=False, expect=str)
        self.land({key.hex(): text for key, text in found.items()})
        if not any(key in self.pending for key in keys):
            return
        if now.state == "collected" or (now.note or "").startswith("failed:"):
            if not status.finished:
                status = await self.client.status(status.id, self.report)
            if status.finished:
                await self.collect(intent, status, close=False)
                return
            # Nonsense: the ledger says the job ended, the provider that it runs. Its lines may be paid already,
            # so they are not sent again; forgetting the job (forget_job) says the user wants them sent.
            self.fail(keys, BackendError(
                f"{self.client.provider} batch job {status.id} is {now.state} in the ledger but the provider says "
                f"it is {status.state}: its draws are not sent again (they may be paid); outlines.forget_job("
                f"{status.id!r}) to send them again", retryable=False))

    def left(self, grace: float = 0.0) -> float | None:
        """Seconds left before the deadline (and ``grace`` after it); ``None`` without a deadline."""
        if self.settings.deadline is None:
            return None
        return max(0.0, self.started + self.settings.deadline + grace - self.clock.time())

    async def status(self, intent: str) -> JobStatus:
        """The provider's status of the job of ``intent`` now (one read, as ``wait_for``'s)."""
        record = self.ledger.get(intent)
        assert record is not None and record.job_id is not None
        with self.still_known(record):
            return await self.client.status(record.job_id, self.report)

    @contextlib.contextmanager
    def still_known(self, record: JobRecord) -> Iterator[None]:
        """Reads of the job of ``record``: a 404 (the provider no longer knows it) becomes ``gone``'s error."""
        try:
            yield
        except BackendError as error:
            if error.status != 404:
                raise
            raise self.gone(record, error) from None

    def gone(self, record: JobRecord, error: BackendError) -> JobInDoubt:
        """The error for a job the provider no longer knows (404): the ledger keeps it open."""
        last = record.status or {}
        return JobInDoubt(
            f"{self.client.provider} batch job {record.job_id} ({record.requests} request(s), intent "
            f"{record.intent}) is unknown to the provider (404: deleted?); last seen {record.state} with "
            f"{last.get('succeeded', 0)} request(s) answered (paid). Its requests are not sent again while the "
            f"ledger holds it open: if it is gone for good, outlines.forget_job({record.job_id!r}) closes it "
            f"and the next run sends them again (paying again for those answered). ({error})",
            [record.job_id or ""])

    async def collect(self, intent: str, status: JobStatus, close: bool = True) -> None:
        """Land a finished job's results; what never ran or may go again stays pending.

        ``close=False``: another process closed the job already (``yield_job``);
        its record is left as it is.
        """
        lines = self.ledger.lines(intent)
        if status.state == "failed":
            reason = status.reason or "no reason given"
            if close:
                self.ledger.abandon(intent, f"failed: {reason}")
            error = BackendError(f"{self.client.provider} batch job {status.id} failed: {reason}", retryable=False)
            self.fail([key for keys in lines.values() for key in keys], error)
            return
        # A malformed results file raises here, before anything is closed: the ledger keeps the job open.
        samples = {cid: len(keys) for cid, keys in lines.items()}
        results = await self.client.results(status, samples, self.report)
        if set(lines) - {result.custom_id for result in results}:
            # Finished, yet its results do not name every line: the provider is asked again once.
            status = await self.client.status(status.id, self.report)
            if close:
                close = self.advance_unless_closed(intent, status)
            results = await self.client.results(status, samples, self.report)
        answered: dict[str, str] = {}
        for result in results:
            keys = lines.get(result.custom_id)
            if keys is None:
                continue  # not a line of this job: nothing of ours
            if result.outcome == "succeeded":
                answered.update(zip(keys, result.texts))
            elif result.outcome == "errored" and result.error is not None:
                error = result.error
                self.errors.update(keys)
                if not (error.retryable and all(self.errors[key] <= self.max_retries for key in keys)):
                    self.fail(keys, error)
        self.land(answered)
        # On disk before the ledger forgets the job: a crash now loses nothing. Off the loop: the cache's
        # writer waits while the loop is busy.
        await run_blocking(self.cache.flush)
        unread = set(lines) - {result.custom_id for result in results}
        if unread:
            self.doubt(intent, status, results, [key for custom_id in sorted(unread) for key in lines[custom_id]])
        if close:
            try:
                self.ledger.collected(intent)
            except LedgerError:  # closed meanwhile (by its owner, a process that took it over): it stays so
                if not self.changed(intent, status.id):
                    raise
        self.emit("collected", status, len(lines), len(answered))

    def advance_unless_closed(self, intent: str, status: JobStatus) -> bool:
        """``Ledger.advance``; ``False`` when the record was closed meanwhile (another process's doing): left so."""
        try:
            self.ledger.advance(intent, status)
        except LedgerError:
            if not self.changed(intent, status.id):
                raise
            return False
        return True

    def doubt(self, intent: str, status: JobStatus, results: Sequence[LineResult], unread: Sequence[str]) -> None:
        """Lines a finished job's results do not name, read twice: settled by the provider's counts, or stop.

        Counts that say the job answered more lines than its results hold:
        those were paid and cannot be read, so the job stays open and
        ``JobInDoubt`` says so. Counts that account for every line say the
        unread ones were not answered: they go again like expired ones. No
        counts to tell: they go again once (in a job marked ``RESENT``), and
        a marked job that leaves them unread stops the same way.
        """
        record = self.ledger.get(intent)
        read = sum(result.outcome == "succeeded" for result in results)
        # Counts that cover every line, or a job stopped early that counts at all, say what was answered.
        counted = status.total > 0 and (status.succeeded + status.failed == status.total
                                        or status.state in ("expired", "cancelled"))
        if counted and status.succeeded <= read:
            return  # the provider says they were not answered: they stay pending
        if status.succeeded <= read and not (record is not None and _resent(record.metadata)):
            self.unread.update(unread)
            return
        if status.succeeded > read:
            known = (f"the provider counts {status.succeeded} answered (paid) and the results hold {read}, so "
                     f"{status.succeeded - read} paid answer(s) cannot be read")
        else:
            known = ("the provider gives no counts, so whether they were answered (and paid) is unknown, and "
                     "they were sent again once already")
        raise JobInDoubt(
            f"{self.client.provider} batch job {status.id} (intent {intent}) is {status.state}, but its results "
            f"name {len(unread)} of its draws nowhere (read twice): {known}. The job stays open and nothing is "
            f"sent again: run again later to read it again, or, to pay for them again, "
            f"outlines.forget_job({status.id!r}) and run again", [status.id])

    async def live(self, keys: Sequence[str]) -> None:
        """The stragglers after the deadline, through the live API."""
        batch = self.draws.take([self.where[key][0] for key in keys])

        def landed(position: int, text: str) -> None:
            self.land({keys[position]: text})

        def failed(position: int, error: BaseException) -> None:
            self.fail([keys[position]], error)

        live = BatchReport(on_result=landed, on_failure=failed, request_limit=self.report.request_limit)
        texts = await self.backend.generate(batch, live)
        self.land({key: text for position, (key, text) in enumerate(zip(keys, texts))
                   if position not in live.failures and key in self.pending})
        for name, value in enumerate(live.tokens):
            self.report.tokens[name] += value

    async def run(self) -> list[str]:
        beat = asyncio.ensure_future(self.heartbeat())
        try:
            return await self.until_answered()
        finally:
            beat.cancel()
            for intent in sorted(self.holding):  # another process may take them at once, not after the lease
                try:
                    self.release(intent)
                except sqlite3.Error:
                    pass  # they expire

    async def until_answered(self) -> list[str]:
        while self.pending:
            if self.late:
                await self.live(list(self.pending))
                break
            intents = await self.open_jobs()
            held = self.ledger.find(self.pending)
            fresh = [key for key in self.pending if key not in held]
            unanswered = [key for key in fresh if self.asked[key] >= MAX_ASKS]
            if unanswered:  # a provider that never answers some lines: stop asking
                self.fail(unanswered, BackendError(
                    f"{self.client.provider} jobs left these requests unanswered {MAX_ASKS} times", retryable=False))
                fresh = [key for key in fresh if key in self.pending]
            if fresh:
                intents += [intent for intent in await self.send(fresh) if intent not in intents]
            # A job recorded since open_jobs looked (another process's, an instant ago: both started at once)
            # may hold draws this round did not send: waited for as theirs, taken over later if its lease lapses.
            self.others.update(ref.intent for ref in self.ledger.find(self.pending).values()
                               if ref.intent not in intents)
            if not intents and not self.others:
                break
            if not self.settings.wait:
                now = [await self.status(intent) for intent in intents]
                if not all(s.finished for s in now) or self.others:
                    theirs = [r for r in map(self.ledger.get, sorted(self.others)) if r is not None]
                    ids = [s.id for s in now] + [r.job_id for r in theirs if r.job_id is not None]
                    requests = sum(len(self.ledger.lines(i)) for i in intents) + sum(r.requests for r in theirs)
                    raise JobsRunning(self.client.provider, ids, requests)
            statuses, _ = await asyncio.gather(asyncio.gather(*(self.wait_for(intent) for intent in intents)),
                                               self.wait_for_others())
            for intent, status in zip(intents, statuses):
                # None: not this round's job after all (yield_job). One still cancelling past the deadline
                # stays open: a later run collects it.
                if status is not None and status.finished:
                    await self.collect(intent, status)
            # A job found another's at a poll (its lease ran out here): waited for before anything else is sent.
            await self.wait_for_others()
        if self.pending:  # never an empty text handed back (and cached) as an answer
            self.fail(list(self.pending), BackendError(
                f"{self.client.provider} job mode ended a round with {len(self.pending)} draw(s) neither answered "
                "nor in a job (a bug in outlines: please report it); nothing was cached for them", retryable=False))
        return self.texts


async def generate_as_jobs(
    settings: Jobs,
    cache: Cache | None,
    backend: Backend,
    draws: DrawColumns,
    report: BatchReport,
    on_job: Callable[[JobEvent], None] | None = None,
) -> list[str]:
    """The texts of ``draws`` (one backend), asked in provider batch jobs; see the module docstring.

    Parameters
    ----------
    settings
        The evaluation's ``Jobs``.
    cache
        The evaluation's cache: its file holds the ledger.
    backend
        An OpenAI or Anthropic backend (``has_jobs``).
    draws
        The round's uncached draws of ``backend``.
    report
        Each draw's result or failure is reported to it as it lands (the
        batcher caches it); it counts the wire requests and tokens.
    on_job
        Called with a ``JobEvent`` at each step of each job.

    Returns
    -------
    list[str]
        One text per draw (``""`` for a reported failure).

    Raises
    ------
    ValueError
        Without a cache: the ledger lives in its file.
    JobsRunning
        With ``settings.wait`` false, while the jobs run.
    BackendError
        When the provider's answers cannot be read (the ledger keeps the job).
    """
    if cache is None:
        raise ValueError("job mode needs a cache: its file holds the ledger of jobs (eval(cache=False) "
                         "cannot be combined with jobs=...)")
    return await _JobRun(settings, cache, backend, draws, report, on_job).run()


def jobs(cache: Any = True, *, open: bool | None = True, run: str | None = None) -> list[JobRecord]:
    """The provider batch jobs recorded in a cache's ledger, oldest first.

    Parameters
    ----------
    cache
        As ``eval(cache=...)``: ``True`` (the default cache), a ``Cache`` or a path.
    open
        ``True`` (default): the jobs that may still deliver results (running,
        or finished and not collected yet); ``False``: the closed ones;
        ``None``: all.
    run
        Only the jobs of this run (``Jobs(run=...)``).

    Returns
    -------
    list[JobRecord]
        Each with its provider, job id, state, requests and last status.

    Raises
    ------
    ValueError
        When caching is off: there is no ledger.

    Examples
    --------
    >>> import outlines
    >>> outlines.jobs(cache=outlines.cache.Cache("/tmp/outlines-doc-jobs"))  # doctest: +SKIP
    []
    """
    return _ledger(cache).jobs(open=open, run=run)


def cancel_jobs(model: Any, cache: Any = True, *, run: str | None = None) -> list[JobStatus]:
    """Ask the provider to cancel the open jobs of ``model`` (what they finished is kept).

    The next batch-mode call of the same graph collects what the cancelled
    jobs finished and sends only the rest again.

    Parameters
    ----------
    model
        The ``models.openai(...)``/``models.anthropic(...)`` whose jobs to
        cancel (its key is used to ask; the ledger matches its identity).
    cache
        The cache whose ledger holds the jobs (as ``jobs``).
    run
        Only the jobs of this run.

    Returns
    -------
    list[JobStatus]
        The provider's answer for each job cancelled.

    Raises
    ------
    TypeError
        For a model whose provider has no batch jobs.

    Examples
    --------
    >>> import outlines
    >>> llm = outlines.models.openai("gpt-4o-mini")
    >>> [status.state for status in outlines.cancel_jobs(llm)]  # doctest: +SKIP
    ['cancelling']
    """
    backend = getattr(model, "backend", model)
    client = job_client(backend)
    ledger = _ledger(cache)
    records = [r for r in ledger.jobs(open=True, provider=client.provider, backend=list(backend.identity), run=run)
               if r.job_id is not None and r.state not in ("completed", "expired", "cancelled", "failed")]

    async def cancel_all() -> list[JobStatus]:
        try:
            out = []
            for record in records:
                status = await client.cancel(record.job_id or "")
                ledger.advance(record.intent, status)
                out.append(status)
            return out
        finally:
            await client.aclose()

    # A loop of its own on a pool thread: callable from sync code and from inside a running loop (Jupyter).
    return pool().submit(asyncio.run, cancel_all()).result()


def forget_job(job: str | JobRecord, cache: Any = True, *, reason: str = "forgotten by its owner") -> JobRecord:
    """Close a job in the ledger whatever its state: the next batch-mode run sends its draws again.

    The way out of a job whose fate nothing settles (``JobInDoubt``): one
    deleted at the provider, or finished with results that cannot be read.
    The draws it answered and that are not cached are paid again; cancel a
    job still running first (``cancel_jobs``), or its lines are paid twice.

    Parameters
    ----------
    job
        The provider's job id, the ledger's intent, or a ``JobRecord`` of
        ``jobs()``.
    cache
        The cache whose ledger holds the job (as ``jobs``).
    reason
        Kept as the record's ``note``.

    Returns
    -------
    JobRecord
        The closed record (state ``"abandoned"``).

    Raises
    ------
    ValueError
        When the ledger holds no such job, or caching is off.

    Examples
    --------
    >>> import outlines
    >>> outlines.forget_job("batch_abc123").state  # doctest: +SKIP
    'abandoned'
    """
    ledger = _ledger(cache)
    name = job.intent if isinstance(job, JobRecord) else str(job)
    record = ledger.by_job_id(name) or ledger.get(name)
    if record is None:
        raise ValueError(f"no job {name!r} in the ledger of {ledger.file} (outlines.jobs(open=None) lists them)")
    return ledger.forget(record.intent, reason)


def _refused(error: BackendError) -> bool:
    """A create the provider refused outright (a 4xx that no retry mends): it made no job."""
    return error.status is not None and 400 <= error.status < 500 and not error.retryable


def _resent(metadata: Mapping[str, str]) -> bool:
    return all(metadata.get(name) == value for name, value in RESENT.items())


def _ledger(cache: Any) -> Ledger:
    from outlines import cache as cache_module

    resolved = cache_module.resolve(cache)
    if resolved is None:
        raise ValueError("the cache is off: there is no ledger of jobs (pass cache=... or enable the cache)")
    return Ledger(resolved)
