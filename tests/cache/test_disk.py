"""One ``Disk`` (store and write-behind) per resolved cache file, and files the cache did not make.

Issue 27: a second ``Cache`` naming the same file another way (``d/sub/..``,
a symlink, the file itself, another ``timeout``) must read the first one's
writes still queued (item 5); a cache path naming a file that is not a cache
is an error naming it, and that file is never moved (item 4).
"""
from __future__ import annotations

import os
import re
import sqlite3
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from outlines.draws import DrawColumns, GenerationParams
from outlines.cache import Cache, CacheWarning, draw_keys
from outlines.cache.sqlite import FORMAT, SQLiteStore

try:
    from outlines.cache.sqlite import NotACacheFile
except ImportError:  # before issue 27: no such error, the file was moved aside
    NotACacheFile = ValueError  # type: ignore[misc,assignment]

IDENTITY = ("function", "echo", "0123abcd", False)
DRAWS = DrawColumns(["x", "y"], [GenerationParams()] * 2, [0, 0])


@pytest.fixture
def stalled_writer(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Hold every cache commit until the returned event is set (set at teardown): writes stay queued."""
    release = threading.Event()
    commit = SQLiteStore.write

    def held(self: SQLiteStore, *args: Any, **kwargs: Any) -> None:
        release.wait(60)
        commit(self, *args, **kwargs)

    monkeypatch.setattr(SQLiteStore, "write", held)
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
    later = DrawColumns(["z"], [GenerationParams()], [0])
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


# -- item 4: a file the cache did not make is never moved, written or read as a cache -------
def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _their_database(path: Path) -> None:
    connection = sqlite3.connect(path, isolation_level=None)
    connection.executescript("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');")
    connection.close()


@pytest.mark.parametrize(
    "name, make",
    [
        ("notes.txt", lambda p: p.write_text("my notes, not a cache\n" * 50)),
        ("empty.txt", lambda p: p.write_bytes(b"")),
        ("app.db", _their_database),  # a SQLite file of another program: no outlines meta table
        ("app.sqlite3", _their_database),
        ("photo.db", lambda p: p.write_bytes(os.urandom(4096))),
    ],
)
@pytest.mark.parametrize("through", ["Cache", "OUTLINES_CACHE_DIR"])
def test_a_cache_path_naming_a_file_the_cache_did_not_make_is_an_error_and_the_file_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, make: Callable[[Path], None], through: str
) -> None:
    import outlines
    from outlines import models

    path = tmp_path / name
    make(path)
    before = _listing(tmp_path)
    with pytest.raises(NotACacheFile, match=re.escape(str(path))):
        if through == "Cache":
            Cache(path)
        else:  # the process default, as a fresh process would see it (other tests enable/disable it)
            monkeypatch.setenv("OUTLINES_CACHE_DIR", str(path))
            monkeypatch.delenv("OUTLINES_CACHE", raising=False)
            with outlines.common.config.using_process_state():
                models.from_function(str.upper, temperature=0.7)("p").eval()
    assert _listing(tmp_path) == before  # not renamed, not written, no -wal/-shm beside it
    if through == "Cache":
        assert Cache(tmp_path / "elsewhere").get_many([]) == {}  # other paths still work
        assert outlines.eval(outlines.string("q") + "!", givens={"q": "x"}) == "x!"


def test_a_damaged_file_the_cache_made_is_still_moved_aside(tmp_path: Path) -> None:
    own = tmp_path / "mine.sqlite3"  # named explicitly, made by the cache
    cache = Cache(own)
    cache.put_many({draw_keys(IDENTITY, DRAWS)[0]: "X"})
    cache.close()
    raw = sqlite3.connect(own, isolation_level=None)
    raw.execute("DROP TABLE entries")
    raw.close()
    with pytest.warns(CacheWarning, match="moved it to"):
        assert Cache(own).get_many(draw_keys(IDENTITY, DRAWS)) == {}
    assert list(tmp_path.glob("mine.sqlite3.corrupt-*"))


def test_a_file_replaced_under_the_cache_by_one_it_did_not_make_is_not_moved(tmp_path: Path) -> None:
    own = tmp_path / "mine.db"
    cache = Cache(own)
    cache.put_many({draw_keys(IDENTITY, DRAWS)[0]: "X"})
    cache.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{own}{suffix}").unlink(missing_ok=True)
    own.write_text("someone else's file now\n" * 100)
    with pytest.warns(CacheWarning, match="did not make"):
        cache.put_many({draw_keys(IDENTITY, DRAWS)[1]: "Y"})
        cache.flush()
    assert own.read_text() == "someone else's file now\n" * 100
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_a_large_write_leaves_the_garbage_collector_alone(tmp_path: Path) -> None:
    import gc
    import hashlib

    store = SQLiteStore(tmp_path / f"draws-v{FORMAT}.sqlite3")
    keys = [hashlib.blake2b(b"%d" % i, digest_size=16).digest() for i in range(20_000)]
    blobs = [b'"v%d"' % i for i in range(20_000)]
    collections: list[int] = []

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and threading.current_thread() is threading.main_thread():
            collections.append(info["generation"])

    gc.collect()
    gc.callbacks.append(count)
    try:
        store.write(zip(keys, blobs))  # a row tuple each, as the writer's blocks give them
    finally:
        gc.callbacks.remove(count)
    assert len(collections) < 5  # 20,000 row tuples kept alive would trigger some 28
    found, damaged = store.read(keys[::997])
    assert found == {keys[i]: f"v{i}" for i in range(0, 20_000, 997)} and not damaged


def test_a_batch_over_many_slots_is_one_lookup_of_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stacked loop's batch has one slot per element (each draws in its own namespace): its misses
    # go to the file together, the file's freshness looked at once, and each slot gets its own values.
    count = 40
    first = Cache(tmp_path)
    stored = DrawColumns([f"p{i}" for i in range(count)], [GenerationParams()] * count, list(range(1, count + 1)))
    first.put_draws(IDENTITY, stored, [f"T{i}" for i in range(count)])
    first.flush()
    calls = {"read": 0, "fresh": 0}
    read, fresh = SQLiteStore.read, SQLiteStore.fresh

    def counted_read(self: SQLiteStore, keys: Any) -> Any:
        calls["read"] += 1
        return read(self, keys)

    def counted_fresh(self: SQLiteStore) -> bool:
        calls["fresh"] += 1
        return fresh(self)

    monkeypatch.setattr(SQLiteStore, "read", counted_read)
    monkeypatch.setattr(SQLiteStore, "fresh", counted_fresh)
    second = Cache(tmp_path)  # not the writer: its memory holds nothing, every draw is asked of the file
    # even elements in their stored slot, odd ones one slot off (misses), and a prompt never stored
    numbers = [i + 1 if i % 2 == 0 else i + 2 for i in range(count)] + [1]
    asked = DrawColumns([f"p{i}" for i in range(count)] + ["new"], [GenerationParams()] * (count + 1), numbers)
    assert second.get_draws(IDENTITY, asked) == [f"T{i}" if i % 2 == 0 else None for i in range(count)] + [None]
    assert calls == {"read": 1, "fresh": 1}
    assert second.get_draws(IDENTITY, stored) == [f"T{i}" for i in range(count)]
    assert calls["read"] == 2


def test_a_batch_over_many_slots_reads_blocks_still_queued(tmp_path: Path, stalled_writer: threading.Event) -> None:
    count = 30
    first = Cache(tmp_path)
    stored = DrawColumns([f"p{i}" for i in range(count)], [GenerationParams()] * count, list(range(1, count + 1)))
    first.put_draws(IDENTITY, stored, [f"T{i}" for i in range(count)])  # one block per slot, none committed
    second = Cache(tmp_path)
    numbers = [i + 1 if i % 3 else i + 2 for i in range(count)]  # every third one slot off: a miss
    asked = DrawColumns([f"p{i}" for i in range(count)], [GenerationParams()] * count, numbers)
    assert second.get_draws(IDENTITY, asked) == [f"T{i}" if i % 3 else None for i in range(count)]
    stalled_writer.set()
    second.flush()
    assert Cache(tmp_path).get_draws(IDENTITY, asked) == [f"T{i}" if i % 3 else None for i in range(count)]
