"""One cache file as this process sees it: guarded reads, write-behind commits.

Every ``Cache`` on the same file in a process shares one ``Disk`` (``disk``: by
resolved path, so read-your-writes holds however the path is spelled). Lookups run
on the caller's thread. Writes leave it (the event loop) through
``WriteBehind``: a daemon thread commits what was queued, one transaction per
round, and everything queued is committed before the interpreter exits (Ctrl-C
included; a SIGKILL loses at most the last few milliseconds, never half an
entry). The queue holds completions as text and encodes them on the writer
thread, off the event loop; a ``Block`` of draws has its keys hashed there
too, a chunk at a time, and the thread waits while an event loop marked
``FOREGROUND`` is busy (``outlines.common.threads``). A lookup on a fresh file (empty when first seen,
written only by this process since: ``SQLiteStore.fresh``) sends only the keys
this process queued to SQLite; every other key is a miss without a query. A
failing file is never an exception: a locked one skips the operation with a
warning, a damaged one (unreadable, or with a table or column missing) is
moved aside and replaced, and a file of another format leaves the cache in
memory only. Only a file the cache made (``made_by_cache``) is ever used or
moved: a cache path naming anyone else's file is a ``NotACacheFile`` error.
"""
from __future__ import annotations

import atexit
import json
import multiprocessing.util
import os
import sqlite3
import threading
import warnings
import weakref
from json.encoder import encode_basestring
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from outlines.cache.keys import SlotKey, prompt_keys
from outlines.cache.sqlite import FORMAT, FormatMismatch, NotACacheFile, SQLiteStore, holds_cache
from outlines.common.errors import CacheWarning
from outlines.common.threads import FOREGROUND

__all__ = ["Block", "Disk", "WriteBehind", "disk", "flush_all"]

_writers: weakref.WeakSet[WriteBehind] = weakref.WeakSet()
#: An idle writer thread ends after this many seconds (a new one starts on demand).
IDLE_SECONDS = 2.0
#: A fresh file stops being treated as fresh once this process has queued
#: more keys than this (the set of them is what answers its misses).
FRESH_KEYS = 4_000_000

Write = Callable[[Iterable[tuple[bytes, bytes]], list[bytes], list[tuple[int, Any]], "int | None"], None]


#: Keys a writer hashes between two looks at ``FOREGROUND``.
HASH_CHUNK = 2048


class Block:
    """Draws of one slot stored by one ``submit``: prompts and their texts, keys not hashed yet.

    The writer thread hashes the keys (``prompt_keys``), off the event loop;
    until the block is committed, lookups find its texts by prompt.
    """

    __slots__ = ("slot", "hasher", "number", "prompts", "values", "_table")

    def __init__(self, slot: SlotKey, hasher: Any, number: int, prompts: list[Any], values: list[str]) -> None:
        self.slot, self.hasher, self.number = slot, hasher, number
        self.prompts, self.values = prompts, values
        self._table: dict[Any, str] | None = None

    def table(self) -> dict[Any, str]:
        """Prompt -> text (built on first use: lookups rarely reach a block)."""
        if self._table is None:
            self._table = dict(zip(self.prompts, self.values))
        return self._table

    def rows(self) -> Iterator[tuple[bytes, bytes]]:
        """``(key, JSON bytes)`` of each draw, made a chunk at a time between the loops' bursts."""
        prompts, values = self.prompts, self.values
        escape = encode_basestring
        for start in range(0, len(prompts), HASH_CHUNK):
            FOREGROUND.wait()
            end = start + HASH_CHUNK
            keys = prompt_keys(self.hasher, self.number, prompts[start:end])
            yield from zip(keys, [escape(value).encode("utf-8", "surrogatepass") for value in values[start:end]])


class WriteBehind:
    """Rows and blocks queued by the caller and committed by a daemon thread, in order.

    A queued value is a ``str`` (encoded to JSON on the thread) or the JSON
    ``bytes`` of any other value (encoded by the caller, so a later change to
    a list or dict does not reach the file). A ``Block`` holds draws whose
    keys the thread hashes. ``write(rows, touched, damaged, max_bytes)`` runs
    on the thread with everything queued since its last call, encoded; each
    ``submit`` stays whole inside one call, so each stays atomic. It must not
    raise. ``committed(blocks)`` is called after the blocks' rows are written.
    """

    def __init__(self, write: Write, committed: Callable[[list[Block]], None] | None = None) -> None:
        self._write = write
        self._committed = committed
        self._reset()
        _writers.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._condition = threading.Condition()
        self._rows: dict[bytes, str | bytes] = {}
        self._blocks: list[Block] = []
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
        blocks: Iterable[Block] = (),
    ) -> None:
        if self._pid != os.getpid():  # forked: the parent's thread writes the parent's rows
            self._reset()
        with self._condition:
            self._rows.update(rows)
            self._blocks.extend(blocks)
            self._touched.update(dict.fromkeys(touched))
            self._damaged.extend(damaged)
            self._max_bytes = max_bytes
            if self._thread is None:
                _hook_exit()
                self._thread = threading.Thread(target=self._run, name="outlines-cache-writer", daemon=True)
                self._thread.start()
            if not self._writing:  # a busy writer takes the rest when its commit ends
                self._condition.notify_all()

    def _queued(self) -> bool:
        return bool(self._rows or self._blocks or self._touched or self._damaged)

    def pending(self, keys: Iterable[bytes]) -> dict[bytes, str | bytes]:
        """The queued values (text, or JSON bytes) of those ``keys`` not committed yet (rows, not blocks)."""
        rows = self._rows
        if not rows:
            return {}
        get = rows.get
        return {key: value for key in keys if (value := get(key)) is not None}

    def blocks_by_slot(self) -> dict[SlotKey, list[Block]]:
        """The blocks queued and not committed yet, by slot (a copy: the thread may drop some)."""
        found: dict[SlotKey, list[Block]] = {}
        for block in list(self._blocks):
            found.setdefault(block.slot, []).append(block)
        return found

    @property
    def has_blocks(self) -> bool:
        """Whether blocks are queued (their keys are not known yet)."""
        return bool(self._blocks)

    def flush(self) -> None:
        """Wait until everything submitted so far is committed (or given up)."""
        if self._pid != os.getpid():
            return
        with self._condition:
            while self._queued() or self._writing:
                self._condition.wait()

    def _run(self) -> None:
        condition = self._condition
        while True:
            with condition:
                if not self._queued():
                    condition.wait(IDLE_SECONDS)
                if not self._queued():
                    self._thread = None  # idle: end, so nothing is kept alive for nothing
                    return
                queued, touched, damaged = list(self._rows.items()), list(self._touched), self._damaged
                blocks = list(self._blocks)
                self._writing, self._touched, self._damaged = True, {}, []
            try:
                escape = encode_basestring  # encode() of text, without a call per row
                encoded = [(key, escape(value).encode("utf-8", "surrogatepass") if isinstance(value, str) else value)
                           for key, value in queued]
                # Keyed rows, then the blocks' rows, streamed in chunks; a later value of a key wins.
                rows = chain(encoded, *(block.rows() for block in blocks)) if blocks else encoded
                self._write(rows, touched, damaged, self._max_bytes)
                if blocks and self._committed is not None:
                    self._committed(blocks)
            except Exception as exc:  # noqa: BLE001 - a writer that dies would hang flush()
                warnings.warn(f"outlines cache: write failed ({exc!r})", CacheWarning, stacklevel=1)
            finally:
                with condition:
                    rows_left = self._rows
                    for key, value in queued:
                        if rows_left.get(key) is value:
                            del rows_left[key]
                    if blocks:
                        done = set(map(id, blocks))
                        self._blocks = [b for b in self._blocks if id(b) not in done]
                    self._writing = False
                    condition.notify_all()


@atexit.register
def flush_all() -> None:
    """Wait until every writer of this process has committed what was queued (at exit, and after SIGTERM)."""
    for writer in list(_writers):
        writer.flush()


_hooked_pid: int | None = None


def _hook_exit() -> None:
    """Also flush in multiprocessing children, which leave through os._exit (no atexit)."""
    global _hooked_pid
    if _hooked_pid != os.getpid():
        _hooked_pid = os.getpid()
        multiprocessing.util.Finalize(None, flush_all, exitpriority=10)


def _after_fork() -> None:
    global _disks_lock
    _disks_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def made_by_cache(file: Path) -> bool:
    """Whether the cache may use, and when damaged move aside, ``file``: a file it made.

    That is a file under the cache's own name (``draws-v<FORMAT>.sqlite3``,
    whatever it now holds), one holding the cache's ``meta`` table, or an
    empty file named like a database (SQLite writes nothing until its first
    commit). Anything else is someone else's file.
    """
    if file.name == f"draws-v{FORMAT}.sqlite3":
        return True
    try:
        empty = file.stat().st_size == 0
    except OSError:
        return False
    return (empty and file.suffix in (".sqlite3", ".sqlite", ".db")) or holds_cache(file)


class Disk:
    """The store and the writer of one file, with the policy for its failures.

    Raises
    ------
    NotACacheFile
        When ``file`` exists and the cache did not make it (``made_by_cache``).
    """

    def __init__(self, file: Path, timeout: float) -> None:
        if file.exists() and not made_by_cache(file):
            raise NotACacheFile(
                f"{file} exists and is not an outlines cache file; the cache does not use, move or write a file "
                "it did not make: give the cache a directory (OUTLINES_CACHE_DIR names one) or a new .sqlite3 path"
            )
        self.file = file
        self.store: SQLiteStore | None = SQLiteStore(file, timeout)
        self.writer = WriteBehind(self._write, self._blocks_committed)
        # What this process queued while the file is fresh: the only draws it can hold.
        # Keys queued as rows; prompts of committed blocks, by slot (as sets on first use).
        self._queued: set[bytes] | None = set()
        self._committed: dict[SlotKey, list[list[Any]]] = {}
        self._committed_sets: dict[SlotKey, set[Any]] = {}
        self._committed_count = 0
        self._fresh_lock = threading.Lock()
        #: ids of the ``Cache`` objects that stored blocks here (see ``get_draws``' ``sole``).
        self.block_writers: set[int] = set()

    def read(self, keys: Sequence[bytes]) -> tuple[dict[bytes, Any], list[tuple[int, Any]]]:
        """The values of ``keys`` queued or committed, and damaged rows (already queued for deletion)."""
        found: dict[bytes, Any] = {}
        for key, value in self.writer.pending(keys).items():
            found[key] = value if type(value) is str else json.loads(value)
        rest = [key for key in keys if key not in found] if found else keys
        store = self.store
        if store is None or not rest:
            return found, []
        queued = self._fresh_queue(store)
        if queued is not None:
            if self.block_writers:  # blocks' keys are hashed on the writer: commit them, read them all
                self.writer.flush()
            else:
                rest = [key for key in rest if key in queued]
                if not rest:
                    return found, []
        stored, damaged = self._read(rest)
        found.update(stored)
        return found, damaged

    def _fresh_queue(self, store: SQLiteStore) -> set[bytes] | None:
        """The keys this process queued, while the file is fresh (only they can be there); else ``None``."""
        queued = self._queued
        if queued is not None and not self.guard("read", store.fresh, default=False):
            queued = self._queued = None  # shared with another writer: every key may be there
        return queued

    def _read(self, keys: Sequence[bytes]) -> tuple[dict[bytes, Any], list[tuple[int, Any]]]:
        store = self.store
        if store is None or not keys:
            return {}, []
        found, damaged = self.guard("read", store.read, keys, default=({}, []))
        if damaged:
            self.writer.submit(damaged=damaged)
        return found, damaged

    def get_draws(
        self, wanted: Sequence[tuple[SlotKey, Any, int, Sequence[Any]]], *, sole: bool
    ) -> tuple[list[dict[Any, Any]], list[tuple[int, Any]]]:
        """The values of the draws ``wanted`` (queued or committed), and damaged rows: one lookup for all.

        ``wanted`` lists ``(slot, hasher, number, prompts)`` per slot; the
        result holds a dict prompt -> value for each, in order. The file's
        freshness is looked at once, and the keys of every slot go to SQLite
        together (a stacked loop's batch spans one slot per element).
        ``sole``: the caller's memory holds every draw this process stored in
        blocks (it stored them all and evicted none). On a fresh file such a
        caller's misses are misses without a key hashed or a query sent; other
        callers send only the draws this process queued. Blocks not committed
        yet are read by prompt; the rest by key.
        """
        writer, store = self.writer, self.store
        # A sole caller's memory holds the blocks not committed yet too.
        blocks = writer.blocks_by_slot() if writer.has_blocks and not sole else None
        founds: list[dict[Any, Any]] = []
        keys: list[bytes] = []
        owners: list[tuple[int, Any]] = []  # per key: (its slot's place in ``wanted``, its prompt)
        queued: set[bytes] | None = None
        looked = False
        for slot, hasher, number, prompts in wanted:
            found: dict[Any, Any] = {}
            founds.append(found)
            for block in blocks.get(slot, ()) if blocks else ():
                table = block.table()
                found.update((p, table[p]) for p in prompts if p in table)
            rest = [p for p in prompts if p not in found] if found else list(prompts)
            if not rest or store is None:
                continue
            if not looked:
                queued, looked = self._fresh_queue(store), True
            if queued is not None:
                if sole and not queued:
                    continue
                # A block leaves the writer's queue only after its prompts are here.
                committed = self._committed_set(slot)
                candidates = [p for p in rest if p in committed] if committed else []
                if queued:
                    more = [p for p, key in zip(rest, prompt_keys(hasher, number, rest)) if key in queued]
                    candidates = list(dict.fromkeys(candidates + more))
                rest = candidates
                if not rest:
                    continue
            keys.extend(prompt_keys(hasher, number, rest))
            owners.extend((len(founds) - 1, prompt) for prompt in rest)
        if not keys:
            return founds, []
        where = dict(zip(keys, owners))
        queued_rows = writer.pending(keys)
        for key, value in queued_rows.items():
            at, prompt = where[key]
            founds[at][prompt] = value if type(value) is str else json.loads(value)
        stored, damaged = self._read([key for key in keys if key not in queued_rows] if queued_rows else keys)
        for key, value in stored.items():
            at, prompt = where[key]
            founds[at][prompt] = value
        return founds, damaged

    def _committed_set(self, slot: SlotKey) -> set[Any]:
        with self._fresh_lock:
            found = self._committed_sets.get(slot)
            if found is None:
                found = self._committed_sets[slot] = set().union(*self._committed.get(slot, ()))
            return found

    def _blocks_committed(self, blocks: list[Block]) -> None:
        """On the writer thread, after the rows of ``blocks`` are written: note their prompts."""
        with self._fresh_lock:
            if self._queued is None:
                return
            for block in blocks:
                self._committed.setdefault(block.slot, []).append(block.prompts)
                self._committed_sets.pop(block.slot, None)
                self._committed_count += len(block.prompts)
            if self._committed_count > FRESH_KEYS:
                self._queued = None

    def submit_blocks(self, blocks: list[Block], writer: int, max_bytes: int | None) -> None:
        """Queue ``blocks`` (from the ``Cache`` whose id is ``writer``)."""
        if self.store is not None and blocks:
            self.block_writers.add(writer)
            self.writer.submit(blocks=blocks, max_bytes=max_bytes)

    def submit(self, rows: Sequence[tuple[bytes, str | bytes]], touched: Iterable[bytes], max_bytes: int | None) -> None:
        if self.store is not None:
            queued = self._queued
            if queued is not None:
                queued.update(map(itemgetter(0), rows))
                if len(queued) > FRESH_KEYS:
                    self._queued = None
            self.writer.submit(rows, touched, (), max_bytes)

    def _write(
        self, rows: Iterable[tuple[bytes, bytes]], touched: list[bytes], damaged: list[Any], max_bytes: int | None
    ) -> None:
        store = self.store
        if store is not None:
            self.guard("write", store.write, rows, touched, max_bytes, damaged, FOREGROUND.wait)

    def totals(self) -> tuple[int, int] | None:
        self.writer.flush()
        store = self.store
        return None if store is None else self.guard("stats", store.totals, default=None)

    def clear(self) -> None:
        self.writer.flush()
        if self.store is not None:
            self.guard("clear", self.store.clear)
            self._forget()

    def _forget(self) -> None:
        """The file is empty again: what this process queued is gone from it."""
        with self._fresh_lock:
            self._queued, self._committed, self._committed_sets, self._committed_count = set(), {}, {}, 0

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
        if not made_by_cache(self.file):  # replaced under us by a file that is not a cache: not ours to move
            self._give_up(f"{self.file} is not readable as a cache ({exc}) and the cache did not make it: "
                          "left as it is; using memory only")
            return
        try:
            moved = store.quarantine()
            self._forget()  # the new file starts empty
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


_disks: weakref.WeakValueDictionary[str, Disk] = weakref.WeakValueDictionary()
_disks_lock = threading.Lock()


def disk(file: Path, timeout: float) -> Disk:
    """The process's ``Disk`` for ``file``: one per resolved file, however the path is spelled.

    ``d/sub/..``, a symlink or the file itself all reach the same writer, so
    every ``Cache`` on the file reads what another one queued. The file waits
    for other processes' locks as long as the longest ``timeout`` asked.
    """
    resolved = os.path.realpath(file)
    with _disks_lock:
        found = _disks.get(resolved)
        if found is None or found.store is None:  # one that gave up may try again
            found = _disks[resolved] = Disk(Path(resolved), timeout)
        elif timeout > found.store.timeout:
            found.store.timeout = timeout
        return found
