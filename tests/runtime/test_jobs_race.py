"""Two real processes in job mode on one cache file, against the fake provider running in a third.

Each process is ``tests/fixtures/jobs_race.py`` (the same graph, a 2 s lease);
one is paused at a step of its job (its heartbeat beating), stopped
(``SIGSTOP``: alive, its heartbeat frozen) or ``kill -9``-ed there while the
other runs. Every case asserts on the provider's own counts
(``GET /stats/batches``): each line paid once, none twice, none lost, no
live request; and the ledger holds no open job at the end.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.cache.ledger import Ledger
from outlines.common.errors import JobsRunning
from outlines.runtime.jobs import Jobs
from tests.fixtures.fake_batches import FakeBatches, FakeClock
from tests.fixtures.jobs_race import PROMPTS, STEPS, Racer
from tests.fixtures.subprocesses import ROOT, python_env

EXPECTED = [f"{prompt}#0" for prompt in PROMPTS]  # the fake's echo


@pytest.fixture
def server() -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    """The fake provider in a process of its own (real time x100): its URL and its counts."""
    process = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_batches", "--speed", "100"], cwd=ROOT,
                               env=python_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        process.stdout.readline()

        def stats() -> dict[str, Any]:
            with urllib.request.urlopen(url.rsplit("/v1", 1)[0] + "/stats/batches") as answer:
                return json.loads(answer.read())  # type: ignore[no-any-return]

        yield url, stats
    finally:
        process.terminate()
        process.wait(30)
        assert process.stdout is not None
        process.stdout.close()


@pytest.fixture
def children() -> Iterator[list[Racer]]:
    started: list[Racer] = []
    yield started
    for child in started:
        child.close()


def test_lease_timing_is_an_option_with_a_heartbeat_shorter_than_the_lease() -> None:
    assert (Jobs().lease, Jobs().heartbeat) == (60.0, 10.0)
    assert Jobs(lease=5.0, heartbeat=1.0) != Jobs()
    for bad in ({"lease": 0}, {"lease": True}, {"heartbeat": 0}, {"lease": 5.0, "heartbeat": 5.0}):
        with pytest.raises(ValueError, match="lease|heartbeat"):
            Jobs(**bad)


def test_a_round_lets_go_of_its_leases_when_it_returns_or_raises(tmp_path: Path) -> None:
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        with pytest.raises(JobsRunning):
            outlines.eval(llm(outlines.string("q")), givens={"q": PROMPTS}, cache=Cache(tmp_path), progress=False,
                          jobs=Jobs(wait=False, clock=clock))
    (record,) = outlines.jobs(cache=Cache(tmp_path))
    ledger = Ledger(Cache(tmp_path))
    assert record.job_id is not None and ledger.leased(record.intent) is None  # another process takes it at once
    ledger.close()


def paid_once(stats: dict[str, Any], folder: Path) -> None:
    assert stats["paid_twice"] == [] and stats["paid"] == len(PROMPTS), stats  # none twice, none lost
    assert stats["live"] == 0 and stats["counts"].get("batches.create") == 1, stats
    ledger = Ledger(Cache(folder))
    assert ledger.jobs(open=True) == []
    ledger.close()


@pytest.mark.slow
def test_a_second_process_waits_for_the_first_ones_upload_instead_of_paying_again(server: Any, children: list[Racer],
                                                                                 tmp_path: Path) -> None:
    url, stats = server
    first, second = Racer(url, tmp_path, "upload"), Racer(url, tmp_path)
    children += [first, second]
    first.go()
    assert first.reads("at upload")  # its file is at the provider, no job yet
    second.go()
    waited = second.reads("waiting")
    first.go()
    assert first.values() == EXPECTED and second.values() == EXPECTED
    paid_once(stats(), tmp_path)
    assert waited  # it saw the job's live lease, and read the draws from the cache once the first collected them


@pytest.mark.slow
def test_two_processes_started_at_once_send_each_line_once(server: Any, children: list[Racer],
                                                           tmp_path: Path) -> None:
    url, stats = server
    both = [Racer(url, tmp_path), Racer(url, tmp_path)]
    children += both
    for child in both:
        child.go()
    assert [child.values() for child in both] == [EXPECTED, EXPECTED]
    paid_once(stats(), tmp_path)


@pytest.mark.slow
def test_not_waiting_names_the_job_another_process_holds(server: Any, children: list[Racer], tmp_path: Path) -> None:
    url, stats = server
    first = Racer(url, tmp_path, "poll")
    children.append(first)
    first.go()
    assert first.reads("at poll")
    llm = models.openai("fake-model", base_url=url, api_key="sk-race", max_tokens=4)
    with pytest.raises(JobsRunning) as running:  # this process is the second: it does not wait, nor pay
        outlines.eval(llm(outlines.string("q")), givens={"q": PROMPTS}, cache=Cache(tmp_path), progress=False,
                      jobs=Jobs(wait=False))
    (record,) = outlines.jobs(cache=Cache(tmp_path))
    assert running.value.jobs == [record.job_id] and running.value.requests == len(PROMPTS)
    first.go()
    assert first.values() == EXPECTED
    paid_once(stats(), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["intent", "upload"])
def test_a_process_that_lost_its_lease_never_creates_the_job(server: Any, children: list[Racer], tmp_path: Path,
                                                              step: str) -> None:
    url, stats = server
    first, second = Racer(url, tmp_path, step), Racer(url, tmp_path, "create")
    children += [first, second]
    first.go()
    assert first.reads(f"at {step}")
    first.signal(signal.SIGSTOP)  # alive but frozen: its lease runs out
    second.go()
    assert second.reads("waiting") and second.reads("at create")  # it took the job over and created it
    first.signal(signal.SIGCONT)  # its heartbeat finds the lease lost and stops its own create
    second.go()
    assert second.values() == EXPECTED and first.values() == EXPECTED
    paid_once(stats(), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
def test_kill_9_of_the_holder_at_each_step_the_waiting_process_takes_over(server: Any, children: list[Racer],
                                                                         tmp_path: Path, step: str) -> None:
    url, stats = server
    first, second = Racer(url, tmp_path, step), Racer(url, tmp_path)
    children += [first, second]
    first.go()
    assert first.reads(f"at {step}")
    if step == "collected":  # closed: nothing to wait for, the draws are in the cache
        first.signal(signal.SIGKILL)
        second.go()
    else:
        second.go()
        assert second.reads("waiting")
        first.signal(signal.SIGKILL)
    assert second.values() == EXPECTED
    paid_once(stats(), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("step", ["waiting", "poll"])
def test_kill_9_of_the_waiting_process_before_or_after_it_took_over(server: Any, children: list[Racer],
                                                                   tmp_path: Path, step: str) -> None:
    url, stats = server
    # The first is killed once its job is created but not recorded; the second waits, takes it over, and is
    # killed while waiting (the first then lives on) or at its first poll of the job it found.
    first = Racer(url, tmp_path, "create")
    second = Racer(url, tmp_path, None if step == "waiting" else step)
    children += [first, second]
    first.go()
    assert first.reads("at create")
    second.go()
    assert second.reads("waiting")
    if step == "waiting":
        second.signal(signal.SIGKILL)
        first.go()
        assert first.values() == EXPECTED
    else:
        first.signal(signal.SIGKILL)
        assert second.reads(f"at {step}")
        second.signal(signal.SIGKILL)
        third = Racer(url, tmp_path)
        children.append(third)
        third.go()
        assert third.values() == EXPECTED
    paid_once(stats(), tmp_path)
