"""The draw cache: keys, the SQLite store, damage handling, controls, and eval.

Every test uses a cache under ``tmp_path``; the autouse fixture points the
process default there too, so nothing touches ``~/.cache``.
"""
from __future__ import annotations

import json
import os
import pickle
import sqlite3
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import outlines
import outlines.backends.base
from outlines import cache as cache_module
from outlines.cache import keys as cache_keys
from outlines import models
from outlines.draws import Draw, DrawColumns, GenerationParams
from outlines.cache import Cache, CacheWarning, draw_key
from outlines.cache.sqlite import FORMAT, row_ids
from tests.fixtures.subprocesses import python_env

IDENTITY = ("function", "echo", "0123abcd", False)


@pytest.fixture(autouse=True)
def _private_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_state: Any) -> Iterator[Path]:
    """Point the process default cache at this test's folder, in a state of its own (enable/disable undone)."""
    directory = tmp_path / "default-cache"
    monkeypatch.setenv("OUTLINES_CACHE_DIR", str(directory))
    monkeypatch.delenv("OUTLINES_CACHE", raising=False)
    yield directory


def key(prompt: str = "hi", draw: int = 0, **params: Any) -> bytes:
    return draw_key(IDENTITY, Draw(prompt, GenerationParams.create(**params), draw))


def row(key: bytes) -> int:
    """The ``entries.key`` of a draw key (for raw SQL)."""
    return row_ids([key])[0]


def rows(cache: Cache) -> sqlite3.Connection:
    """A separate raw connection to the cache's file (all puts committed), for planting damage."""
    cache.flush()
    return sqlite3.connect(cache.file, isolation_level=None)


def checkpoint(file: Path) -> None:
    """Move everything from the WAL into the main file (closing the connection)."""
    connection = sqlite3.connect(file)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()


# -- keys -------------------------------------------------------------------------
def test_key_is_a_stable_16_byte_digest() -> None:
    assert key() == key() and type(key()) is bytes and len(key()) == 16


def test_keys_that_are_not_digests_are_refused_naming_them(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    with pytest.raises(TypeError, match="16-byte digests.*'some text'"):
        cache.put_many({"some text": "v"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"16-byte digests.*b'short'"):
        cache.get_many([key(), b"short"])


def test_key_ignores_dict_order_and_int_float_spelling() -> None:
    assert key(logit_bias={"a": 1, "b": 2}) == key(logit_bias={"b": 2, "a": 1})
    assert key(temperature=1) == key(temperature=1.0)
    assert key(temperature=0.5) != key(temperature=0.25)


def test_key_holds_the_format_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = key()
    monkeypatch.setattr(cache_keys, "FORMAT", FORMAT + 1)
    monkeypatch.setattr(cache_keys, "_prefixes", {})
    assert key() != before


def test_key_memo_never_confuses_equal_but_different_params() -> None:
    # True == 1 and hash equal, but they are different parameters on the wire.
    first = key(logprobs=True)
    second = key(logprobs=1)
    assert first != second


_KEY_SCRIPT = """
import json, sys
from outlines.cache import draw_key
from outlines.draws import Draw, DrawColumns, GenerationParams
from tests.fixtures.subprocesses import python_env
orders = [{"a": 1, "b": [1, 2], "c": {"x": 1, "y": 2}}, {"c": {"y": 2, "x": 1}, "b": [1, 2], "a": 1}]
keys = [draw_key(("openai", "m", "http://h/v1"), Draw("p\\u00e9", GenerationParams.create(seed=3, **o), 4)).hex()
        for o in orders]
print(json.dumps(keys))
"""


def test_keys_are_equal_across_hash_seeds_and_processes() -> None:
    results = set()
    for seed in ("0", "1", "4242", "random"):
        env = python_env(PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", _KEY_SCRIPT], env=env, capture_output=True, text=True, check=True)
        first, second = json.loads(out.stdout)
        assert first == second
        results.add(first)
    assert len(results) == 1


_params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.sampled_from([0, 0.3, 0.7, 1, 1.5]),
        "top_p": st.floats(0.05, 1, allow_nan=False),
        "max_tokens": st.integers(1, 50),
        "seed": st.integers(-(2**40), 2**40),
        "stop": st.lists(st.text(min_size=1, max_size=3), max_size=2),
        "logit_bias": st.dictionaries(st.sampled_from(["1", "2", "3"]), st.integers(-5, 5), min_size=1),
    },
)


@settings(max_examples=300, deadline=None)
@given(
    models_=st.lists(st.text(max_size=6), min_size=2, max_size=2),
    params=st.lists(_params, min_size=2, max_size=2),
    prompts=st.lists(st.text(max_size=12), min_size=2, max_size=2),
    draws=st.lists(st.integers(0, 10**6), min_size=2, max_size=2),
    pick=st.lists(st.booleans(), min_size=4, max_size=4),
)
def test_any_change_changes_the_key(
    models_: list[str], params: list[dict], prompts: list[str], draws: list[int], pick: list[bool]
) -> None:
    # pick[i] False: the second draw shares field i with the first one.
    second = [values[1] if change else values[0] for values, change in zip((models_, params, prompts, draws), pick)]
    one = (("function", models_[0]), GenerationParams.create(**params[0]), prompts[0], draws[0])
    two = (("function", second[0]), GenerationParams.create(**second[1]), second[2], second[3])
    same = (one[0], one[1].to_dict(), one[2], one[3]) == (two[0], two[1].to_dict(), two[2], two[3])
    key_one = draw_key(one[0], Draw(one[2], one[1], one[3]))
    key_two = draw_key(two[0], Draw(two[2], two[1], two[3]))
    assert (key_one == key_two) == same


@settings(max_examples=100, deadline=None)
@given(prompt=st.text(), draw=st.integers(0, 10**9), field=st.sampled_from(["model", "param", "prompt", "draw"]))
def test_each_single_change_changes_the_key(prompt: str, draw: int, field: str) -> None:
    base = draw_key(IDENTITY, Draw(prompt, GenerationParams.create(temperature=0.7), draw))
    changed = {
        "model": lambda: draw_key(IDENTITY[:1] + ("other",) + IDENTITY[2:],
                                  Draw(prompt, GenerationParams.create(temperature=0.7), draw)),
        "param": lambda: draw_key(IDENTITY, Draw(prompt, GenerationParams.create(temperature=0.8), draw)),
        "prompt": lambda: draw_key(IDENTITY, Draw(prompt + "x", GenerationParams.create(temperature=0.7), draw)),
        "draw": lambda: draw_key(IDENTITY, Draw(prompt, GenerationParams.create(temperature=0.7), draw + 1)),
    }[field]()
    assert changed != base


# -- the store --------------------------------------------------------------------
def test_round_trip_misses_absent_and_one_query_per_batch(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c")
    cache.put_many({key("a"): "A", key("b"): "B"})
    cache.flush()
    fresh = Cache(tmp_path / "c")  # nothing in memory: everything comes from disk
    statements: list[str] = []
    fresh._disk.store._connection("read").set_trace_callback(statements.append)
    found = fresh.get_many([key("a"), key("b"), key("c")])
    assert found == {key("a"): "A", key("b"): "B"}
    assert len([s for s in statements if s.startswith("SELECT")]) == 1
    assert fresh.stats()["hits"] == 2 and fresh.stats()["misses"] == 1


def test_json_values_round_trip_and_non_json_values_are_refused(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    values = {"s": "text é \ud800", "n": 3, "f": 0.5, "l": ["a", 1, None], "d": {"x": [True]}}
    cache.put_many({key(name): value for name, value in values.items()})
    fresh = Cache(tmp_path)
    assert fresh.get_many([key(name) for name in values]) == {key(n): v for n, v in values.items()}
    with pytest.warns(CacheWarning, match="non-JSON"):
        cache.put_many({key("obj"): object()})
    assert Cache(tmp_path).get_many([key("obj")]) == {}


def test_mutable_values_are_not_shared_between_lookups(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_many({key(): ["a"]})
    cache.get_many([key()])[key()].append("mutated")
    assert cache.get_many([key()])[key()] == ["a"]


def test_directory_is_private_and_file_is_versioned(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "new" / "dir")
    cache.put_many({key(): "x"})
    cache.flush()
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "dir").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache.file).st_mode) == 0o600
    assert cache.file.name == f"draws-v{FORMAT}.sqlite3"
    journal = rows(cache).execute("PRAGMA journal_mode").fetchone()[0]
    assert journal == "wal"


def test_a_file_of_another_format_is_never_read(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_many({key(): "x"})
    rows(cache).execute("UPDATE meta SET value = '999' WHERE name = 'format'")
    with pytest.warns(CacheWarning, match="another cache format"):
        assert Cache(tmp_path).get_many([key()]) == {}


def test_warm_batch_lookup_is_fast(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    keys = [key(str(i)) for i in range(128)]
    cache.put_many({k: "value" for k in keys})
    cache.get_many(keys)
    start = time.perf_counter()
    for _ in range(100):
        assert len(cache.get_many(keys)) == 128
    assert (time.perf_counter() - start) / 100 < 1e-3


def test_cold_batch_lookup_reads_many_keys_in_one_pass(tmp_path: Path) -> None:
    keys = [key(str(i)) for i in range(3000)]
    Cache(tmp_path).put_many({k: k.hex()[:6] for k in keys})
    found = Cache(tmp_path).get_many(keys + [key("missing")])
    assert len(found) == 3000 and all(found[k] == k.hex()[:6] for k in keys)


def selects(cache: Cache) -> list[str]:
    """The SELECTs the cache's read connection runs from now on."""
    statements: list[str] = []
    cache._disk.store._connection("read").set_trace_callback(statements.append)
    return statements


def test_a_new_file_answers_misses_without_a_query(tmp_path: Path) -> None:
    cache = Cache(tmp_path, memory_entries=0)
    seen = selects(cache)
    assert cache.get_many([key("never")]) == {}
    cache.put_many({key("a"): "A"})
    cache.flush()
    assert cache.get_many([key(str(i)) for i in range(100)]) == {}
    assert [s for s in seen if s.startswith("SELECT")] == []
    assert cache.get_many([key("a"), key("b")]) == {key("a"): "A"}  # what it wrote still reads the file
    assert len([s for s in seen if "FROM entries WHERE key IN" in s]) == 1


def test_a_new_file_that_another_writer_touched_is_read_again(tmp_path: Path) -> None:
    cache = Cache(tmp_path, memory_entries=0)
    assert cache.get_many([key("theirs")]) == {}  # new: answered from memory
    other = Cache(tmp_path, timeout=7.0)  # another store on the file, as another process has
    other.put_many({key("theirs"): "T"})
    other.flush()
    assert cache.get_many([key("theirs")]) == {key("theirs"): "T"}
    assert Cache(tmp_path, timeout=9.0).get_many([key("theirs")]) == {key("theirs"): "T"}  # not new when opened


def test_rows_sort_like_keys_and_fit_64_bits(tmp_path: Path) -> None:
    keys = sorted(key(str(i)) for i in range(1000))
    rows = row_ids(keys)
    assert rows == sorted(rows) and all(-(2**63) <= r < 2**63 for r in rows)
    assert row_ids([b"\x00" * 16, b"\xff" * 16]) == [-(2**63), 2**63 - 1]


def test_a_sqlite_build_that_binds_999_parameters_still_writes_and_reads_big_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = sqlite3.connect

    def old_build(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        connection = connect(*args, **kwargs)
        connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)  # the default before SQLite 3.32
        return connection

    monkeypatch.setattr(sqlite3, "connect", old_build)
    keys = [key(str(i)) for i in range(3000)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        Cache(tmp_path).put_many({k: k.hex() for k in keys})
        Cache(tmp_path).flush()
        found = Cache(tmp_path, timeout=5.0, memory_entries=0).get_many(keys)
    assert found == {k: k.hex() for k in keys}


def test_size_limit_evicts_least_recently_used(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=20_000)
    keep = key("keep")
    cache.put_many({keep: "k" * 100})
    for i in range(200):
        cache.get_many([keep])  # keep it recently used
        cache.put_many({key(str(i)): "v" * 500})
    cache.flush()
    entries, size = cache._disk.store.totals()
    assert size <= 20_000 and 0 < entries < 201
    assert Cache(tmp_path).get_many([keep]) == {keep: "k" * 100}
    assert Cache(tmp_path).get_many([key("0")]) == {}
    assert rows(cache).execute("SELECT sum(size), count(*) FROM entries").fetchone() == (size, entries)


def test_threads_read_and_write_at_once(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(100):
                cache.put_many({key(f"{worker}-{i}"): f"{worker}-{i}", key(f"shared-{i}"): f"shared-{i}"})
                got = cache.get_many([key(f"{worker}-{i}"), key(f"shared-{i}")])
                assert got[key(f"{worker}-{i}")] == f"{worker}-{i}"
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert cache.stats()["entries"] == 8 * 100 + 100


def test_locked_file_warns_and_carries_on(tmp_path: Path) -> None:
    cache = Cache(tmp_path, timeout=0.05)
    cache.put_many({key("a"): "A"})
    draws = DrawColumns.of([Draw("b", GenerationParams(), 0)])
    blocker = rows(cache)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.warns(CacheWarning, match="write skipped"):
            cache.put_draws(IDENTITY, draws, ["B"])
            cache.flush()
        assert Cache(tmp_path, timeout=0.05).get_many([key("a")]) == {key("a"): "A"}  # readers go on in WAL
    finally:
        blocker.execute("ROLLBACK")
    assert cache.get_draws(IDENTITY, draws) == ["B"]  # a draw the scheduler stored: still served from memory


# -- damage -------------------------------------------------------------------------
def _flip(blob: bytes) -> bytes:
    data = bytearray(blob)
    data[len(data) // 2] ^= 0x04
    return bytes(data)


DAMAGE = {
    "garbage": lambda blob, check: (os.urandom(len(blob)), check),
    "truncated": lambda blob, check: (blob[: len(blob) // 2], check),
    "zero-length": lambda blob, check: (b"", check),
    "bit-flipped": lambda blob, check: (_flip(blob), check),
    "bad checksum": lambda blob, check: (blob, check ^ 0x04),
    "text not bytes": lambda blob, check: (blob.decode(), check),
    "bytes checksum": lambda blob, check: (blob, check.to_bytes(4, "big")),
    "text checksum": lambda blob, check: (blob, f"{check}!"),  # digits alone would be stored as a number
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_warns_misses_and_is_rewritten(tmp_path: Path, damage: str) -> None:
    cache = Cache(tmp_path)
    cache.put_many({key("a"): "the value of a", key("b"): "B"})
    raw = rows(cache)
    blob, check = raw.execute("SELECT value, checksum FROM entries WHERE key = ?", (row(key("a")),)).fetchone()
    raw.execute("UPDATE entries SET value = ?, checksum = ? WHERE key = ?", (*DAMAGE[damage](blob, check), row(key("a"))))
    fresh = Cache(tmp_path)
    with pytest.warns(CacheWarning, match="damaged"):
        assert fresh.get_many([key("a"), key("b")]) == {key("b"): "B"}
    fresh.put_many({key("a"): "the value of a"})  # the scheduler recomputes and stores it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Cache(tmp_path).get_many([key("a")]) == {key("a"): "the value of a"}


def test_a_row_moved_to_another_key_fails_its_checksum(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_many({key("a"): "A", key("b"): "B"})
    raw = rows(cache)
    blob, check = raw.execute("SELECT value, checksum FROM entries WHERE key = ?", (row(key("a")),)).fetchone()
    raw.execute("UPDATE entries SET value = ?, checksum = ? WHERE key = ?", (blob, check, row(key("b"))))
    with pytest.warns(CacheWarning, match="damaged"):
        assert Cache(tmp_path).get_many([key("b")]) == {}


def test_bit_flip_in_the_file_itself_is_a_miss(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    marker = "UNIQUE-VALUE-" + "x" * 40
    cache.put_many({key("a"): marker, key("b"): "B"})
    cache.close()
    checkpoint(cache.file)
    data = bytearray(cache.file.read_bytes())
    where = data.find(marker.encode())
    assert where > 0
    data[where + 20] ^= 0x01
    cache.file.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="damaged"):
        assert Cache(tmp_path).get_many([key("a"), key("b")]) == {key("b"): "B"}


class _Boom:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {_Boom.target}",))

    target = ""


def test_a_planted_pickle_is_never_executed(tmp_path: Path) -> None:
    from outlines.cache.sqlite import checksum

    _Boom.target = str(tmp_path / "pwned")
    payload = pickle.dumps(_Boom())
    cache = Cache(tmp_path / "c")
    cache.put_many({key("a"): "A"})
    raw = rows(cache)
    # Even with a valid checksum the bytes are only ever parsed as JSON.
    raw.execute(
        "UPDATE entries SET value = ?, checksum = ? WHERE key = ?", (payload, checksum(key("a"), payload), row(key("a")))
    )
    raw.execute("INSERT INTO entries VALUES (?, ?, ?, 1, 1)", (row(key("b")), payload, 7))
    with pytest.warns(CacheWarning, match="damaged"):
        assert Cache(tmp_path / "c").get_many([key("a"), key("b")]) == {}
    assert not (tmp_path / "pwned").exists()
    source = "".join(f.read_text() for f in Path(cache_module.__file__).parent.glob("*.py"))
    assert "import pickle" not in source and "pickle.load" not in source


@pytest.mark.parametrize("content", [b"", b"not a database at all" * 100, None])
def test_garbage_or_truncated_file_is_replaced_with_a_warning(tmp_path: Path, content: bytes | None) -> None:
    cache = Cache(tmp_path)
    cache.put_many({key(str(i)): "v" * 200 for i in range(300)})
    cache.close()
    checkpoint(cache.file)
    if content is None:  # truncated mid-way
        data = cache.file.read_bytes()
        content = data[: len(data) // 3]
    cache.file.write_bytes(content)
    fresh = Cache(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = fresh.get_many([key(str(i)) for i in range(300)])
        fresh.put_many({key("new"): "N"})
    assert all(found[k] == "v" * 200 for k in found)  # whatever survived is whole
    assert Cache(tmp_path).get_many([key("new")]) == {key("new"): "N"}
    if content and not found:
        assert any(issubclass(w.category, CacheWarning) for w in caught)


# -- controls -----------------------------------------------------------------------
def test_resolve_options(tmp_path: Path, _private_default: Path) -> None:
    own = Cache(tmp_path / "own")
    assert cache_module.resolve(own) is own
    assert cache_module.resolve(False) is None and cache_module.resolve(None) is None
    default = cache_module.resolve(True)
    assert default is not None and default.file.parent == _private_default
    assert cache_module.resolve(True) is default
    assert cache_module.resolve(str(tmp_path / "p")).file.parent == tmp_path / "p"
    with pytest.raises(TypeError):
        cache_module.resolve(3)


def test_environment_and_enable_disable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTLINES_CACHE", "0")
    assert cache_module.resolve(True) is None
    assert cache_module.stats()["entries"] == 0
    cache_module.enable(tmp_path / "chosen")
    assert cache_module.resolve(True).file.parent == tmp_path / "chosen"
    cache_module.disable()
    assert cache_module.resolve(True) is None
    cache_module.enable()
    monkeypatch.setenv("OUTLINES_CACHE_DIR", str(tmp_path / "moved"))
    assert cache_module.resolve(True).file.parent == tmp_path / "moved"


def test_clear_and_stats(_private_default: Path) -> None:
    default = cache_module.resolve(True)
    default.put_many({key("a"): "A", key("b"): "B"})
    default.get_many([key("a"), key("zzz")])
    stats = cache_module.stats()
    assert stats["entries"] == 2 and stats["bytes"] > 0 and stats["hits"] == 1 and stats["misses"] == 1
    cache_module.clear()
    assert cache_module.stats()["entries"] == 0
    assert default.get_many([key("a")]) == {}
    assert Cache(_private_default).get_many([key("a")]) == {}


def test_cache_pickles_by_path(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=10**6)
    cache.put_many({key(): "x"})
    copy = pickle.loads(pickle.dumps(cache))
    assert copy.file == cache.file and copy.max_bytes == 10**6 and copy.get_many([key()]) == {key(): "x"}


# -- through eval ---------------------------------------------------------------------
class Counting:
    """A random-looking model: the text depends on the prompt and a call counter."""

    def __init__(self, fail_on: tuple[str, ...] = ()) -> None:
        self.prompts: list[str] = []
        self.fail_on = fail_on
        self.lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self.lock:
            self.prompts.append(prompt)
            count = len(self.prompts)
        if any(word in prompt for word in self.fail_on):
            raise RuntimeError(f"cannot answer {prompt!r}")
        return f"{prompt}->{count}"


def test_eval_replays_draws_and_extends_samples(tmp_path: Path) -> None:
    fn = Counting()
    llm = models.from_function(fn, name="counting", version="1", temperature=0.7)
    question = outlines.string("question")
    store = Cache(tmp_path)
    five = llm(question + "?", num_samples=5).eval({question: "q"}, cache=store)
    assert len(fn.prompts) == 5
    again = llm(question + "?", num_samples=5).eval({question: "q"}, cache=Cache(tmp_path))
    assert len(fn.prompts) == 5 and list(again) == list(five)
    eight = llm(question + "?", num_samples=8).eval({question: "q"}, cache=Cache(tmp_path))
    assert len(fn.prompts) == 8 and list(eight[:5]) == list(five)


def test_greedy_draws_share_one_entry(tmp_path: Path) -> None:
    fn = Counting()
    llm = models.from_function(fn, name="counting", version="1", temperature=0)
    out = llm("p", num_samples=4).eval(cache=Cache(tmp_path))
    assert len(fn.prompts) == 1 and len(set(out)) == 1
    assert Cache(tmp_path).stats()["entries"] == 1


def test_cache_false_and_disable_send_everything(tmp_path: Path) -> None:
    fn = Counting()
    llm = models.from_function(fn, name="counting", version="1", temperature=0.7)
    llm("p").eval(cache=False)
    llm("p").eval(cache=False)
    assert len(fn.prompts) == 2
    cache_module.disable()
    llm("p").eval()
    assert len(fn.prompts) == 3
    cache_module.enable(tmp_path)
    llm("p").eval()
    llm("p").eval()
    assert len(fn.prompts) == 4


@pytest.mark.parametrize(
    "max_batch",
    [None, 1],
    ids=["default", "max_batch=1"],
)
def test_partial_failure_caches_the_successes(tmp_path: Path, max_batch: int | None) -> None:
    prompts = np.array([f"item {i}" + (" bad" if i in (3, 7) else "") for i in range(10)], dtype=object)
    fn = Counting(fail_on=("bad",))
    llm = models.from_function(fn, name="counting", version="1", temperature=0.7, max_batch=max_batch)
    question = outlines.string("question")
    out = llm(question).eval({question: prompts}, cache=Cache(tmp_path), errors="return")
    failed = [i for i, v in enumerate(out) if isinstance(v, outlines.Failure)]
    assert failed == [3, 7]
    assert Cache(tmp_path).stats()["entries"] == 8
    fn.prompts.clear()
    fn.fail_on = ()
    again = llm(question).eval({question: prompts}, cache=Cache(tmp_path), errors="return")
    assert sorted(fn.prompts) == ["item 3 bad", "item 7 bad"]
    assert [again[i] for i in range(10) if i not in (3, 7)] == [out[i] for i in range(10) if i not in (3, 7)]


def test_api_key_never_reaches_the_cache_files(tmp_path: Path) -> None:
    from tests.fixtures.fake_openai import FakeOpenAI

    secret = "sk-test-SECRET-4f9a8b7c6d5e"
    with FakeOpenAI() as server:
        llm = models.openai_completion("tiny", base_url=server.base_url, api_key=secret, temperature=0.7)
        store = Cache(tmp_path)
        question = outlines.string("question")
        values = llm(question, num_samples=3).eval({question: ["a", "b"]}, cache=store)
        assert len(server.requests) >= 1
        assert any(secret in str(r.headers) for r in server.requests)  # it was really sent
        store.close()
    again = llm(question, num_samples=3).eval({question: ["a", "b"]}, cache=Cache(tmp_path))
    assert (again == values).all()
    for path in tmp_path.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert secret.encode() not in data and b"SECRET-4f9a" not in data, path


def test_a_bad_cache_never_breaks_eval(tmp_path: Path) -> None:
    store = Cache(tmp_path)
    fn = Counting()
    llm = models.from_function(fn, name="counting", version="1", temperature=0.7)
    first = llm("p").eval(cache=store)
    store.close()
    store.file.write_bytes(b"garbage" * 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        second = llm("p").eval(cache=Cache(tmp_path))
    assert len(fn.prompts) == 2 and second != first


def test_memory_lru_is_bounded_by_entries_and_bytes(tmp_path: Path) -> None:
    cache = Cache(tmp_path, memory_entries=50, memory_bytes=20_000)
    params = GenerationParams(temperature=0.5)
    for number in range(200):  # one draw per slot (its draw number): the memory's unit of eviction
        cache.put_draws(IDENTITY, DrawColumns.of([Draw("p", params, number)]), ["x" * 100])
    assert [slot[1] for slot in cache._slots] == list(range(150, 200))  # the last 50
    cache.put_draws(IDENTITY, DrawColumns.of([Draw("big", params, 999)]), ["y" * 19_800])  # all the room there is
    assert cache._memory_size <= 20_000 and [slot[1] for slot in cache._slots] == [999]
    cache.flush()
    stored = Cache(tmp_path).get_many([key("p", number, temperature=0.5) for number in range(200)])
    assert len(stored) == 200  # all still on disk


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_eval_recomputes_and_rewrites_a_damaged_draw(tmp_path: Path, damage: str) -> None:
    fn = Counting()
    llm = models.from_function(fn, name="counting", version="1", temperature=0.7)
    first = llm("only prompt").eval(cache=Cache(tmp_path))
    raw = rows(Cache(tmp_path))
    ((stored_key, blob, check),) = raw.execute("SELECT key, value, checksum FROM entries").fetchall()
    raw.execute("UPDATE entries SET value = ?, checksum = ?", DAMAGE[damage](blob, check))
    raw.close()
    with pytest.warns(CacheWarning, match="damaged"):
        second = llm("only prompt").eval(cache=Cache(tmp_path, memory_entries=0))
    assert len(fn.prompts) == 2 and second != first  # recomputed: a new draw
    Cache(tmp_path).flush()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = llm("only prompt").eval(cache=Cache(tmp_path, memory_entries=0))
    assert third == second and len(fn.prompts) == 2  # rewritten
    assert Cache(tmp_path).stats()["entries"] == 1


def test_a_dry_run_lookup_is_not_counted(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_many({key("a"): "A"})
    assert cache.get_many([key("a"), key("b")], record=False) == {key("a"): "A"}
    assert (cache.stats()["hits"], cache.stats()["misses"]) == (0, 0)


def test_eval_inside_a_running_loop_uses_the_cache_from_its_helper_thread(tmp_path: Path) -> None:
    import asyncio

    fn = Counting()
    llm = models.from_function(fn, name="counting", version="1", temperature=0.7)
    store = Cache(tmp_path)

    async def notebook_cell() -> tuple[Any, Any]:
        # .eval() inside a running loop (Jupyter) runs on a private loop in a helper thread.
        return llm("p", num_samples=3).eval(cache=store), llm("p", num_samples=3).eval(cache=store)

    first, second = asyncio.run(notebook_cell())
    assert list(first) == list(second) and len(fn.prompts) == 3
    assert list(llm("p", num_samples=3).eval(cache=Cache(tmp_path, memory_entries=0))) == list(first)


def test_a_new_file_opened_by_a_reader_and_the_writer_at_once_loses_nothing(tmp_path: Path) -> None:
    # The lookup (caller's thread) and the first commit (writer thread) both
    # set a new file up; SQLite answers "database is locked" at once there,
    # without its busy wait, unless the setup is serialised (~1 in 6 tries did).
    for attempt in range(60):
        cache = Cache(tmp_path / str(attempt))
        with warnings.catch_warnings(record=True) as caught:  # the writer thread's too
            warnings.simplefilter("always")
            cache.put_many({key("a"): "A"})
            assert cache.get_many([key("a"), key("missing")]) == {key("a"): "A"}  # the miss reads the file
            cache.flush()
        assert not [w for w in caught if issubclass(w.category, CacheWarning)], attempt
        assert cache.stats()["entries"] == 1
