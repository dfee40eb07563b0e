"""Draws stored and read by slot and prompt (``Cache.put_draws`` / ``get_draws`` / ``peek_draws``).

The batcher stores whole batches this way: memory takes them as blocks,
the writer thread hashes their keys. These tests hold that the file ends up
with exactly the rows ``draw_keys`` names, that memory bounds and several
caches on one file lose nothing, and that the writer keeps off the event
loop's bursts.
"""
from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from outlines.common import threads
from outlines.draws import Draw, DrawColumns, GenerationParams
from outlines.cache import Cache, draw_keys
from outlines.cache import disk as disk_module
from outlines.cache.sqlite import row_ids
from outlines.common.config import set_tuning

IDENTITY = ("function", "echo", "0123abcd", False)
GREEDY = GenerationParams()
HOT = GenerationParams(temperature=0.9)


def batch(prompts: list[str], params: GenerationParams = GREEDY, numbers: list[int] | None = None) -> DrawColumns:
    return DrawColumns(list(prompts), [params] * len(prompts), numbers if numbers is not None else [0] * len(prompts))


def stored_rows(cache: Cache) -> set[int]:
    cache.flush()
    connection = sqlite3.connect(cache.file)
    try:
        return {row for (row,) in connection.execute("SELECT key FROM entries")}
    finally:
        connection.close()


def test_stored_draws_land_under_their_draw_keys(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    mixed = DrawColumns(["a", "b", "a", "c"], [GREEDY, HOT, HOT, HOT], [0, 0, 1, 7])  # three slots
    cache.put_draws(IDENTITY, mixed, ["A0", "B0", "A1", "C7"])
    keys = draw_keys(IDENTITY, mixed)
    assert stored_rows(cache) == set(row_ids(keys))
    # Read back by key (another cache on the file, so from disk), and by draw.
    assert Cache(tmp_path, timeout=5.0).get_many(keys) == dict(zip(keys, ["A0", "B0", "A1", "C7"]))
    assert cache.get_draws(IDENTITY, mixed) == ["A0", "B0", "A1", "C7"]
    assert cache.get_draws(IDENTITY, batch(["a"], HOT, [2])) == [None]  # another draw number: a miss
    assert cache.get_draws(("function", "other"), mixed) == [None] * 4  # another backend: misses


def test_keyed_entries_answer_draw_lookups(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    draws = batch(["x", "y"])
    cache.put_many({draw_keys(IDENTITY, draws)[0]: "X"})
    assert cache.get_draws(IDENTITY, draws) == ["X", None]
    assert Cache(tmp_path, timeout=6.0).get_draws(IDENTITY, draws) == ["X", None]


def test_a_lookup_sets_aside_blocks_that_share_no_prompt_with_it(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_draws(IDENTITY, batch(["p1", "p2"]), ["one", "two"])
    cache.put_draws(IDENTITY, batch(["q1", "q2"]), ["ONE", "TWO"])
    (slot,) = cache._slots
    asked = batch(["r1", "p2"])
    assert cache.get_draws(IDENTITY, asked, members={"r1", "p2"}) == [None, "two"]
    assert [p for p, _ in cache._unindexed[slot]] == [["q1", "q2"]]  # never put in the table
    assert cache.get_draws(IDENTITY, batch(["q2"])) == ["TWO"]  # no members: every block is indexed
    assert slot not in cache._unindexed and cache.stats()["hits"] == 2


def test_peek_answers_only_when_memory_holds_every_draw(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_draws(IDENTITY, batch(["a", "b"]), ["A", "B"])
    assert cache.peek_draws(IDENTITY, batch(["b", "a", "b"])) == ["B", "A", "B"]
    assert cache.stats()["hits"] == 3
    assert cache.peek_draws(IDENTITY, batch(["a", "z"])) is None
    assert cache.peek_draws(IDENTITY, batch(["z", "a"])) is None
    assert cache.stats()["hits"] == 3 and cache.stats()["misses"] == 0  # a refused peek counts nothing


def test_peek_of_a_stored_call_again_reads_its_block_as_the_table_would(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_draws(IDENTITY, batch(["a", "b"]), ["A", "B"])
    cache.put_draws(IDENTITY, batch(["c", "d"]), ["C", "D"])
    (slot,) = cache._slots
    again = cache.peek_draws(IDENTITY, batch(["a", "b"]))
    assert again == ["A", "B"] and cache.stats()["hits"] == 2
    assert len(cache._unindexed[slot]) == 2 and not cache._slots[slot]  # read from the block, nothing indexed
    again.append("changed")  # the caller's copy: the block is not touched
    assert cache.peek_draws(IDENTITY, batch(["a", "b"])) == ["A", "B"]
    # A newer block with one of its prompts: its text wins, as once indexed.
    cache.put_draws(IDENTITY, batch(["b", "e"]), ["B2", "E"])
    assert cache.peek_draws(IDENTITY, batch(["a", "b"])) == ["A", "B2"]
    assert cache.get_draws(IDENTITY, batch(["a", "b", "e"])) == ["A", "B2", "E"]
    # The same prompts in another order, or fewer of them: looked up one by one, same texts.
    assert cache.peek_draws(IDENTITY, batch(["d", "c"])) == ["D", "C"]
    assert cache.peek_draws(IDENTITY, batch(["c"])) == ["C"]


def test_memory_bounds_evict_whole_slots_and_the_file_still_answers(tmp_path: Path) -> None:
    cache = Cache(tmp_path, memory_entries=150, memory_bytes=1 << 20)
    first = batch([f"a{i}" for i in range(100)])
    second = batch([f"b{i}" for i in range(100)], HOT)
    cache.put_draws(IDENTITY, first, [f"A{i}" for i in range(100)])
    cache.put_draws(IDENTITY, second, [f"B{i}" for i in range(100)])
    assert len(cache._slots) == 1 and cache._slot_entries <= 150  # the older slot went
    assert cache.get_draws(IDENTITY, first) == [f"A{i}" for i in range(100)]  # read back from the file
    alone = Cache(tmp_path / "alone", memory_entries=64)
    big = batch([f"c{i}" for i in range(100)])
    alone.put_draws(IDENTITY, big, [f"C{i}" for i in range(100)])
    (table,) = alone._slots.values()
    assert 0 < len(table) <= 64 and list(table)[-1] == "c99"  # one slot over the bound keeps its newest
    assert alone.get_draws(IDENTITY, big) == [f"C{i}" for i in range(100)]


def test_two_caches_on_one_new_file_read_each_others_draws(tmp_path: Path) -> None:
    writer, reader = Cache(tmp_path), Cache(tmp_path)  # one process: they share the file's writer
    other = Cache(tmp_path, timeout=4.0)  # its own store, as another process has
    assert reader.get_draws(IDENTITY, batch(["w"])) == [None] and other.get_draws(IDENTITY, batch(["w"])) == [None]
    writer.put_draws(IDENTITY, batch(["w", "v"]), ["W", "V"])
    assert reader.get_draws(IDENTITY, batch(["w"])) == ["W"]  # queued or committed: found either way
    writer.flush()
    assert reader.get_draws(IDENTITY, batch(["v", "u"])) == ["V", None]  # committed: by prompt, then key
    assert other.get_draws(IDENTITY, batch(["v", "w", "u"])) == ["V", "W", None]  # committed: from the file


def test_a_new_file_misses_without_hashing_or_a_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(tmp_path)
    cache.put_draws(IDENTITY, batch(["a"]), ["A"])
    cache.flush()
    hashed: list[Any] = []
    real = disk_module.prompt_keys
    monkeypatch.setattr(disk_module, "prompt_keys", lambda *args: hashed.append(args) or real(*args))
    statements: list[str] = []
    cache._disk.store._connection("read").set_trace_callback(statements.append)
    assert cache.get_draws(IDENTITY, batch([f"new{i}" for i in range(50)])) == [None] * 50
    assert hashed == [] and statements == []


def test_the_writer_waits_for_the_loops_bursts(tmp_path: Path, fresh_state: Any) -> None:
    set_tuning(thread_patience=30.0)  # read by the writer's thread: the process-wide value
    cache = Cache(tmp_path)
    draws = batch([f"p{i}" for i in range(3 * disk_module.HASH_CHUNK)])
    with threads.FOREGROUND:
        cache.put_draws(IDENTITY, draws, ["t"] * len(draws))
        time.sleep(0.2)
        connection = sqlite3.connect(cache.file)
        try:
            present = connection.execute(
                "SELECT name FROM sqlite_master WHERE name = 'entries'").fetchone() is not None
            committed = connection.execute("SELECT count(*) FROM entries").fetchone()[0] if present else 0
        finally:
            connection.close()
        assert committed == 0  # not one chunk while the loop is busy
    assert len(stored_rows(cache)) == len(draws)  # and all of it once it idles


def test_draws_stored_by_eval_are_read_back_by_key(tmp_path: Path) -> None:
    import outlines
    from outlines import models

    async def shout(prompts: list[str]) -> list[str]:
        return [p.upper() for p in prompts]

    llm = models.from_function(shout, batched=True, name="shout")
    prompts = [f"q{i}" for i in range(200)]
    program = outlines.compile(lambda q: llm(q), cache=tmp_path, progress=False)
    assert list(program(prompts)) == [p.upper() for p in prompts]
    cache = Cache(tmp_path)
    cache.flush()
    keys = draw_keys(llm.backend.cache_identities[0], [Draw(p, llm.defaults, 0) for p in prompts])
    assert Cache(tmp_path, timeout=3.0).get_many(keys) == {k: p.upper() for k, p in zip(keys, prompts)}


def test_memory_counts_the_length_of_each_prompt_and_text(tmp_path: Path) -> None:
    from outlines.cache.store import _ENTRY_BYTES

    cache = Cache(tmp_path)
    cache.put_draws(IDENTITY, batch(["ab", "é✓x"]), ["one", ""])
    assert cache._memory_size == 2 + 3 + 3 + 0 + 2 * _ENTRY_BYTES
    conversation = DrawColumns([("system", "user"), "plain"], [GREEDY] * 2, [0, 0])  # not all text: len of each
    cache.put_draws(IDENTITY, conversation, ["x", "yz"])
    assert cache._memory_size == 8 + 2 * _ENTRY_BYTES + 2 + 5 + 1 + 2 + 2 * _ENTRY_BYTES  # a tuple's len: 2
