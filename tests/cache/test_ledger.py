"""The job ledger in the cache's SQLite file: transitions, lookups, checksums, kill -9 at every step."""
from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from outlines.backends.jobs import JobStatus
from outlines.cache import Cache, CacheWarning
from outlines.cache.ledger import Claimed, JobRecord, LeaseLost, Ledger, LedgerError
from tests.fixtures.subprocesses import ROOT, python_env

BACKEND = ["openai", "gpt-fake", "http://127.0.0.1:1/v1"]
LINES = [("k0", ["k0", "k1"]), ("k2", ["k2"])]


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


@pytest.fixture
def ledger(cache: Cache) -> Ledger:
    ledger = Ledger(cache)
    yield ledger
    ledger.close()


def intent(ledger: Ledger, lines: Any = LINES, run: str = "labels", **options: Any) -> JobRecord:
    return ledger.record_intent(provider="openai", backend=BACKEND, run=run, lines=lines, **options)


def test_an_intent_records_its_lines_and_the_metadata_to_send(ledger: Ledger) -> None:
    record = intent(ledger, metadata={"team": "research"})
    assert record.state == "intent" and record.job_id is None and record.requests == 2 and record.open
    assert record.metadata == {"team": "research", "outlines_run": "labels", "outlines_intent": record.intent}
    assert ledger.get(record.intent) == record
    assert ledger.lines(record.intent) == {"k0": ("k0", "k1"), "k2": ("k2",)}
    found = ledger.find(["k1", "k2", "absent"])
    assert sorted(found) == ["k1", "k2"]
    assert (found["k1"].intent, found["k1"].custom_id, found["k1"].sample) == (record.intent, "k0", 1)


def test_a_job_goes_from_intent_to_collected_one_committed_step_at_a_time(ledger: Ledger) -> None:
    record = intent(ledger)
    created = ledger.record_created(record.intent, JobStatus("batch_1", "validating", total=2))
    assert (created.state, created.job_id) == ("validating", "batch_1")
    assert ledger.by_job_id("batch_1") == created
    running = ledger.advance(record.intent, JobStatus("batch_1", "in_progress", total=2, succeeded=1))
    assert running.status is not None and running.status["succeeded"] == 1
    done = ledger.advance(record.intent, JobStatus("batch_1", "completed", total=2, succeeded=2))
    # A stale read never takes a finished job back.
    assert ledger.advance(record.intent, JobStatus("batch_1", "in_progress")).state == "completed"
    collected = ledger.collected(record.intent)
    assert collected.state == "collected" and not collected.open and collected.updated >= done.updated
    assert ledger.find(["k0"]) == {} and sorted(ledger.find(["k0"], open_only=False)) == ["k0"]


REFUSED = {
    "unknown intent": lambda ledger, intent: ledger.advance("nope", JobStatus("batch_1", "completed")),
    "another job id": lambda ledger, intent: ledger.record_created(intent, JobStatus("batch_2", "validating")),
    "collect a running job": lambda ledger, intent: ledger.collected(intent),
    "abandon a running job": lambda ledger, intent: ledger.abandon(intent, "bored"),
    "an unknown state": lambda ledger, intent: ledger.advance(intent, JobStatus("batch_1", "exploded")),
    "advance a closed job": lambda ledger, intent: (
        ledger.advance(intent, JobStatus("batch_1", "completed")), ledger.collected(intent),
        ledger.advance(intent, JobStatus("batch_1", "completed"))),
}


@pytest.mark.parametrize("step", sorted(REFUSED))
def test_refused_transitions_name_the_job(ledger: Ledger, step: str) -> None:
    record = intent(ledger)
    ledger.record_created(record.intent, JobStatus("batch_1", "in_progress"))
    with pytest.raises(LedgerError, match="no job intent nope" if step == "unknown intent" else record.intent):
        REFUSED[step](ledger, record.intent)
    assert ledger.get(record.intent).state in ("in_progress", "collected")  # type: ignore[union-attr]


def test_an_intent_never_created_is_abandoned_with_its_reason(ledger: Ledger) -> None:
    record = intent(ledger)
    abandoned = ledger.abandon(record.intent, "create refused: 400 bad model")
    assert abandoned.state == "abandoned" and abandoned.note == "create refused: 400 bad model"
    assert ledger.find(["k0"]) == {}


def test_find_gives_the_newest_job_of_each_draw(cache: Cache) -> None:
    ticks = iter(range(100))
    ledger = Ledger(cache, clock=lambda: float(next(ticks)))
    old = intent(ledger)
    ledger.record_created(old.intent, JobStatus("batch_old", "expired"))
    ledger.collected(old.intent)  # only then may another job ask its draws (its lines that never ran)
    new = intent(ledger, lines=[("k1", ["k1"])])
    assert {key: ref.intent for key, ref in ledger.find(["k0", "k1"]).items()} == {"k1": new.intent}
    found = ledger.find(["k0", "k1"], open_only=False)
    assert found["k1"].intent == new.intent and found["k0"].intent == old.intent


def test_jobs_filter_by_openness_provider_backend_and_run(cache: Cache) -> None:
    ticks = iter(range(100))
    ledger = Ledger(cache, clock=lambda: float(next(ticks)))
    a = intent(ledger, run="a")
    b = ledger.record_intent(provider="anthropic", backend=["anthropic", "c", "u", None], run="b",
                             lines=[("a0", ["a0"])])
    ledger.abandon(a.intent, "x")
    assert [r.intent for r in ledger.jobs()] == [a.intent, b.intent]
    assert [r.intent for r in ledger.jobs(open=True)] == [b.intent]
    assert [r.intent for r in ledger.jobs(provider="openai")] == [a.intent]
    assert [r.intent for r in ledger.jobs(backend=("anthropic", "c", "u", None))] == [b.intent]
    assert [r.intent for r in ledger.jobs(run="b", open=False)] == []


def test_thousands_of_keys_are_found_in_chunks(ledger: Ledger) -> None:
    keys = [f"{i:032x}" for i in range(3000)]
    record = intent(ledger, lines=[(k, [k]) for k in keys])
    found = ledger.find(keys + ["f" * 32])
    assert len(found) == 3000 and all(ref.intent == record.intent for ref in found.values())


def test_it_lives_in_the_cache_file_and_outlives_a_clear(cache: Cache, ledger: Ledger) -> None:
    cache.put_many({bytes(16): "kept"})
    record = intent(ledger)
    cache.clear()
    assert ledger.get(record.intent) == record
    with sqlite3.connect(cache.file) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        (blob,) = connection.execute("SELECT record FROM jobs").fetchone()
    assert {"entries", "meta", "jobs", "job_lines"} <= tables
    assert blob.startswith(b"{")  # data only: JSON text
    cache.put_many({bytes(16): "again"})
    assert Cache(cache.file).get_many([bytes(16)]) == {bytes(16): "again"}


def test_damaged_rows_are_skipped_with_a_warning_never_raised(cache: Cache, ledger: Ledger) -> None:
    good, bad = intent(ledger, lines=[("g", ["g"])]), intent(ledger, lines=[("b", ["b", "b2"])])
    with sqlite3.connect(cache.file) as connection:
        connection.execute("UPDATE jobs SET record = replace(record, 'labels', 'libels') WHERE intent = ?",
                           (bad.intent,))
        connection.execute("UPDATE job_lines SET custom_id = 'evil' WHERE key = 'b2'")
    with pytest.warns(CacheWarning, match="damaged job record"):
        assert [r.intent for r in ledger.jobs()] == [good.intent]
    with pytest.warns(CacheWarning) as caught:
        assert sorted(ledger.find(["g", "b", "b2"])) == ["g"]
    assert sorted(str(w.message).split(" in ")[0] for w in caught) == [
        "outlines cache: 1 damaged job line(s)", f"outlines cache: a damaged job record ({bad.intent!r})"]
    with pytest.warns(CacheWarning), pytest.raises(LedgerError, match="no job intent"):
        ledger.advance(bad.intent, JobStatus("batch_1", "completed"))


def test_threads_record_and_advance_at_once(ledger: Ledger) -> None:
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(10):
                record = intent(ledger, lines=[(f"t{n}-{i}", [f"t{n}-{i}"])])
                ledger.record_created(record.intent, JobStatus(f"batch-{n}-{i}", "completed"))
                ledger.collected(record.intent)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(ledger.jobs(open=False)) == 40


# -- leases: two holders (two processes) on one file, on a fake clock ------------------------------


class Clock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def two(cache: Cache) -> Any:
    clock = Clock()
    first, second = Ledger(cache, clock=clock, lease=60.0), Ledger(cache, clock=clock, lease=60.0)
    yield clock, first, second
    first.close()
    second.close()


def test_the_writer_of_an_intent_holds_it_and_another_takes_it_only_once_the_lease_expired(two: Any) -> None:
    clock, first, second = two
    assert first.holder != second.holder
    record = intent(first)
    assert first.leased(record.intent) == second.leased(record.intent)
    assert (first.leased(record.intent).holder, first.leased(record.intent).expires) == (first.holder, 1060.0)
    clock.now = 1059.0
    assert not second.take(record.intent)  # live: wait
    assert first.renew(record.intent).expires == 1119.0  # the heartbeat
    clock.now = 1118.9
    assert not second.take(record.intent)
    clock.now = 1119.0  # no heartbeat for 60 s: its holder died
    assert second.take(record.intent) and second.leased(record.intent).holder == second.holder
    with pytest.raises(LeaseLost, match=f"job intent {record.intent} is held by holder {second.holder}"):
        first.renew(record.intent)  # the check before create: the loser never creates
    assert not first.take(record.intent)
    first.release(record.intent)  # not its lease: nothing happens
    assert second.leased(record.intent).holder == second.holder
    second.release(record.intent)
    assert first.leased(record.intent) is None and first.take(record.intent)


def test_closing_a_job_ends_its_lease(two: Any) -> None:
    clock, first, second = two
    record = intent(first)
    first.record_created(record.intent, JobStatus("batch_1", "in_progress"))
    assert first.renew(record.intent).holder == first.holder  # recording and polling keep it
    first.advance(record.intent, JobStatus("batch_1", "completed"))
    first.collected(record.intent)
    assert first.leased(record.intent) is None
    with pytest.raises(LeaseLost, match="nobody"):
        first.renew(record.intent)
    other = intent(first, lines=[("z", ["z"])])
    first.abandon(other.intent, "refused: 400")
    assert first.leased(other.intent) is None


def test_a_draw_is_recorded_in_one_open_job_at_a_time(two: Any) -> None:
    clock, first, second = two
    record = intent(first)
    with pytest.raises(Claimed, match=record.intent) as claimed:
        intent(second, lines=[("k2", ["k2"]), ("k9", ["k9"])])
    assert claimed.value.intents == [record.intent]
    assert second.find(["k9"]) == {} and len(second.jobs()) == 1  # nothing written
    first.abandon(record.intent, "never created")
    assert intent(second, lines=[("k2", ["k2"])]).requests == 1


def test_of_two_threads_recording_the_same_draws_one_wins(cache: Cache) -> None:
    ledgers = [Ledger(cache) for _ in range(4)]
    won: list[str] = []
    lost: list[str] = []
    barrier = threading.Barrier(len(ledgers))

    def record(ledger: Ledger) -> None:
        barrier.wait()
        try:
            won.append(intent(ledger).intent)
        except Claimed as error:
            lost.extend(error.intents)

    threads = [threading.Thread(target=record, args=(ledger,)) for ledger in ledgers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and lost == won * 3
    for ledger in ledgers:
        ledger.close()


def test_a_job_created_after_its_intent_was_given_up_is_kept(two: Any) -> None:
    clock, first, second = two
    record = intent(first)
    clock.now += 61.0  # the first stalls past its lease; the second takes over, finds no job, gives up
    assert second.take(record.intent)
    second.abandon(record.intent, "never created: the provider holds no job with its metadata")
    # The first's create went through all the same: the job exists, is paid, and must be collected.
    reopened = first.record_created(record.intent, JobStatus("batch_late", "validating"))
    assert reopened.open and reopened.job_id == "batch_late" and "reopened: job batch_late" in str(reopened.note)
    assert first.find(["k0"])["k0"].intent == record.intent
    first.advance(record.intent, JobStatus("batch_late", "failed"))
    first.abandon(record.intent, "failed")
    with pytest.raises(LedgerError, match="abandoned with job batch_late"):
        first.record_created(record.intent, JobStatus("batch_late", "validating"))


def test_a_damaged_lease_is_taken_as_expired(two: Any, cache: Cache) -> None:
    clock, first, second = two
    record = intent(first)
    with sqlite3.connect(cache.file) as connection:
        connection.execute("UPDATE job_leases SET expires = expires + 1000")
    with pytest.warns(CacheWarning, match="damaged job lease"):
        assert second.take(record.intent)
    assert second.leased(record.intent).holder == second.holder


def test_a_lease_lasts_a_positive_time(cache: Cache) -> None:
    with pytest.raises(ValueError, match="lease"):
        Ledger(cache, lease=0)


@pytest.mark.parametrize("killed_after", ["intent", "validating", "in_progress", "completed", "collected"])
def test_each_step_survives_kill_9(tmp_path: Path, killed_after: str) -> None:
    directory = tmp_path / "cache"
    child = subprocess.Popen([sys.executable, "-m", "tests.fixtures.ledger_steps", str(directory)], cwd=ROOT,
                             env=python_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        first = child.stdout.readline().split()
        assert first[0] == "intent", first
        step = "intent"
        while step != killed_after:
            child.stdin.write("\n")
            child.stdin.flush()
            step = child.stdout.readline().strip()
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    cache = Cache(directory)
    ledger = Ledger(cache)
    record = ledger.get(first[1])
    assert record is not None and record.state == killed_after
    assert record.job_id == (None if killed_after == "intent" else "batch_1")
    assert ledger.lines(record.intent) == {"k0": ("k0", "k1"), "k2": ("k2",)}
    assert (killed_after == "collected") == (ledger.find(["k1"]) == {})
    # The dead process's lease stays until it expires (a closed job has none): another process waits that long.
    assert (killed_after == "collected") == (ledger.leased(record.intent) is None)
    assert cache.get_many([bytes(16)]) == {bytes(16): "a draw stored before the job"}
    with sqlite3.connect(cache.file) as connection:
        assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    ledger.close()


# -- doubts settled by the provider --------------------------------------------------------------


def test_adopt_writes_over_a_damaged_row_of_the_jobs_intent(cache: Cache, ledger: Ledger) -> None:
    record = intent(ledger)
    ledger.record_created(record.intent, JobStatus("batch_1", "in_progress", total=2))
    with sqlite3.connect(cache.file) as connection:
        connection.execute("UPDATE jobs SET checksum = checksum + 1")
    with pytest.warns(CacheWarning, match="damaged job record"):
        assert ledger.get(record.intent) is None
    status = JobStatus("batch_1", "completed", total=2, succeeded=2, metadata=record.metadata)
    with pytest.warns(CacheWarning, match="damaged job record"):  # the row it writes over
        adopted = ledger.adopt(provider="openai", backend=BACKEND, run="labels", lines=LINES, status=status,
                               metadata=status.metadata)
    assert (adopted.intent, adopted.job_id, adopted.state) == (record.intent, "batch_1", "completed")
    assert ledger.get(record.intent) == adopted and ledger.find(["k1"])["k1"].intent == record.intent


def test_adopt_repairs_the_lines_of_a_readable_record_and_keeps_it(cache: Cache, ledger: Ledger) -> None:
    record = intent(ledger)
    created = ledger.record_created(record.intent, JobStatus("batch_1", "in_progress", total=2))
    with sqlite3.connect(cache.file) as connection:
        connection.execute("UPDATE job_lines SET checksum = checksum + 1 WHERE key = 'k2'")
    with pytest.warns(CacheWarning, match="damaged job line"):
        assert "k2" not in ledger.find(["k2"])
    # Anthropic: the batch names no intent; the record holding the job is the one repaired.
    adopted = ledger.adopt(provider="openai", backend=BACKEND, run="labels", lines=[("k2", ["k2"])],
                           status=JobStatus("batch_1", "in_progress", total=2), metadata={})
    assert adopted.intent == record.intent and adopted.requests == 2 and adopted.created == created.created
    assert ledger.find(["k2"])["k2"].intent == record.intent and len(ledger.jobs()) == 1


def test_forget_closes_a_job_whatever_its_state(ledger: Ledger) -> None:
    record = intent(ledger)
    ledger.record_created(record.intent, JobStatus("batch_1", "in_progress", total=2))
    with pytest.raises(LedgerError, match="cancel it before abandoning it"):
        ledger.abandon(record.intent, "gone")
    forgotten = ledger.forget(record.intent, "deleted at the provider")
    assert (forgotten.state, forgotten.note, forgotten.open) == ("abandoned", "deleted at the provider", False)
    assert ledger.find(["k0"]) == {} and ledger.forget(record.intent, "again") == forgotten
    with pytest.raises(LedgerError, match="no job intent"):
        ledger.forget("nope", "x")
