"""The job ledger: every provider batch job, recorded in the cache's own SQLite file.

A job costs money the moment it is created, and lives for up to a day: a
process that dies meanwhile (Ctrl-C, a crash, ``kill -9``, a reboot) must find
it again instead of paying twice. So each job is written down here, each step
in its own committed transaction (``synchronous=FULL``: it survives a power
cut too), before the step it guards:

1. ``record_intent``: the job about to be created, with the lines it will
   hold (each line's ``custom_id`` and the hex draw keys it answers), the
   provider, the backend's identity (never its key), the run it belongs to
   and the metadata to send; state ``intent``.
2. ``record_created``: the provider's job id once ``create`` answered; from
   then on the provider's state (``validating`` ... ``completed``).
   An ``intent`` with no id after a crash is looked for at the provider
   (``JobClient.find``, by its metadata) before anything is sent again.
3. ``advance``: each status read while it runs.
4. ``collected``: its results are in the cache; or ``abandon`` (never created,
   or given up), with the reason.

``find(keys)`` answers "is this draw already in a job that is still open?",
so a re-run waits for that job instead of sending the draw again; and
``record_intent`` refuses (``Claimed``), in the same transaction that would
write it, a job holding a draw another open job already asks: two processes
that evaluate the same graph at once never both send it.

Two processes on one cache: each open job has a *lease* (table
``job_leases``: its holder, a ``Ledger.holder`` token naming one process's
ledger, and when it expires, on the ledger's clock). ``record_intent`` gives
the new job's lease to its writer; the holder renews it (``renew``, its
heartbeat) while it uploads, creates, waits and collects, and ``release``s it
when done (closing a job ends its lease). Another process ``take``s a job only
when its lease is free or has expired (its holder died): until then it waits
for the holder's results. ``renew`` raises ``LeaseLost`` once another holder
took the job over, so a process that lost its lease never creates the job;
and a job id recorded after the intent was given up (``abandon``) reopens it,
since the job exists: it is collected, never lost.

Rows are data only (JSON text and strings) with a CRC-32 checksum over the
whole row, like the cache's entries (``sqlite.checksum``); a row that fails
it is skipped with a ``CacheWarning``, never decoded, never executed. The
ledger opens its own connection through ``SQLiteStore.connect`` (the same
WAL file, format check and set-up as the draws'), so ``Cache.clear()`` (which
empties the draws) leaves it alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import uuid
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

from outlines.common.keys import normalize
from outlines.cache.sqlite import SQLiteStore
from outlines.common.errors import CacheWarning
from outlines.cache.store import Cache

__all__ = ["CLOSED", "Claimed", "JobRecord", "Lease", "LeaseLost", "Ledger", "LedgerError", "LineRef", "Status"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    intent TEXT PRIMARY KEY NOT NULL,
    job_id TEXT,
    state TEXT NOT NULL,
    record BLOB NOT NULL,
    checksum INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_job_id ON jobs(job_id);
CREATE TABLE IF NOT EXISTS job_lines (
    key TEXT NOT NULL,
    intent TEXT NOT NULL,
    custom_id TEXT NOT NULL,
    sample INTEGER NOT NULL,
    checksum INTEGER NOT NULL,
    PRIMARY KEY (key, intent)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS job_lines_intent ON job_lines(intent);
CREATE TABLE IF NOT EXISTS job_leases (
    intent TEXT PRIMARY KEY NOT NULL,
    holder TEXT NOT NULL,
    expires REAL NOT NULL,
    checksum INTEGER NOT NULL
);
"""

#: Ledger states besides the provider's (``backends.jobs.STATES``).
INTENT = "intent"
#: States of a job the ledger is done with.
CLOSED = frozenset({"collected", "abandoned"})
#: Provider states after which a job changes no more (``backends.jobs.FINISHED``).
_FINISHED = frozenset({"completed", "expired", "cancelled", "failed"})
_PROVIDER_STATES = frozenset({"validating", "in_progress", "finalizing", "cancelling"}) | _FINISHED
#: Keys per SELECT (older SQLite builds bind at most 999 parameters).
_CHUNK = 900
#: Seconds a lease lasts unless renewed (``Ledger(lease=...)``, ``Jobs(lease=...)``).
LEASE = 60.0


class Status(Protocol):
    """What the ledger keeps of a provider's status (``backends.jobs.JobStatus``)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


class LedgerError(RuntimeError):
    """A transition the ledger refuses: an unknown intent, another job id, a step back."""


class Claimed(LedgerError):
    """A job about to be recorded holds draws that another open job already asks (``intents``)."""

    def __init__(self, message: str, intents: Sequence[str]) -> None:
        super().__init__(message)
        self.intents = list(intents)


class LeaseLost(LedgerError):
    """Another holder took the job over (this one's lease had expired): this process must not create it."""


@dataclass(frozen=True)
class JobRecord:
    """One job as the ledger knows it.

    ``state`` is ``"intent"``, a provider state, ``"collected"`` or
    ``"abandoned"``; ``status`` the last ``JobStatus.to_dict()`` read;
    ``metadata`` what was (or is to be) sent with the job, naming the run and
    the intent; ``requests`` its number of lines; ``note`` why it was
    abandoned. Times are seconds since the epoch.
    """

    intent: str
    provider: str
    backend: list[Any]
    run: str
    state: str
    job_id: str | None = None
    requests: int = 0
    metadata: Mapping[str, str] = field(default_factory=dict)
    status: Mapping[str, Any] | None = None
    created: float = 0.0
    updated: float = 0.0
    note: str | None = None

    @property
    def open(self) -> bool:
        """Whether the job may still deliver results the cache lacks (not collected or abandoned)."""
        return self.state not in CLOSED

    def to_json(self) -> bytes:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["metadata"] = dict(self.metadata)
        data["status"] = dict(self.status) if self.status is not None else None
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class Lease:
    """Who holds a job (a ``Ledger.holder``) and until when (seconds since the epoch, on the ledger's clock)."""

    intent: str
    holder: str
    expires: float


@dataclass(frozen=True)
class LineRef:
    """Where one draw is asked: the job (``intent``), its line, and its sample in the line."""

    intent: str
    custom_id: str
    sample: int


def _select_in(connection: sqlite3.Connection, select: str, column: str, values: Sequence[str]) -> list[Any]:
    """The rows of ``select`` whose ``column`` is one of ``values``, asked ``_CHUNK`` values at a time."""
    rows: list[Any] = []
    for start in range(0, len(values), _CHUNK):
        chunk = values[start : start + _CHUNK]
        rows += connection.execute(f"{select} WHERE {column} IN ({','.join('?' * len(chunk))})", chunk).fetchall()
    return rows


def _job_checksum(intent: str, job_id: str | None, state: str, record: bytes) -> int:
    head = "\0".join((intent, job_id or "", state)).encode("utf-8", "surrogatepass")
    return zlib.crc32(record, zlib.crc32(head))


def _line_checksum(key: str, intent: str, custom_id: str, sample: int) -> int:
    return zlib.crc32(f"{key}\0{intent}\0{custom_id}\0{sample}".encode("utf-8", "surrogatepass"))


def _lease_checksum(intent: str, holder: str, expires: float) -> int:
    return zlib.crc32(f"{intent}\0{holder}\0{expires!r}".encode("utf-8", "surrogatepass"))


class Ledger:
    """The jobs recorded in one cache file; see the module docstring.

    Parameters
    ----------
    cache
        A ``Cache`` (its file), or the path of a cache's SQLite file.
    timeout
        Seconds to wait for another process's write lock.
    clock
        Seconds since the epoch, for the records' times and the leases.
    lease
        Seconds a lease this ledger takes lasts unless renewed.

    Each ``Ledger`` is one holder of leases (``holder``): one per process and
    round of jobs. Methods are thread-safe, and each transition is one
    committed transaction. They raise ``sqlite3.Error`` (or
    ``sqlite.FormatMismatch``) when the file cannot be used, and
    ``LedgerError`` for a transition that is refused.

    Examples
    --------
    >>> ledger = Ledger("/tmp/outlines-doc/draws.sqlite3")  # doctest: +SKIP
    >>> record = ledger.record_intent(provider="openai", backend=["openai", "gpt-4o-mini", "..."],
    ...                               run="labels", lines=[("ab12", ["ab12", "cd34"])])  # doctest: +SKIP
    >>> ledger.find(["cd34"])["cd34"].sample  # doctest: +SKIP
    1
    """

    def __init__(self, cache: Cache | str | os.PathLike[str], *, timeout: float = 30.0,
                 clock: Callable[[], float] = time.time, lease: float = LEASE) -> None:
        if isinstance(lease, bool) or not lease > 0:
            raise ValueError(f"Ledger(lease=...) must be seconds > 0, got {lease!r}")
        self.file = cache.file if isinstance(cache, Cache) else Path(cache).expanduser().absolute()
        self.timeout = timeout
        self.clock = clock
        self.lease = float(lease)
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._holder = (self._pid, f"{self._pid}-{uuid.uuid4().hex[:16]}")

    @property
    def holder(self) -> str:
        """This ledger's token in the leases it holds (a forked child gets its own)."""
        if self._holder[0] != os.getpid():
            self._holder = (os.getpid(), f"{os.getpid()}-{uuid.uuid4().hex[:16]}")
        return self._holder[1]

    def __repr__(self) -> str:
        return f"Ledger({str(self.file)!r})"

    # -- transitions ---------------------------------------------------------------

    def record_intent(
        self,
        *,
        provider: str,
        backend: Sequence[Any],
        run: str,
        lines: Iterable[tuple[str, Sequence[str]]],
        metadata: Mapping[str, str] | None = None,
    ) -> JobRecord:
        """Write down a job about to be created, before ``create`` is sent.

        Parameters
        ----------
        provider
            ``JobClient.provider``.
        backend
            The backend's identity (kind, model, base URL...; never a key).
        run
            The run the job belongs to (a program's name, a user's label).
        lines
            ``(custom_id, keys)`` of each line (``JobLine.custom_id``,
            ``JobLine.keys``): the hex draw keys it answers, in sample order.
        metadata
            More metadata to send with the job; ``outlines_run`` and
            ``outlines_intent`` are added (``find`` looks for them).

        Returns
        -------
        JobRecord
            State ``"intent"``; its ``metadata`` is what ``create`` must send.
            This ledger holds its lease (``holder``), for ``lease`` seconds.

        Raises
        ------
        Claimed
            When another open job asks one of these draws (another process
            recorded it first): nothing is written.
        """
        pairs = [(str(custom_id), tuple(keys)) for custom_id, keys in lines]
        intent = uuid.uuid4().hex
        now = self.clock()
        sent = {**dict(metadata or {}), "outlines_run": str(run), "outlines_intent": intent}
        record = JobRecord(intent, str(provider), list(normalize(list(backend))), str(run), INTENT,
                           requests=len(pairs), metadata=sent, created=now, updated=now)
        rows = []
        for custom_id, keys in pairs:
            for sample, key in enumerate(keys):
                rows.append((key, intent, custom_id, sample, _line_checksum(key, intent, custom_id, sample)))
        with self._locked(transaction=True) as connection:
            # The check and the write are one transaction: of two processes asking a draw, one records it.
            held = self._find(connection, [row[0] for row in rows], open_only=True)
            if held:
                intents = sorted({ref.intent for ref in held.values()})
                raise Claimed(f"{len(held)} draw(s) of this job are already asked in open job(s) "
                              f"{', '.join(intents)}", intents)
            self._write(connection, record)
            connection.executemany("INSERT OR REPLACE INTO job_lines VALUES (?, ?, ?, ?, ?)", rows)
            self._write_lease(connection, intent, self.clock())  # from when the file let us write
        return record

    def record_created(self, intent: str, status: Status) -> JobRecord:
        """The provider created the job: keep its id and first status (a ``JobStatus``).

        Whoever holds the lease: the job exists and is paid, so it is kept. An
        intent abandoned as never created (another process took it over and
        found no job yet) is reopened with it, to be collected.

        Raises
        ------
        LedgerError
            When the intent is unknown, collected, or already holds another job id.
        """
        def change(record: JobRecord) -> JobRecord:
            if record.job_id not in (None, status.id) or record.state == "collected" or (
                    not record.open and record.job_id is not None):
                raise LedgerError(f"job intent {intent} is {record.state} with job {record.job_id}; "
                                  f"cannot record job {status.id}")
            if not record.open:
                record = self._replace(record, note=f"reopened: job {status.id} was created after the intent "
                                                    f"was abandoned ({record.note})"[:2000])
            return self._with_status(record, status)

        return self._change(intent, change)

    def advance(self, intent: str, status: Status) -> JobRecord:
        """Keep a status read from the provider (a ``JobStatus`` of the job the intent holds).

        A finished job's state does not go back to a running one (a stale read).

        Raises
        ------
        LedgerError
            When the intent is unknown, has no job yet or another one, or is closed.
        """
        def change(record: JobRecord) -> JobRecord:
            if record.job_id != status.id or not record.open:
                raise LedgerError(f"job intent {intent} is {record.state} with job {record.job_id}; "
                                  f"cannot advance it with job {status.id}")
            if record.state in _FINISHED and status.state not in _FINISHED:
                return record
            return self._with_status(record, status)

        return self._change(intent, change)

    def collected(self, intent: str) -> JobRecord:
        """The job's results are in the cache: it is closed.

        Raises
        ------
        LedgerError
            Unless the job has finished at the provider.
        """
        def change(record: JobRecord) -> JobRecord:
            if record.state == "collected":
                return record
            if record.state not in _FINISHED:
                raise LedgerError(f"job intent {intent} is {record.state}: only a finished job is collected")
            return self._replace(record, state="collected")

        return self._change(intent, change)

    def abandon(self, intent: str, reason: str) -> JobRecord:
        """Close a job that was never created, or that failed or was given up, saying why.

        Raises
        ------
        LedgerError
            For a job still running at the provider (cancel it first) or collected.
        """
        def change(record: JobRecord) -> JobRecord:
            if record.state == "abandoned":
                return record
            if record.state not in _FINISHED | {INTENT}:
                raise LedgerError(f"job intent {intent} is {record.state}: cancel it before abandoning it")
            return self._replace(record, state="abandoned", note=str(reason)[:2000])

        return self._change(intent, change)

    # -- leases --------------------------------------------------------------------

    def take(self, intent: str) -> bool:
        """Hold the lease of ``intent`` when it is free, expired (its holder died) or this ledger's already.

        Returns ``False`` while another holder's lease is live: wait for it.
        """
        with self._locked(transaction=True) as connection:
            now = self.clock()
            current = self._lease(connection, intent)
            if current is not None and current.holder != self.holder and current.expires > now:
                return False
            self._write_lease(connection, intent, now)
        return True

    def renew(self, intent: str) -> Lease:
        """Keep holding the lease of ``intent`` for ``lease`` seconds more (the heartbeat; the check before ``create``).

        Raises
        ------
        LeaseLost
            When this ledger does not hold it: another holder took the job
            over, or it was closed. This process must then not create it.
        """
        with self._locked(transaction=True) as connection:
            current = self._lease(connection, intent)
            if current is None or current.holder != self.holder:
                owner = "nobody (the job was closed)" if current is None else f"holder {current.holder}"
                raise LeaseLost(f"job intent {intent} is held by {owner}, not by this process "
                                f"({self.holder}): its lease expired and it was taken over")
            return self._write_lease(connection, intent, self.clock())

    def release(self, intent: str) -> None:
        """Let another process take ``intent`` at once (this ledger's lease only)."""
        with self._locked(transaction=True) as connection:
            connection.execute("DELETE FROM job_leases WHERE intent = ? AND holder = ?", (intent, self.holder))

    def leased(self, intent: str) -> Lease | None:
        """The lease of ``intent`` (``None``: free); live while ``expires`` is after the ledger's clock."""
        with self._locked() as connection:
            return self._lease(connection, intent)

    # -- reads ---------------------------------------------------------------------

    def get(self, intent: str) -> JobRecord | None:
        """The record of ``intent`` (``None`` when unknown or damaged)."""
        with self._locked() as connection:
            return self._one(connection, "intent", intent)

    def by_job_id(self, job_id: str) -> JobRecord | None:
        """The record holding the provider's job ``job_id``."""
        with self._locked() as connection:
            return self._one(connection, "job_id", job_id)

    def jobs(
        self,
        *,
        open: bool | None = None,
        provider: str | None = None,
        backend: Sequence[Any] | None = None,
        run: str | None = None,
    ) -> list[JobRecord]:
        """The records, oldest first, filtered by openness, provider, backend identity and run."""
        with self._locked() as connection:
            rows = connection.execute("SELECT intent, job_id, state, record, checksum FROM jobs").fetchall()
        wanted = normalize(list(backend)) if backend is not None else None
        out = [r for r in self._records(rows)
               if (open is None or r.open == open) and (provider is None or r.provider == provider)
               and (wanted is None or r.backend == wanted) and (run is None or r.run == run)]
        return sorted(out, key=lambda r: (r.created, r.intent))

    def lines(self, intent: str) -> dict[str, tuple[str, ...]]:
        """The lines of a job: ``custom_id -> keys`` (in sample order)."""
        with self._locked() as connection:
            rows = connection.execute("SELECT key, intent, custom_id, sample, checksum FROM job_lines "
                                      "WHERE intent = ?", (intent,)).fetchall()
        samples: dict[str, dict[int, str]] = {}
        for key, _, custom_id, sample in self._line_rows(rows):
            samples.setdefault(custom_id, {})[sample] = key
        return {custom_id: tuple(keys[i] for i in sorted(keys)) for custom_id, keys in sorted(samples.items())}

    def find(self, keys: Iterable[str], *, open_only: bool = True) -> dict[str, LineRef]:
        """Where each of ``keys`` (hex draw keys) is asked: its line in the newest (open) job holding it.

        Keys in no such job are absent.
        """
        with self._locked() as connection:
            return self._find(connection, keys, open_only=open_only)

    def close(self) -> None:
        """Close this process's connection (a later call opens another)."""
        with self._lock:
            if self._connection is not None and self._pid == os.getpid():
                self._connection.close()
            self._connection = None

    # -- the file ------------------------------------------------------------------

    def _find(self, connection: sqlite3.Connection, keys: Iterable[str], *, open_only: bool) -> dict[str, LineRef]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, tuple[float, LineRef]] = {}
        rows = _select_in(connection, "SELECT key, intent, custom_id, sample, checksum FROM job_lines", "key", keys)
        intents = sorted({row[1] for row in rows})
        jobs = _select_in(connection, "SELECT intent, job_id, state, record, checksum FROM jobs", "intent", intents)
        records = {r.intent: r for r in self._records(jobs)}
        for key, intent, custom_id, sample in self._line_rows(rows):
            record = records.get(intent)
            if record is None or (open_only and not record.open):
                continue
            if key not in found or found[key][0] <= record.created:
                found[key] = (record.created, LineRef(intent, custom_id, sample))
        return {key: ref for key, (_, ref) in found.items()}

    def _change(self, intent: str, change: Callable[[JobRecord], JobRecord]) -> JobRecord:
        with self._locked(transaction=True) as connection:
            current = self._one(connection, "intent", intent)
            if current is None:
                raise LedgerError(f"no job intent {intent} in {self.file}")
            record = change(current)
            if record is not current:
                self._write(connection, record)
            if not record.open:  # a closed job needs no holder
                connection.execute("DELETE FROM job_leases WHERE intent = ?", (intent,))
        return record

    def _lease(self, connection: sqlite3.Connection, intent: str) -> Lease | None:
        row = connection.execute("SELECT intent, holder, expires, checksum FROM job_leases WHERE intent = ?",
                                 (intent,)).fetchone()
        if row is None:
            return None
        if type(row[2]) is not float or _lease_checksum(row[0], row[1], row[2]) != row[3]:
            warnings.warn(f"outlines cache: a damaged job lease ({intent!r:.40}) in {self.file} is taken as expired",
                          CacheWarning, stacklevel=4)
            return Lease(intent, "", float("-inf"))
        return Lease(row[0], row[1], row[2])

    def _write_lease(self, connection: sqlite3.Connection, intent: str, now: float) -> Lease:
        lease = Lease(intent, self.holder, float(now) + self.lease)
        connection.execute("INSERT OR REPLACE INTO job_leases VALUES (?, ?, ?, ?)",
                           (intent, lease.holder, lease.expires, _lease_checksum(intent, lease.holder, lease.expires)))
        return lease

    def _one(self, connection: sqlite3.Connection, column: str, value: str) -> JobRecord | None:
        rows = connection.execute(f"SELECT intent, job_id, state, record, checksum FROM jobs WHERE {column} = ?",
                                  (value,)).fetchall()
        return next(iter(self._records(rows)), None)

    def _with_status(self, record: JobRecord, status: Status) -> JobRecord:
        if status.state not in _PROVIDER_STATES:
            raise LedgerError(f"unknown job state {status.state!r} for job {status.id} (intent {record.intent})")
        return self._replace(record, job_id=status.id, state=status.state, status=status.to_dict())

    def _replace(self, record: JobRecord, **changes: Any) -> JobRecord:
        data = {name: getattr(record, name) for name in record.__dataclass_fields__}
        data.update(changes, updated=self.clock())
        return JobRecord(**data)

    @staticmethod
    def _write(connection: sqlite3.Connection, record: JobRecord) -> None:
        blob = record.to_json()
        check = _job_checksum(record.intent, record.job_id, record.state, blob)
        connection.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?)",
                           (record.intent, record.job_id, record.state, blob, check))

    def _records(self, rows: Iterable[tuple[Any, ...]]) -> list[JobRecord]:
        out = []
        for intent, job_id, state, blob, check in rows:
            try:
                if type(blob) is not bytes or _job_checksum(intent, job_id, state, blob) != check:
                    raise ValueError("checksum")
                data = json.loads(blob)
                record = JobRecord(**data)
                if (record.intent, record.job_id, record.state) != (intent, job_id, state):
                    raise ValueError("columns")
            except (ValueError, TypeError, RecursionError):
                warnings.warn(f"outlines cache: a damaged job record ({intent!r:.40}) in {self.file} is skipped",
                              CacheWarning, stacklevel=3)
                continue
            out.append(record)
        return out

    def _line_rows(self, rows: Iterable[tuple[Any, ...]]) -> list[tuple[str, str, str, int]]:
        good, damaged = [], 0
        for key, intent, custom_id, sample, check in rows:
            if type(sample) is int and _line_checksum(key, intent, custom_id, sample) == check:
                good.append((key, intent, custom_id, sample))
            else:
                damaged += 1
        if damaged:
            warnings.warn(f"outlines cache: {damaged} damaged job line(s) in {self.file} are skipped",
                          CacheWarning, stacklevel=3)
        return good

    def _open(self) -> sqlite3.Connection:
        if self._pid != os.getpid():  # forked: the parent's connection is not ours to use
            self._pid, self._connection = os.getpid(), None
        if self._connection is None:
            connection = SQLiteStore(self.file, self.timeout).connect()
            try:
                # Each transition must outlive a power cut, not only a killed process.
                connection.execute("PRAGMA synchronous=FULL")
                connection.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    @contextlib.contextmanager
    def _locked(self, transaction: bool = False) -> Iterator[sqlite3.Connection]:
        """The connection under the lock, in one transaction: ``BEGIN IMMEDIATE`` for a transition.

        Reads are transactions too (``BEGIN``), so the several SELECTs of one
        lookup see one state of the file while other processes write.
        """
        with self._lock:
            connection = self._open()
            connection.execute("BEGIN IMMEDIATE" if transaction else "BEGIN")
            try:
                yield connection
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    # -- doubts settled by the provider ----------------------------------------------

    def adopt(
        self,
        *,
        provider: str,
        backend: Sequence[Any],
        run: str,
        lines: Iterable[tuple[str, Sequence[str]]],
        status: Status,
        metadata: Mapping[str, str],
    ) -> JobRecord:
        """Record a job the provider holds that this ledger lost (a damaged row, a deleted cache file).

        ``lines`` are the ``(custom_id, keys)`` of its requests that a run asks
        for; they are written (again). The record is the readable one holding
        the job, or of the intent its ``metadata`` names when that holds no
        other job (its status updated); else a new one, written over any
        damaged row of that intent.
        """
        pairs = [(str(custom_id), tuple(keys)) for custom_id, keys in lines]
        intent = str(metadata.get("outlines_intent") or "") or uuid.uuid4().hex
        now = self.clock()
        with self._locked(transaction=True) as connection:
            current = self._one(connection, "job_id", status.id) or self._one(connection, "intent", intent)
            if current is not None and current.job_id not in (None, status.id):
                intent, current = uuid.uuid4().hex, None
            if current is not None:
                intent = current.intent
            else:
                current = JobRecord(intent, str(provider), list(normalize(list(backend))), str(run), INTENT,
                                    requests=len(pairs), metadata=dict(metadata), created=now, updated=now)
            if current.state in _FINISHED and status.state not in _FINISHED:
                record = current  # a stale read never takes a finished job back
            else:  # a job closed by mistake (abandoned as never created) is open again
                record = self._with_status(self._replace(current, note=None) if not current.open else current,
                                           status)
            self._write(connection, record)
            connection.executemany("INSERT OR REPLACE INTO job_lines VALUES (?, ?, ?, ?, ?)", [
                (key, intent, custom_id, sample, _line_checksum(key, intent, custom_id, sample))
                for custom_id, keys in pairs for sample, key in enumerate(keys)])
        return record

    def forget(self, intent: str, reason: str) -> JobRecord:
        """Close a job whatever its state, saying why: its draws are asked again by the next run.

        For a job its owner knows is gone (deleted at the provider, or whose
        results cannot be read): unlike ``abandon``, a job the ledger last saw
        running is closed too.

        Raises
        ------
        LedgerError
            When the intent is unknown.
        """
        def change(record: JobRecord) -> JobRecord:
            if not record.open:
                return record
            return self._replace(record, state="abandoned", note=str(reason)[:2000])

        return self._change(intent, change)
