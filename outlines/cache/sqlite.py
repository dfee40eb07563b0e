"""The on-disk half of the draw cache: one SQLite file in WAL mode.

Each row holds a draw's key, its value as JSON bytes, a checksum over key and
value, its size and a last-use stamp (for least-recently-used eviction). Every
write is one transaction, so a crash or a kill leaves each entry absent or
whole, and several processes may read and write at once. Values are only ever
decoded with ``json.loads`` after their checksum verifies: nothing in the file
can run code, and a damaged row is reported as corrupt, never raised.
Reads and writes use separate connections, so a lookup never waits for a
commit made on another thread.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from json.encoder import encode_basestring
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["FORMAT", "CacheWarning", "FormatMismatch", "SQLiteStore", "SchemaError", "decode", "encode"]

#: Bumped on any change to keys or rows; the file name carries it, so a new
#: format never reads an old file (and never returns a wrong value).
FORMAT = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL,
    checksum BLOB NOT NULL,
    size INTEGER NOT NULL,
    used INTEGER NOT NULL
);
"""

_UPSERT = (
    "INSERT INTO entries (key, value, checksum, size, used) VALUES {rows} "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value, checksum = excluded.checksum, "
    "size = excluded.size, used = excluded.used"
)
#: Rows per INSERT: one statement step per chunk, so a writer thread takes the
#: GIL back once per chunk rather than once per row.
_ROWS = 256
#: Keys per SELECT; batches are padded to a power of two so few statements exist.
_CHUNK = 512


class CacheWarning(UserWarning):
    """The cache skipped something (a damaged entry, a locked file...); work goes on."""


class FormatMismatch(RuntimeError):
    """The file was written by another cache format."""


class SchemaError(sqlite3.DatabaseError):
    """The file's tables are not the cache's (one is missing or lacks a column): a damaged file."""


#: The columns each table must have; checked whenever a file is opened.
_COLUMNS = {"meta": ("name", "value"), "entries": ("key", "value", "checksum", "size", "used")}


def checksum(key: str, blob: bytes) -> bytes:
    """A checksum binding ``blob`` to ``key`` (a moved row fails it too)."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass") + b"\0" + blob, digest_size=16).digest()


def encode(value: Any) -> bytes:
    """``value`` as JSON bytes; raises ``TypeError``/``ValueError`` when it is not JSON."""
    if type(value) is str:  # completions: the C encoder, without building a JSONEncoder
        return encode_basestring(value).encode("utf-8", "surrogatepass")
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8", "surrogatepass")


_INVALID = object()


def decode(key: str, blob: Any, check: Any) -> Any:
    """The value of a row, or ``_INVALID`` when it does not verify."""
    if not isinstance(blob, bytes) or not isinstance(check, bytes) or checksum(key, blob) != check:
        return _INVALID
    try:
        return json.loads(blob.decode("utf-8", "surrogatepass"))
    except Exception:  # noqa: BLE001 - deep nesting raises RecursionError: any failure is a miss
        return _INVALID


def _padded(items: Sequence[Any]) -> list[Any]:
    """``items`` repeated at the end up to a power of two, so few SQL texts exist."""
    size = 1
    while size < len(items):
        size *= 2
    return list(items) + [items[-1]] * (size - len(items))


class SQLiteStore:
    """One SQLite file, with a connection for reads and one for writes.

    Each connection has its own lock, so the methods are thread-safe. They raise
    ``sqlite3.Error``; the caller decides how to degrade.
    """

    def __init__(self, file: Path, timeout: float = 30.0) -> None:
        self.file = file
        self.timeout = timeout
        self.disabled = False
        self._estimate: int | None = None  # bytes of entries, for max_bytes
        self._connections: dict[str, sqlite3.Connection] = {}
        self._locks = {"read": threading.RLock(), "write": threading.RLock()}
        self._setup = threading.Lock()  # one connection at a time sets a new file up
        self._pid = os.getpid()

    def _lock(self, role: str) -> Any:
        if self._pid != os.getpid():
            # Connections (and locks) inherited through fork must not be used here.
            self._pid, self._connections = os.getpid(), {}
            self._locks = {"read": threading.RLock(), "write": threading.RLock()}
            self._setup = threading.Lock()
        return self._locks[role]

    def _connection(self, role: str) -> sqlite3.Connection:
        if self.disabled:
            raise sqlite3.OperationalError("the cache file was given up")
        connection = self._connections.get(role)
        if connection is None:
            with self._setup:
                connection = self._connections[role] = self._open_retrying()
        return connection

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

    def get_many(self, keys: Sequence[str]) -> tuple[dict[str, Any], list[tuple[str, bytes]]]:
        """Verified values of ``keys`` found, and the ``(key, checksum)`` of damaged rows."""
        found: dict[str, Any] = {}
        damaged: list[tuple[str, bytes]] = []
        with self._lock("read"):
            connection = self._connection("read")
            for start in range(0, len(keys), _CHUNK):
                chunk = _padded(keys[start : start + _CHUNK])
                sql = f"SELECT key, value, checksum FROM entries WHERE key IN ({','.join('?' * len(chunk))})"
                for key, blob, check in connection.execute(sql, chunk):
                    value = decode(key, blob, check)
                    if value is _INVALID:
                        damaged.append((key, check))
                    else:
                        found[key] = value
        return found, damaged

    def put_many(
        self,
        rows: Iterable[tuple[str, bytes]],
        touched: Iterable[str] = (),
        max_bytes: int | None = None,
        damaged: Iterable[tuple[str, Any]] = (),
    ) -> None:
        """Write ``(key, blob)`` rows, refresh ``touched`` stamps, evict: one transaction."""
        now = time.time_ns()
        records = [(key, blob, checksum(key, blob), len(key) + len(blob) + 16, now) for key, blob in rows]
        with self._lock("write"):
            connection = self._connection("write")
            connection.execute("BEGIN IMMEDIATE")
            try:
                connection.executemany("DELETE FROM entries WHERE key = ? AND checksum IS ?", damaged)
                for start in range(0, len(records), _ROWS):
                    chunk = _padded(records[start : start + _ROWS])  # repeats are harmless upserts
                    sql = _UPSERT.format(rows=",".join(["(?, ?, ?, ?, ?)"] * len(chunk)))
                    connection.execute(sql, [field for record in chunk for field in record])
                # Entries read count as newer than those written in the same round.
                connection.executemany("UPDATE entries SET used = ? WHERE key = ?", ((now + 1, k) for k in touched))
                if max_bytes is not None:
                    self._evict(connection, max_bytes, sum(record[3] for record in records))
                connection.execute("COMMIT")
            except BaseException:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                raise

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
            for suffix in ("-wal", "-shm"):
                try:
                    os.replace(f"{self.file}{suffix}", f"{target}{suffix}")
                except FileNotFoundError:
                    pass
            return target
