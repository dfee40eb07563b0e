"""One cache file as this process sees it: guarded reads, write-behind commits.

Every ``Cache`` on the same file in a process shares one ``Disk``. Lookups run
on the caller's thread. Writes leave it (the event loop) through
``WriteBehind``: a daemon thread commits what was queued, one transaction per
round, and everything queued is committed before the interpreter exits (Ctrl-C
included; a SIGKILL loses at most the last few milliseconds, never half an
entry). The queue holds completions as text and encodes them on the writer
thread, off the event loop. A lookup on a fresh file (empty when first seen,
written only by this process since: ``SQLiteStore.fresh``) sends only the keys
this process queued to SQLite; every other key is a miss without a query. A
failing file is never an exception: a locked one skips the operation with a
warning, a damaged one (unreadable, or with a table or column missing) is
moved aside and replaced, and a file of another format leaves the cache in
memory only.
"""
from __future__ import annotations

import atexit
import multiprocessing.util
import os
import sqlite3
import threading
import warnings
import weakref
from json.encoder import encode_basestring
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from outlines.cache.sqlite import CacheWarning, FormatMismatch, SQLiteStore

__all__ = ["Disk", "WriteBehind", "disk"]

_writers: weakref.WeakSet[WriteBehind] = weakref.WeakSet()
#: An idle writer thread ends after this many seconds (a new one starts on demand).
IDLE_SECONDS = 2.0
#: A fresh file stops being treated as fresh once this process has queued
#: more keys than this (the set of them is what answers its misses).
FRESH_KEYS = 4_000_000

Write = Callable[[list[tuple[bytes, bytes]], list[bytes], list[tuple[int, Any]], "int | None"], None]


class WriteBehind:
    """Rows queued by the caller and committed by a daemon thread, in order.

    A queued value is a ``str`` (encoded to JSON on the thread) or the JSON
    ``bytes`` of any other value (encoded by the caller, so a later change to
    a list or dict does not reach the file). ``write(rows, touched, damaged,
    max_bytes)`` runs on the thread with everything queued since its last
    call, encoded; each ``submit`` stays whole inside one call, so each stays
    atomic. It must not raise.
    """

    def __init__(self, write: Write) -> None:
        self._write = write
        self._reset()
        _writers.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._condition = threading.Condition()
        self._rows: dict[bytes, str | bytes] = {}
        self._touched: dict[bytes, None] = {}
        self._damaged: list[tuple[int, Any]] = []
        self._max_bytes: int | None = None
        self._writing = False
        self._thread: threading.Thread | None = None

    def submit(
        self,
        rows: Iterable[tuple[bytes, str | bytes]] = (),
        touched: Iterable[bytes] = (),
        damaged: Iterable[Any] = (),
        max_bytes: int | None = None,
    ) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread writes the parent's rows
            self._reset()
        with self._condition:
            self._rows.update(rows)
            self._touched.update(dict.fromkeys(touched))
            self._damaged.extend(damaged)
            self._max_bytes = max_bytes
            if self._thread is None:
                _hook_exit()
                self._thread = threading.Thread(target=self._run, name="outlines-cache-writer", daemon=True)
                self._thread.start()
            if not self._writing:  # a busy writer takes the rest when its commit ends
                self._condition.notify_all()

    def pending(self, keys: Iterable[bytes]) -> dict[bytes, str | bytes]:
        """The queued values (text, or JSON bytes) of those ``keys`` not committed yet."""
        rows = self._rows
        if not rows:
            return {}
        get = rows.get
        return {key: value for key in keys if (value := get(key)) is not None}

    def flush(self) -> None:
        """Wait until everything submitted so far is committed (or given up)."""
        if self._pid != os.getpid():
            return
        with self._condition:
            while self._rows or self._touched or self._damaged or self._writing:
                self._condition.wait()

    def _run(self) -> None:
        condition = self._condition
        while True:
            with condition:
                if not (self._rows or self._touched or self._damaged):
                    condition.wait(IDLE_SECONDS)
                if not (self._rows or self._touched or self._damaged):
                    self._thread = None  # idle: end, so nothing is kept alive for nothing
                    return
                queued, touched, damaged = list(self._rows.items()), list(self._touched), self._damaged
                self._writing, self._touched, self._damaged = True, {}, []
            try:
                escape = encode_basestring  # encode() of text, without a call per row
                rows = [(key, escape(value).encode("utf-8", "surrogatepass") if type(value) is str else value)
                        for key, value in queued]
                self._write(rows, touched, damaged, self._max_bytes)  # type: ignore[arg-type]
            except Exception as exc:  # noqa: BLE001 - a writer that dies would hang flush()
                warnings.warn(f"outlines cache: write failed ({exc!r})", CacheWarning, stacklevel=1)
            finally:
                with condition:
                    rows_left = self._rows
                    for key, value in queued:
                        if rows_left.get(key) is value:
                            del rows_left[key]
                    self._writing = False
                    condition.notify_all()


@atexit.register
def _flush_all() -> None:
    for writer in list(_writers):
        writer.flush()


_hooked_pid: int | None = None


def _hook_exit() -> None:
    """Also flush in multiprocessing children, which leave through os._exit (no atexit)."""
    global _hooked_pid
    if _hooked_pid != os.getpid():
        _hooked_pid = os.getpid()
        multiprocessing.util.Finalize(None, _flush_all, exitpriority=10)


def _after_fork() -> None:
    global _disks_lock
    _disks_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


class Disk:
    """The store and the writer of one file, with the policy for its failures."""

    def __init__(self, file: Path, timeout: float) -> None:
        self.file = file
        self.store: SQLiteStore | None = SQLiteStore(file, timeout)
        self.writer = WriteBehind(self._write)
        # Keys this process queued while the file is fresh: the only ones it can hold.
        self._queued: set[bytes] | None = set()

    def get_many(self, keys: Sequence[bytes]) -> tuple[dict[bytes, Any], list[tuple[int, Any]]]:
        """Committed values found, and damaged rows (already queued for deletion)."""
        store = self.store
        if store is None:
            return {}, []
        queued = self._queued
        if queued is not None:
            if self.guard("read", store.fresh, default=False):
                keys = [key for key in keys if key in queued]
                if not keys:
                    return {}, []
            else:
                self._queued = None  # shared with another writer: every key may be there
        found, damaged = self.guard("read", store.get_many, keys, default=({}, []))
        if damaged:
            self.writer.submit(damaged=damaged)
        return found, damaged

    def submit(self, rows: Sequence[tuple[bytes, str | bytes]], touched: Iterable[bytes], max_bytes: int | None) -> None:
        if self.store is not None:
            queued = self._queued
            if queued is not None:
                queued.update(map(itemgetter(0), rows))
                if len(queued) > FRESH_KEYS:
                    self._queued = None
            self.writer.submit(rows, touched, (), max_bytes)

    def _write(self, rows: list[tuple[bytes, bytes]], touched: list[bytes], damaged: list[Any], max_bytes: int | None) -> None:
        store = self.store
        if store is not None:
            self.guard("write", store.put_many, rows, touched, max_bytes, damaged)

    def totals(self) -> tuple[int, int] | None:
        self.writer.flush()
        store = self.store
        return None if store is None else self.guard("stats", store.totals, default=None)

    def clear(self) -> None:
        self.writer.flush()
        if self.store is not None:
            self.guard("clear", self.store.clear)

    def close(self) -> None:
        self.writer.flush()
        if self.store is not None:
            self.store.close()

    def guard(self, what: str, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        """Run a store call; on failure warn, and replace a damaged file."""
        try:
            return fn(*args)
        except FormatMismatch as exc:
            self._give_up(f"{self.file} has another cache format {exc}; using memory only")
        except sqlite3.OperationalError as exc:
            if str(exc).startswith(("no such table", "no such column")):  # the schema broke under us
                self._recover(what, exc)
                return default
            warnings.warn(f"outlines cache: {what} skipped ({exc}) in {self.file}", CacheWarning, stacklevel=3)
        except sqlite3.DatabaseError as exc:
            self._recover(what, exc)
        except (OSError, sqlite3.Error) as exc:
            self._give_up(f"cannot use {self.file} ({exc}); using memory only")
        return default

    def _recover(self, what: str, exc: BaseException) -> None:
        store = self.store
        if store is None:
            return
        try:
            moved = store.quarantine()
            self._queued = set()  # the new file starts empty
        except (OSError, sqlite3.Error) as again:
            self._give_up(f"{self.file} is damaged ({exc}) and cannot be replaced ({again}); using memory only")
            return
        warnings.warn(
            f"outlines cache: {self.file} is damaged ({exc}) during {what}; moved it to {moved} "
            "and started a fresh one",
            CacheWarning,
            stacklevel=4,
        )

    def _give_up(self, message: str) -> None:
        warnings.warn(f"outlines cache: {message}", CacheWarning, stacklevel=4)
        store, self.store = self.store, None
        if store is not None:
            store.disabled = True
            store.close()


_disks: weakref.WeakValueDictionary[tuple[str, float], Disk] = weakref.WeakValueDictionary()
_disks_lock = threading.Lock()


def disk(file: Path, timeout: float) -> Disk:
    """The process's ``Disk`` for ``file`` (one per file and timeout)."""
    with _disks_lock:
        found = _disks.get((str(file), timeout))
        if found is None or found.store is None:  # one that gave up may try again
            found = _disks[(str(file), timeout)] = Disk(file, timeout)
        return found
