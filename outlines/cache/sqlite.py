"""The on-disk half of the draw cache: one SQLite file in WAL mode.

Each row holds a draw's key, its value as JSON bytes, a checksum over key and
value, its size and a last-use stamp (for least-recently-used eviction). The
table is keyed by an INTEGER PRIMARY KEY: the first 8 bytes of the 16-byte
draw key, so each row lives in the one B-tree SQLite keeps anyway, found by
integer comparisons, and writes insert sorted runs of it. The checksum binds
the whole key, so two keys that share those 8 bytes read as a miss, never as
each other's value. Every write is one transaction, so a crash or a kill
leaves each entry absent or whole, and several processes may read and write
at once. Values are only ever decoded as JSON after their checksum verifies:
nothing in the file can run code, and a damaged row is reported as corrupt,
never raised. Reads and writes use separate connections, so a lookup never
waits for a commit made on another thread.
"""
from __future__ import annotations

import functools
import json
import os
import sqlite3
import threading
import time
import weakref
import zlib
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

#: The C string scanner json's decoder uses (typeshed leaves it out): a JSON string at C speed.
scanstring: Callable[[str, int], tuple[str, int]] = getattr(json.decoder, "scanstring")

__all__ = [
    "FORMAT", "KEY_BYTES", "FormatMismatch", "NotACacheFile", "SQLiteStore", "SchemaError", "checksum", "decode",
    "encode", "holds_cache", "row_ids",
]

#: Bumped on any change to keys or rows; the file name carries it, so a new
#: format never reads an old file (and never returns a wrong value).
#: 2: 16-byte BLAKE2b keys, rows keyed by their first 8 bytes, CRC-32 checksums.
FORMAT = 2

#: Bytes in a draw key (``outlines.cache.keys.draw_key``).
KEY_BYTES = 16

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key INTEGER PRIMARY KEY NOT NULL,
    value BLOB NOT NULL,
    checksum INTEGER NOT NULL,
    size INTEGER NOT NULL,
    used INTEGER NOT NULL
);
"""

#: Rows per INSERT and keys per SELECT. One statement step covers a whole
#: chunk, and Python's sqlite3 releases the GIL around each step: the SQLite
#: work of a chunk runs beside the event loop instead of trading the GIL with
#: it row by row. Sizes are powers of two so few SQL texts exist. A multi-row
#: INSERT compiles in time that grows faster than its rows (4,096 rows: 0.65 s
#: once per connection; 512: about 0.02 s), so inserts stay at 512.
_ROWS = 512
_CHUNK = 4096
#: Rows prepared (sorted, checksummed) at a time: the GIL is held for one
#: chunk's preparation, never for a whole 100,000-row write.
_PREPARED = 2048
#: Bytes a row costs beyond its value (key, checksum, size, stamp), for ``size``.
_ROW_OVERHEAD = 32

class FormatMismatch(RuntimeError):
    """The file was written by another cache format."""


class NotACacheFile(ValueError):
    """A cache path names an existing file the cache did not make; it is left as it is."""


class SchemaError(sqlite3.DatabaseError):
    """The file's tables are not the cache's (one is missing or lacks a column): a damaged file."""


#: The columns each table must have; checked whenever a file is opened.
_COLUMNS = {"meta": ("name", "value"), "entries": ("key", "value", "checksum", "size", "used")}


#: The first bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def holds_cache(file: Path) -> bool:
    """Whether ``file`` is a SQLite database with this cache's ``meta`` table (of any format).

    Read without writing anything: the header first, and only a SQLite file
    is opened, read-only.
    """
    try:
        with open(file, "rb") as handle:
            if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                return False
        connection = sqlite3.connect(f"{Path(file).absolute().as_uri()}?mode=ro", uri=True)
        try:
            return connection.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() is not None
        finally:
            connection.close()
    except (OSError, sqlite3.Error):
        return False


def row_ids(keys: Sequence[bytes]) -> list[int]:
    """The row of each key: its first 8 bytes, big-endian, less 2**63 (a signed 64-bit integer).

    The order of rows is the order of the keys' bytes.

    Raises
    ------
    TypeError
        When a key is not ``KEY_BYTES`` bytes (keys come from ``draw_key``).
    """
    ids: list[int] = _row_array(keys).tolist()
    return ids


def _row_array(keys: Sequence[bytes]) -> Any:
    joined = b"".join(keys) if all(type(k) is bytes for k in keys) else b""
    if len(joined) != KEY_BYTES * len(keys):
        bad = next((k for k in keys if type(k) is not bytes or len(k) != KEY_BYTES), None)
        raise TypeError(f"cache keys are {KEY_BYTES}-byte digests from draw_key, got {bad!r:.60}")
    # Flipping the top bit of the unsigned number is subtracting 2**63.
    return np.frombuffer(joined, dtype=">i8")[::2] ^ np.int64(-(2**63))


def checksum(key: bytes, blob: bytes) -> int:
    """A CRC-32 binding ``blob`` to the whole ``key`` (a moved row fails it too).

    The file is trusted no more than any unkeyed hash could make it (whoever
    can write it can recompute one), so this only has to catch accidents:
    bit flips, torn or truncated values, rows moved between keys.
    """
    return zlib.crc32(blob, zlib.crc32(key))


def encode(value: Any) -> bytes:
    """``value`` as JSON bytes; raises ``TypeError``/``ValueError`` when it is not JSON."""
    if type(value) is str:  # completions: the C encoder, without building a JSONEncoder
        return encode_basestring(value).encode("utf-8", "surrogatepass")
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


_INVALID = object()


def decode(key: bytes, blob: Any, check: Any) -> Any:
    """The value of a row, or ``_INVALID`` when it does not verify."""
    if type(blob) is not bytes or type(check) is not int or checksum(key, blob) != check:
        return _INVALID
    try:
        text = blob.decode("utf-8", "surrogatepass")
        if text[:1] == '"':  # a completion: the C string scanner, without json.loads' layers
            value, end = scanstring(text, 1)
            if end == len(text):
                return value
        return json.loads(text)
    except Exception:  # noqa: BLE001 - deep nesting raises RecursionError: any failure is a miss
        return _INVALID


def _power_of_two(limit: int) -> int:
    """The largest power of two not above ``limit`` (at least 1)."""
    size = 1
    while size * 2 <= limit:
        size *= 2
    return size


def _padded(items: Sequence[Any]) -> list[Any]:
    """``items`` repeated at the end up to a power of two, so few SQL texts exist."""
    size = 1
    while size < len(items):
        size *= 2
    return list(items) + [items[-1]] * (size - len(items))


@functools.lru_cache(maxsize=None)
def _insert_sql(rows: int) -> str:
    # ?1 is the stamp shared by every row; each row binds its key, value, checksum.
    values = ",".join(
        f"(?{3 * i + 2},?{3 * i + 3},?{3 * i + 4},length(?{3 * i + 3})+{_ROW_OVERHEAD},?1)" for i in range(rows)
    )
    return f"INSERT OR REPLACE INTO entries (key, value, checksum, size, used) VALUES {values}"


_stores: weakref.WeakSet[SQLiteStore] = weakref.WeakSet()
_held: list[threading.RLock] = []


def _before_fork() -> None:
    # A thread inside SQLite at the fork would leave its global mutexes (memory,
    # VFS) locked in the child, whose first connection then hangs: wait until no
    # store of this process is inside SQLite, and keep them out until the fork is done.
    for store in list(_stores):
        if store._pid == os.getpid():
            for role in ("read", "write"):  # the order close() and quarantine() take them in
                lock = store._locks[role]
                lock.acquire()
                _held.append(lock)


def _after_fork_in_parent() -> None:
    while _held:
        _held.pop().release()


def _after_fork_in_child() -> None:
    _held.clear()  # the child's stores make new locks (SQLiteStore._lock)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class SQLiteStore:
    """One SQLite file, with a connection for reads and one for writes.

    Each connection has its own lock, so the methods are thread-safe. They raise
    ``sqlite3.Error``; the caller decides how to degrade.

    ``fresh()`` says whether every row of the file came from this store: the
    file had no entries when it first looked, and no other connection (another
    process, or another store on the file) has committed since. The write
    connection's ``PRAGMA data_version`` changes exactly when another
    connection commits, and only the writer writes here, so it tells.
    """

    def __init__(self, file: Path, timeout: float = 30.0) -> None:
        self.file = file
        self.timeout = timeout
        self.disabled = False
        self._estimate: int | None = None  # bytes of entries, for max_bytes
        self._connections: dict[str, sqlite3.Connection] = {}
        self._waits: dict[str, float] = {}  # role -> the timeout its connection waits
        self._locks = {"read": threading.RLock(), "write": threading.RLock()}
        self._setup = threading.Lock()  # one connection at a time sets a new file up
        self._pid = os.getpid()
        _stores.add(self)
        self._fresh: bool | None = None  # None: not looked yet
        self._rows, self._chunk = _ROWS, _CHUNK  # per statement, lowered to what the SQLite build binds
        self._version = 0  # the write connection's data_version when it looked

    def _lock(self, role: str) -> Any:
        if self._pid != os.getpid():
            # Connections (and locks) inherited through fork must not be used here;
            # the parent's writer still writes, so the file is shared from now on.
            self._pid, self._connections = os.getpid(), {}
            self._locks = {"read": threading.RLock(), "write": threading.RLock()}
            self._setup = threading.Lock()
            self._fresh = False
        return self._locks[role]

    def fresh(self) -> bool:
        """Whether only this store has written the file since it was empty (see the class)."""
        lock = self._lock("write")
        if self._fresh is False:
            return False
        if not lock.acquire(blocking=False):
            return bool(self._fresh)  # the writer is committing; it looks again when done
        try:
            self._look(self._connection("write"))
        finally:
            lock.release()
        return bool(self._fresh)

    def _look(self, connection: sqlite3.Connection) -> None:
        # Called with the write lock held. The version is read before the
        # emptiness, so a commit made in between shows as a changed version.
        (version,) = connection.execute("PRAGMA data_version").fetchone()
        if self._fresh is None:
            self._version = version
            self._fresh = connection.execute("SELECT 1 FROM entries LIMIT 1").fetchone() is None
        elif self._fresh and version != self._version:
            self._fresh = False

    def _connection(self, role: str) -> sqlite3.Connection:
        if self.disabled:
            raise sqlite3.OperationalError("the cache file was given up")
        connection = self._connections.get(role)
        if connection is None:
            with self._setup:
                connection = self._connections[role] = self._open_retrying()
            self._waits[role] = self.timeout
            # Older SQLite builds bind at most 999 parameters per statement.
            variables = connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
            self._rows, self._chunk = _power_of_two(min(_ROWS, (variables - 1) // 3)), _power_of_two(min(_CHUNK, variables))
        elif self._waits.get(role) != self.timeout:  # a longer timeout asked since it opened
            connection.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            self._waits[role] = self.timeout
        return connection

    def connect(self) -> sqlite3.Connection:
        """A new connection of the caller's own to the file, opened (and a new file set up) like the store's.

        For other tables of the same file (``outlines.cache.ledger``); the
        caller closes it.
        """
        with self._setup:
            return self._open_retrying()

    def _open_retrying(self) -> sqlite3.Connection:
        # Setting a new file up (WAL mode, tables) can fail with "database is
        # locked" at once, without SQLite's busy wait, while another process
        # sets it up too: retry until the timeout.
        deadline = time.monotonic() + self.timeout
        pause = 0.001
        while True:
            try:
                return self._open()
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _open(self) -> sqlite3.Connection:
        self.file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        created = not self.file.exists()
        connection = sqlite3.connect(
            str(self.file), timeout=self.timeout, isolation_level=None, check_same_thread=False
        )
        try:
            if created:
                os.chmod(self.file, 0o600)
            connection.execute("PRAGMA synchronous=NORMAL")
            if not self._ready(connection):  # only a new file needs the write lock here
                connection.execute("PRAGMA journal_mode=WAL")
                connection.executescript(f"BEGIN IMMEDIATE;{_SCHEMA}COMMIT;")
                self._check_format(connection)
            self._check_schema(connection)
        except BaseException:
            connection.close()
            raise
        return connection

    @staticmethod
    def _ready(connection: sqlite3.Connection) -> bool:
        try:
            row = connection.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return False
            raise
        if row is not None and row[0] != str(FORMAT):
            raise FormatMismatch(f"{row[0]!r} (this version reads format {FORMAT})")
        return row is not None and connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    @staticmethod
    def _check_schema(connection: sqlite3.Connection) -> None:
        for table, columns in _COLUMNS.items():
            found = {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}
            if not found:
                raise SchemaError(f"table {table!r} is missing")
            lacking = [c for c in columns if c not in found]
            if lacking:
                raise SchemaError(f"table {table!r} lacks column(s) {', '.join(lacking)}")

    @staticmethod
    def _check_format(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT OR IGNORE INTO meta VALUES ('format', ?)", (str(FORMAT),))
        (found,) = connection.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
        if found != str(FORMAT):
            raise FormatMismatch(f"{found!r} (this version reads format {FORMAT})")

    def read(self, keys: Sequence[bytes]) -> tuple[dict[bytes, Any], list[tuple[int, Any]]]:
        """Verified values of ``keys`` found, and the ``(row, checksum)`` of damaged rows."""
        found: dict[bytes, Any] = {}
        damaged: list[tuple[int, Any]] = []
        if not keys:
            return found, damaged
        rows = row_ids(keys)
        owners = dict(zip(rows, keys))
        crc32 = zlib.crc32
        with self._lock("read"):
            connection = self._connection("read")
            for start in range(0, len(rows), self._chunk):
                chunk = _padded(rows[start : start + self._chunk])
                sql = f"SELECT key, value, checksum FROM entries WHERE key IN ({','.join('?' * len(chunk))})"
                for row, blob, check in connection.execute(sql, chunk):
                    key = owners[row]
                    # decode(), inlined for the common row: verified text.
                    if type(blob) is bytes and type(check) is int and crc32(blob, crc32(key)) == check:
                        try:
                            text = blob.decode("utf-8", "surrogatepass")
                            if text[:1] == '"':
                                value, end = scanstring(text, 1)
                                if end == len(text):
                                    found[key] = value
                                    continue
                        except ValueError:
                            pass
                    value = decode(key, blob, check)
                    if value is _INVALID:
                        damaged.append((row, check))
                    else:
                        found[key] = value
        return found, damaged

    def write(
        self,
        rows: Iterable[tuple[bytes, bytes]],
        touched: Sequence[bytes] = (),
        max_bytes: int | None = None,
        damaged: Iterable[tuple[int, Any]] = (),
        pause: Callable[[], None] | None = None,
    ) -> None:
        """Write ``(key, blob)`` rows, refresh ``touched`` stamps, evict: one transaction.

        Rows are inserted in key order (one sort of them all), so the write
        walks the table's B-tree once from left to right instead of jumping
        around it; a later row of a key replaces an earlier one. They are
        prepared ``_PREPARED`` at a time, and ``pause()`` is called between
        two chunks (the writer's look at the
        event loops: ``outlines.common.threads.Foreground``).
        """
        now = time.time_ns()
        crc32 = zlib.crc32
        # Two columns, not a list of row tuples: a write of 100,000 rows would make
        # 100,000 tuples for the garbage collector, whose passes (on this thread or,
        # triggered by the count, on the event loop's) hold the GIL. Unpacked at once,
        # the iterator's tuple is reused. A writer's blocks hash their keys as this runs.
        all_keys: list[bytes] = []
        all_blobs: list[bytes] = []
        add_key, add_blob = all_keys.append, all_blobs.append
        for key, blob in rows:
            add_key(key)
            add_blob(blob)
        ids = _row_array(all_keys)
        order = ids.argsort(kind="stable")  # one C sort: the whole write walks the B-tree once; a repeated key keeps its order
        added = 0
        with self._lock("write"):
            connection = self._connection("write")
            connection.execute("BEGIN IMMEDIATE")
            try:
                if self._fresh is None:
                    self._look(connection)  # before our rows land: was the file empty?
                connection.executemany("DELETE FROM entries WHERE key = ? AND checksum IS ?", damaged)
                for first in range(0, len(all_keys), _PREPARED):
                    if pause is not None:
                        pause()
                    chunk = order[first : first + _PREPARED]
                    positions = chunk.tolist()
                    keys = [all_keys[i] for i in positions]
                    blobs = [all_blobs[i] for i in positions]
                    params: list[Any] = [None] * (3 * len(positions))
                    params[0::3] = ids[chunk].tolist()
                    params[1::3] = blobs
                    params[2::3] = list(map(crc32, blobs, map(crc32, keys)))  # checksum(), without a frame per row
                    added += sum(map(len, blobs)) + _ROW_OVERHEAD * len(blobs)
                    start, left = 0, len(positions)
                    while left:
                        # Whole statements, then the rest in powers of two: no row twice, few SQL texts.
                        size = _power_of_two(min(left, self._rows))
                        connection.execute(_insert_sql(size), [now, *params[3 * start : 3 * (start + size)]])
                        start, left = start + size, left - size
                # Entries read count as newer than those written in the same round.
                stamps = [(now + 1, row) for row in row_ids(touched)] if touched else []
                connection.executemany("UPDATE entries SET used = ? WHERE key = ?", stamps)
                if max_bytes is not None:
                    self._evict(connection, max_bytes, added)
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise
            if self._fresh:
                self._look(connection)  # another connection's commit before ours shows now

    def _evict(self, connection: sqlite3.Connection, max_bytes: int, added: int) -> None:
        # Sizes are summed by a scan only when this process's running estimate
        # (last scan + what it wrote since) crosses the limit: no per-row triggers.
        if self._estimate is not None:
            self._estimate += added
            if self._estimate <= max_bytes:
                return
        (total,) = connection.execute("SELECT coalesce(sum(size), 0) FROM entries").fetchone()
        self._estimate = total
        if total <= max_bytes:
            return
        # Free down to 90% of the limit so that eviction runs rarely. The index
        # on last use is made by the first eviction: files without a limit
        # never pay for it on insert.
        connection.execute("CREATE INDEX IF NOT EXISTS entries_used ON entries(used)")
        excess, victims = total - int(max_bytes * 0.9), []
        for key, size in connection.execute("SELECT key, size FROM entries ORDER BY used"):
            victims.append((key,))
            excess -= size
            self._estimate -= size
            if excess <= 0:
                break
        connection.executemany("DELETE FROM entries WHERE key = ?", victims)

    def totals(self) -> tuple[int, int]:
        """Entries and bytes (a scan of the table)."""
        with self._lock("read"):
            row = self._connection("read").execute("SELECT count(*), coalesce(sum(size), 0) FROM entries").fetchone()
        return int(row[0]), int(row[1])

    def clear(self) -> None:
        with self._lock("write"):
            connection = self._connection("write")
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.execute("DELETE FROM entries")
                connection.execute("COMMIT")
                self._estimate = 0
                if self._fresh:
                    self._look(connection)
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock("read"), self._lock("write"):
            if self._pid == os.getpid():
                for connection in self._connections.values():
                    connection.close()
            self._connections = {}

    def quarantine(self) -> Path:
        """Move a damaged file aside (kept for inspection) so a fresh one can start."""
        with self._lock("read"), self._lock("write"):
            self.close()
            target = self.file.with_name(f"{self.file.name}.corrupt-{os.getpid()}-{time.time_ns()}")
            os.replace(self.file, target)
            self._fresh, self._estimate = None, None
            for suffix in ("-wal", "-shm"):
                try:
                    os.replace(f"{self.file}{suffix}", f"{target}{suffix}")
                except FileNotFoundError:
                    pass
            return target
