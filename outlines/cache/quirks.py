"""Server quirks on disk: one small table in the cache's SQLite file, data only.

A row says that the server at one base URL (or one model at it:
``backends.quirks.scope``) showed one quirk (it ignores ``n``, refuses a list
of prompts, refuses a request field) and when it was last seen. The base URL
is stored as a BLAKE2b digest, never as text: a URL may carry a secret in its
query. The table lives beside the draws
(``outlines.cache.sqlite`` never reads it) and is created by the first write.
Every function opens its own short-lived connection and raises
``sqlite3.Error`` or ``OSError``; ``outlines.backends.quirks`` decides how to
degrade (it keeps the quirk in memory only).
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path

__all__ = ["DefaultCacheQuirks", "clear", "read", "write"]

TABLE = "server_quirks"
_SCHEMA = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} ("
    "server BLOB NOT NULL, quirk TEXT NOT NULL, noted REAL NOT NULL, PRIMARY KEY (server, quirk))"
)


def _server(base_url: str) -> bytes:
    return hashlib.blake2b(base_url.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _connect(file: Path, timeout: float) -> sqlite3.Connection:
    return sqlite3.connect(str(file), timeout=timeout, isolation_level=None)


def read(file: Path, base_url: str, *, newer_than: float, timeout: float = 1.0) -> frozenset[str]:
    """The quirks noted for ``base_url`` since the Unix time ``newer_than`` (none when the file is absent)."""
    if not file.exists():
        return frozenset()
    connection = _connect(file, timeout)
    try:
        rows = connection.execute(
            f"SELECT quirk FROM {TABLE} WHERE server = ? AND noted >= ?", (_server(base_url), newer_than)
        ).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return frozenset()
        raise
    finally:
        connection.close()
    return frozenset(str(quirk) for (quirk,) in rows)


def write(file: Path, base_url: str, quirk: str, *, timeout: float = 1.0) -> None:
    """Note that ``base_url`` showed ``quirk`` now (one transaction; creates the file and table when absent)."""
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    created = not file.exists()
    connection = _connect(file, timeout)
    try:
        if created:
            os.chmod(file, 0o600)
            connection.execute("PRAGMA journal_mode=WAL")  # as the draws' store sets it up
        connection.execute(_SCHEMA)
        connection.execute(
            f"INSERT OR REPLACE INTO {TABLE} (server, quirk, noted) VALUES (?, ?, ?)",
            (_server(base_url), quirk, time.time()),
        )
    finally:
        connection.close()


def clear(file: Path, *, timeout: float = 1.0) -> None:
    """Forget every quirk noted in ``file``."""
    if not file.exists():
        return
    connection = _connect(file, timeout)
    try:
        connection.execute(f"DELETE FROM {TABLE}")
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
    finally:
        connection.close()


class DefaultCacheQuirks:
    """The ``QuirkStore`` of ``outlines.backends.quirks``: the default cache's file, looked up at each call.

    Nothing is stored while the default cache is off (``OUTLINES_CACHE=0``,
    ``outlines.cache.disable()``).
    """

    def where(self) -> str | None:
        file = self._file()
        return None if file is None else str(file)

    def read(self, base_url: str, *, newer_than: float) -> frozenset[str]:
        file = self._file()
        return frozenset() if file is None else read(file, base_url, newer_than=newer_than)

    def write(self, base_url: str, quirk: str) -> None:
        file = self._file()
        if file is not None:
            write(file, base_url, quirk)

    def clear(self) -> None:
        file = self._file()
        if file is not None:
            clear(file)

    @staticmethod
    def _file() -> Path | None:
        from outlines.cache import resolve  # the package's controls, above this module

        default = resolve(True)
        return None if default is None else default.path
