"""Tampered cache files under eval: deep JSON, values of the wrong type, a broken schema.

Each case is a file that another process (or a person) damaged; each must be a
miss with a warning, never an exception out of ``eval``, and the file must heal.
"""
from __future__ import annotations

import sqlite3
import warnings
from pathlib import Path

import pytest

import outlines
from outlines import models
from outlines.draws import Draw, GenerationParams
from outlines.cache import Cache, CacheWarning, draw_key
from outlines.cache.sqlite import checksum, row_ids


def shout(prompt: str) -> str:
    return prompt.upper() + "!"


def model() -> outlines.models.Model:
    return models.from_function(shout, temperature=0.7)


def planted(tmp_path: Path, blob: bytes) -> tuple[Cache, bytes]:
    """A cache holding ``blob`` (with a valid checksum) as the draw of ``model()("p")``."""
    llm = model()
    cache = Cache(tmp_path)
    assert llm("p").eval(cache=cache) == "P!"
    cache.close()
    key = draw_key(llm.backend.identity, Draw("p", GenerationParams.create(temperature=0.7), 0))
    raw = sqlite3.connect(cache.file, isolation_level=None)
    changed = raw.execute(
        "UPDATE entries SET value = ?, checksum = ? WHERE key = ?", (blob, checksum(key, blob), row_ids([key])[0])
    ).rowcount
    raw.close()
    assert changed == 1
    return Cache(tmp_path), key


def test_deeply_nested_json_with_a_valid_checksum_is_a_miss(tmp_path: Path) -> None:
    cache, key = planted(tmp_path, b"[" * 100_000 + b"]" * 100_000)
    with pytest.warns(CacheWarning, match="damaged"):
        assert model()("p").eval(cache=cache) == "P!"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # recomputed and rewritten: clean from now on
        assert Cache(tmp_path).get_many([key]) == {key: "P!"}


@pytest.mark.parametrize("blob", [b"42", b'{"text": "P!"}', b'["P!"]', b"null"])
def test_a_cached_value_that_is_not_text_is_not_served_as_a_draw(tmp_path: Path, blob: bytes) -> None:
    cache, key = planted(tmp_path, blob)
    with pytest.warns(CacheWarning, match="not of type str"):
        assert model()("p").eval(cache=cache) == "P!"
    cache.flush()
    assert Cache(tmp_path).get_many([key]) == {key: "P!"}


def test_explain_does_not_count_a_wrong_type_as_a_hit(tmp_path: Path) -> None:
    cache, _ = planted(tmp_path, b"42")
    with pytest.warns(CacheWarning, match="not of type str"):
        plan = outlines.explain(model()("p"), cache=cache)
    assert plan.requests == 1


@pytest.mark.parametrize(
    "damage",
    [
        "DROP TABLE entries",
        "ALTER TABLE entries DROP COLUMN used",
        "DROP TABLE entries; CREATE TABLE entries (key TEXT PRIMARY KEY, value BLOB)",
    ],
)
def test_a_broken_schema_is_moved_aside_once_and_replaced(tmp_path: Path, damage: str) -> None:
    cache = Cache(tmp_path)
    assert model()("p").eval(cache=cache) == "P!"
    cache.close()
    raw = sqlite3.connect(cache.file, isolation_level=None)
    raw.executescript(damage)
    raw.close()
    with pytest.warns(CacheWarning, match="moved it to"):
        assert model()("p").eval(cache=Cache(tmp_path)) == "P!"
    assert list(tmp_path.glob("*.corrupt-*")), "the damaged file was kept for inspection"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the next run finds a working file: no warning again
        assert model()("p").eval(cache=Cache(tmp_path)) == "P!"
        assert Cache(tmp_path).stats()["entries"] == 1


def test_a_table_dropped_while_open_is_repaired(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    assert model()("p").eval(cache=cache) == "P!"
    cache.flush()
    raw = sqlite3.connect(cache.file, isolation_level=None)
    raw.execute("DROP TABLE entries")
    raw.close()
    with pytest.warns(CacheWarning, match="moved it to"):
        assert model()("q").eval(cache=cache) == "Q!"
    cache.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert model()("r").eval(cache=cache) == "R!"
