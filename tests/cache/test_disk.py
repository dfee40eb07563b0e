"""One ``Disk`` (store and write-behind) per resolved cache file, and files the cache did not make.

Issue 27: a second ``Cache`` naming the same file another way (``d/sub/..``,
a symlink, the file itself, another ``timeout``) must read the first one's
writes still queued (item 5); a cache path naming a file that is not a cache
is an error naming it, and that file is never moved (item 4).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from outlines.backends.base import DrawBatch, GenerationParams
from outlines.cache import Cache, draw_keys
from outlines.cache.sqlite import FORMAT, SQLiteStore

IDENTITY = ("function", "echo", "0123abcd", False)
DRAWS = DrawBatch(["x", "y"], [GenerationParams()] * 2, [0, 0])


@pytest.fixture
def stalled_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold every cache commit until the returned event is set (set at teardown): writes stay queued."""
    release = threading.Event()
    commit = SQLiteStore.put_many

    def held(self: SQLiteStore, *args: Any, **kwargs: Any) -> None:
        release.wait(60)
        commit(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteStore, "put_many", held)
    yield release
    release.set()


SPELLINGS: dict[str, Callable[[Path], Any]] = {
    "same": lambda d: Cache(d),
    "dot-dot": lambda d: Cache(d / "sub" / ".."),
    "symlink": lambda d: Cache(d.parent / "link"),
    "file": lambda d: Cache(d / f"draws-v{FORMAT}.sqlite3"),
    "timeout": lambda d: Cache(d, timeout=6.0),
    "string": lambda d: Cache(str(d) + "/"),
}


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_a_second_cache_reads_the_first_ones_queued_writes_however_the_path_is_spelled(
    tmp_path: Path, stalled_writer: threading.Event, spelling: str
) -> None:
    directory = tmp_path / "d"
    (directory / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(directory)
    first = Cache(directory)
    keys = draw_keys(IDENTITY, DRAWS)
    first.put_many({keys[0]: "X"})  # keyed
    second = SPELLINGS[spelling](directory)
    assert second.get_many(keys) == {keys[0]: "X"}
    assert second.get_draws(IDENTITY, DRAWS) == ["X", None]
    later = DrawBatch(["z"], [GenerationParams()], [0])
    first.put_draws(IDENTITY, later, ["Z"])  # by slot: keys hashed on the (stalled) writer
    assert second.get_draws(IDENTITY, later) == ["Z"]
    stalled_writer.set()
    second.flush()
    assert Cache(directory).stats()["entries"] == 2


def test_the_longest_timeout_asked_applies_to_the_shared_file(tmp_path: Path) -> None:
    short = Cache(tmp_path, timeout=1.0)
    short.put_many({draw_keys(IDENTITY, DRAWS)[0]: "X"})
    short.flush()
    Cache(tmp_path / ".", timeout=9.0)
    store = short._disk.store
    assert store is not None and store.timeout == 9.0
    connection = store._connection("write")
    assert connection.execute("PRAGMA busy_timeout").fetchone()[0] == 9000
