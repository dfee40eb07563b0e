"""The server-quirk table in the cache's SQLite file: data only, beside the draws."""
from __future__ import annotations

import sqlite3
import time

from outlines.draws import Draw, GenerationParams
from outlines.cache import Cache, draw_key
from outlines.cache import quirks

URL = "http://127.0.0.1:8000/v1?api-key=sk-SECRET"


def test_a_written_quirk_reads_back_for_its_server_only(tmp_path):
    file = tmp_path / "draws.sqlite3"
    assert quirks.read(file, URL, newer_than=0) == frozenset()  # no file: nothing known, nothing created
    assert not file.exists()
    quirks.write(file, URL, "ignores_n")
    quirks.write(file, URL, "refuses_prompt_lists")
    quirks.write(file, URL, "ignores_n")  # noted again: one row, a newer stamp
    assert quirks.read(file, URL, newer_than=0) == {"ignores_n", "refuses_prompt_lists"}
    assert quirks.read(file, "http://127.0.0.1:8001/v1", newer_than=0) == frozenset()
    assert quirks.read(file, URL, newer_than=time.time() + 60) == frozenset()  # older notes are not trusted
    quirks.clear(file)
    assert quirks.read(file, URL, newer_than=0) == frozenset()


def test_rows_hold_data_only_and_never_the_url(tmp_path):
    file = tmp_path / "draws.sqlite3"
    quirks.write(file, URL, "ignores_n")
    with sqlite3.connect(file) as connection:
        rows = connection.execute(f"SELECT server, quirk, noted FROM {quirks.TABLE}").fetchall()
    ((server, quirk, noted),) = rows
    assert isinstance(server, bytes) and len(server) == 16 and quirk == "ignores_n" and isinstance(noted, float)
    assert b"SECRET" not in file.read_bytes() and b"127.0.0.1" not in file.read_bytes()
    assert oct(file.stat().st_mode & 0o777) == "0o600"


def test_the_table_lives_beside_the_draws_of_a_cache(tmp_path):
    cache = Cache(tmp_path)
    key = draw_key(("function", "f"), Draw("hi", GenerationParams(), 0))
    cache.put_many({key: "answer"})
    cache.flush()
    quirks.write(cache.path, URL, "ignores_n")
    fresh = Cache(tmp_path / "draws-v2.sqlite3", memory_entries=0)
    assert fresh.get_many([key]) == {key: "answer"}
    assert quirks.read(cache.path, URL, newer_than=0) == {"ignores_n"}
    cache.clear()  # clearing the draws keeps what is known about servers
    assert quirks.read(cache.path, URL, newer_than=0) == {"ignores_n"}


def test_a_file_without_the_table_knows_nothing(tmp_path):
    file = tmp_path / "draws.sqlite3"
    sqlite3.connect(file).close()
    assert quirks.read(file, URL, newer_than=0) == frozenset()
    quirks.clear(file)


def test_a_cache_opens_a_file_the_quirk_table_created(tmp_path):
    quirks.write(tmp_path / "draws-v2.sqlite3", URL, "ignores_n")
    cache = Cache(tmp_path)
    key = draw_key(("function", "f"), Draw("hi", GenerationParams(), 0))
    cache.put_many({key: "answer"})
    cache.flush()
    assert Cache(tmp_path / "draws-v2.sqlite3", memory_entries=0).get_many([key]) == {key: "answer"}
    assert quirks.read(cache.path, URL, newer_than=0) == {"ignores_n"}
