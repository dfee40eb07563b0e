"""Two real processes in job mode on one cache file, against the fake provider running in a third.

Each process is ``tests/fixtures/jobs_race.py`` (the same graph, a 2 s lease);
one is paused at a step of its job (its heartbeat beating), stopped
(``SIGSTOP``: alive, its heartbeat frozen) or ``kill -9``-ed there while the
other runs. Every case asserts on the provider's own counts
(``GET /stats/batches``): each line paid once, none twice, none lost, no
live request; and the ledger holds no open job at the end.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import outlines
from outlines import models
from outlines.backends.jobs import Backoff, job_client
from outlines.backends.jobs.openai import OpenAIJobs
from outlines.cache import Cache, draw_keys
from outlines.cache.ledger import Ledger
from outlines.common.errors import CacheWarning, Failure, JobsRunning
from outlines.draws import Draw, DrawColumns
from outlines.runtime.jobs import Jobs
from tests.fixtures.fake_batches import FakeBatches, FakeClock, JobPlan
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


class Held:
    """One process's view of a shared ``FakeClock`` whose first wait on it (after its job's first poll) stops until
    ``go()``: a machine so loaded that its lease runs out meanwhile. Nothing here depends on real time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.parked, self.going = clock, threading.Event(), threading.Event()

    def time(self) -> float:
        return self.clock.time()

    async def sleep(self, seconds: float) -> None:
        if not self.going.is_set():
            self.parked.set()
            await asyncio.get_running_loop().run_in_executor(None, self.going.wait)
        await self.clock.sleep(seconds)

    def go(self) -> None:
        self.going.set()


#: A heartbeat (real seconds) that never beats within a test: only the interleaving the test drives happens.
STILL: dict[str, Any] = {"backoff": Backoff(first=1.0, cap=5.0), "lease": 100.0, "heartbeat": 99.0}


class Process:
    """An evaluation of ``PROMPTS`` in job mode on a thread of its own, its own ``Cache`` and ``Ledger``
    (a holder of leases, as another process would be), its jobs' clock ``Held``."""

    def __init__(self, llm: Any, folder: Path, clock: FakeClock, parked: threading.Event | None = None) -> None:
        self.clock = Held(clock)
        self.outcome: dict[str, Any] = {}
        out = llm(outlines.string("q"))
        jobs = Jobs(clock=self.clock, **STILL)
        self.thread = threading.Thread(target=self.evaluate, args=(out, folder, jobs), daemon=True)
        self.thread.start()
        assert (parked or self.clock.parked).wait(60), "it never got there"

    def evaluate(self, out: Any, folder: Path, jobs: Jobs) -> None:
        try:
            self.outcome["value"] = list(outlines.eval(out, givens={"q": PROMPTS}, cache=Cache(folder),
                                                       progress=False, jobs=jobs, errors="return"))
        except BaseException as error:  # handed to the test
            self.outcome["error"] = error

    def result(self) -> dict[str, Any]:
        self.clock.go()
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.outcome


def each_line_paid_once(fake: FakeBatches, creates: int = 1, ran: bool = True) -> None:
    """``creates`` jobs of all of ``PROMPTS`` (``ran``: each line run and paid in each; else none), nothing live."""
    assert fake.counts["batches.create"] == creates and fake.count == 0, fake.counts
    lines = len(PROMPTS) if ran else 0  # each line (custom_id: a draw's key) sent in each job, paid once each
    assert len(fake.submitted) == lines and set(fake.submitted.values()) <= {creates}, fake.submitted
    assert fake.paid() == fake.submitted


def line_ids(out: Any) -> list[str]:
    """The custom ids of ``PROMPTS``' lines in a job of ``out``'s model call: their draws' cache keys."""
    op: Any = out.owner.op
    return [key.hex() for key in draw_keys(op.backend.cache_identities[0],
                                           [Draw(prompt, op.params, 0) for prompt in PROMPTS])]


@pytest.mark.parametrize("state", ["collected", "error lines", "failed"])
def test_a_process_whose_lease_ran_out_while_polling_defers_to_the_one_that_closed_its_job(tmp_path: Path,
                                                                                        state: str) -> None:
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        out = llm(outlines.string("q"))
        keys = line_ids(out)
        if state == "failed":
            fake.plan(JobPlan(fail="line 1: the model fake-model does not exist"))
        elif state == "error lines":  # p0 a 500 (it goes again, in a second job), p1 a 400 (it fails)
            fake.plan(JobPlan(errors={keys[0]: 500, keys[1]: 400}))
        first = Process(llm, tmp_path, clock)  # its job created and polled once; it stops before the next poll
        (record,) = outlines.jobs(cache=Cache(tmp_path))
        assert record.job_id is not None and record.state == "validating"
        clock.advance(3600.0)  # no heartbeat for an hour: its lease ran out, and the job ended at the provider
        second = outlines.eval(out, givens={"q": PROMPTS}, cache=Cache(tmp_path), progress=False,
                               jobs=Jobs(clock=clock, **STILL), errors="return")
        ledger = Ledger(Cache(tmp_path))
        closed = ledger.get(record.intent)  # the second took the job over, collected it and closed it
        ledger.close()
        assert closed is not None and closed.state == ("abandoned" if state == "failed" else "collected")
        values = first.result()["value"]  # the first goes on from the ledger's word: no error of its own
        if state == "failed":  # it fails the draws as the second did, quoting the provider, and sends nothing
            assert all(isinstance(v, Failure) and "does not exist" in v.message for v in [*values, *second])
            each_line_paid_once(fake, ran=False)
        elif state == "error lines":  # it lands what the second cached, and reads the 400 in the job's results
            for got in (values, list(second)):
                assert isinstance(got[1], Failure) and "400" in got[1].message, got
                assert [got[0], *got[2:]] == [EXPECTED[0], *EXPECTED[2:]]
            assert fake.counts["batches.create"] == 2 and fake.count == 0  # the 500 line went again once
            assert set(fake.submitted.values()) == {1, 2} and fake.submitted[keys[0]] == 2
            assert set(fake.paid().values()) == {1} and len(fake.paid()) == len(PROMPTS) - 1
        else:
            assert values == list(second) == EXPECTED  # it lands what the second cached
            each_line_paid_once(fake)
        assert outlines.jobs(cache=Cache(tmp_path)) == []


def test_a_job_the_ledger_says_ended_but_the_provider_says_runs_sends_nothing_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        out = llm(outlines.string("q"))
        keys = line_ids(out)
        fake.plan(JobPlan(errors={keys[1]: 400}))  # p1 fails: the cache lacks it after the second collects
        first = Process(llm, tmp_path, clock)
        clock.advance(3600.0)
        second = outlines.eval(out, givens={"q": PROMPTS}, cache=Cache(tmp_path), progress=False,
                               jobs=Jobs(clock=clock, **STILL), errors="return")
        real = OpenAIJobs.status

        async def running(client: OpenAIJobs, *args: Any, **kwargs: Any) -> Any:
            return dataclasses.replace(await real(client, *args, **kwargs), state="in_progress")

        monkeypatch.setattr(OpenAIJobs, "status", running)  # the provider now says the collected job runs
        values = first.result()["value"]
        assert [values[0], *values[2:]] == [EXPECTED[0], *EXPECTED[2:]] == [second[0], *list(second)[2:]]
        assert isinstance(values[1], Failure) and "in_progress" in values[1].message
        assert "forget_job" in values[1].message
        # The failed line was not sent again: one job, each line sent in it once, nothing live.
        assert fake.counts["batches.create"] == 1 and fake.count == 0, fake.counts
        assert len(fake.submitted) == len(PROMPTS) and set(fake.submitted.values()) == {1}
        assert outlines.jobs(cache=Cache(tmp_path)) == []


def test_a_poll_that_finds_its_lease_taken_waits_for_the_new_holder_who_finds_it_closed_in_turn(
        tmp_path: Path) -> None:
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        fake.plan(JobPlan(run_s=1000.0))  # still running when the second takes it over
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        first = Process(llm, tmp_path, clock)
        clock.advance(STILL["lease"] + 1.0)  # the first's lease ran out
        second = Process(llm, tmp_path, clock)  # took the job over: polled it once, and stops
        ledger = Ledger(Cache(tmp_path))
        (record,) = ledger.jobs()
        lease = ledger.leased(record.intent)
        ledger.close()
        assert lease is not None and record.state == "in_progress"
        # The first polls again and finds the second's lease: it waits for it, looking at the ledger every
        # heartbeat (no heartbeat comes), until that lease runs out; then it takes the job back, collects and
        # closes it. The second's next poll finds it closed.
        looked = len(clock.slept)
        assert first.result() == {"value": EXPECTED}
        assert STILL["heartbeat"] in clock.slept[looked:]
        assert second.result() == {"value": EXPECTED}
        each_line_paid_once(fake)
        assert outlines.jobs(cache=Cache(tmp_path)) == []


@pytest.mark.parametrize("fault", ["damaged row", "forgotten"])
def test_a_poll_that_finds_its_job_gone_from_the_ledger_defers_to_the_ledger(tmp_path: Path, fault: str) -> None:
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        first = Process(llm, tmp_path, clock)
        (record,) = outlines.jobs(cache=Cache(tmp_path))
        if fault == "damaged row":  # the ledger lost the job while it was polled: it is recorded again, collected
            with sqlite3.connect(Cache(tmp_path).file) as connection:
                connection.execute("UPDATE jobs SET checksum = checksum + 1")
            with pytest.warns(CacheWarning, match="damaged job record"):
                assert first.result() == {"value": EXPECTED}
            each_line_paid_once(fake)
        else:  # its owner closed it (forget_job): its draws go again, as for any later run (forget_job says so)
            outlines.forget_job(record.job_id or "", cache=Cache(tmp_path))
            assert first.result() == {"value": EXPECTED}
            each_line_paid_once(fake, creates=2)
        (record,) = [r for r in outlines.jobs(cache=Cache(tmp_path), open=None) if r.state == "collected"]
        assert outlines.jobs(cache=Cache(tmp_path)) == []


class Stall:
    """``OpenAIJobs.<name>``'s first call answers (or, ``lost``, says it found nothing), then stalls until ``go()``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, name: str, lost: bool = False) -> None:
        self.reached, self.going = threading.Event(), threading.Event()
        real = getattr(OpenAIJobs, name)

        async def stalled(client: OpenAIJobs, *args: Any, **kwargs: Any) -> Any:
            answer = await real(client, *args, **kwargs)
            if self.reached.is_set():
                return answer
            self.reached.set()
            await asyncio.get_running_loop().run_in_executor(None, self.going.wait)
            return None if lost else answer

        monkeypatch.setattr(OpenAIJobs, name, stalled)

    def go(self) -> None:
        self.going.set()


def test_a_create_that_returns_after_another_process_took_the_job_over_and_closed_it_lands_its_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    create = Stall(monkeypatch, "create")
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        first = Process(llm, tmp_path, clock, parked=create.reached)  # the job is made; its id not recorded
        clock.advance(3600.0)  # the first's lease ran out; the job ended
        # The second takes the intent over, finds the job by its metadata, collects it and closes it.
        second = outlines.eval(llm(outlines.string("q")), givens={"q": PROMPTS}, cache=Cache(tmp_path),
                               progress=False, jobs=Jobs(clock=clock, **STILL))
        assert list(second) == EXPECTED
        assert [r.state for r in outlines.jobs(cache=Cache(tmp_path), open=None)] == ["collected"]
        create.go()  # the first's create returns: the ledger holds that job, closed; its draws are cached
        assert first.result() == {"value": EXPECTED}
        each_line_paid_once(fake)


@pytest.mark.parametrize("found", [True, False])
def test_a_takeover_whose_look_at_the_provider_returns_after_another_took_the_job_over_lands_its_draws(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, found: bool) -> None:
    clock = FakeClock()
    with FakeBatches(clock=clock) as fake:
        llm = models.openai("fake-model", base_url=fake.base_url, api_key="sk-race", max_tokens=4)
        out = llm(outlines.string("q"))
        # What a process killed between create and the ledger write leaves: an intent, a job, no id.
        op: Any = out.owner.op  # type: ignore[union-attr]
        backend = op.backend
        draws = DrawColumns.of([Draw(prompt, op.params, 0) for prompt in PROMPTS])
        client = job_client(backend)
        lines = client.lines(draws, draw_keys(backend.cache_identities[0], draws))
        dead = Ledger(Cache(tmp_path), clock=clock.time)
        record = dead.record_intent(provider="openai", backend=list(backend.identity), run="outlines",
                                    lines=[(line.custom_id, line.keys) for line in lines])
        dead.close()

        async def made() -> None:
            try:
                await client.create(lines, record.metadata)
            finally:
                await client.aclose()

        asyncio.run(made())
        clock.advance(3600.0)  # the dead process's lease ran out; its job ended
        # The first takes the intent over and asks the provider (found, or not yet listed), then stalls.
        find = Stall(monkeypatch, "find", lost=not found)
        first = Process(llm, tmp_path, clock, parked=find.reached)
        clock.advance(3600.0)  # and its lease runs out too: the second takes over, finds, collects, closes
        second = outlines.eval(out, givens={"q": PROMPTS}, cache=Cache(tmp_path), progress=False,
                               jobs=Jobs(clock=clock, **STILL))
        assert list(second) == EXPECTED
        assert [r.state for r in outlines.jobs(cache=Cache(tmp_path), open=None)] == ["collected"]
        find.go()
        assert first.result() == {"value": EXPECTED}
        each_line_paid_once(fake)


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
def test_a_process_stopped_while_polling_lands_what_the_one_that_took_over_collected(
        server: Any, children: list[Racer], tmp_path: Path) -> None:
    url, stats = server
    first, second = Racer(url, tmp_path, "poll"), Racer(url, tmp_path)
    children += [first, second]
    first.go()
    assert first.reads("at poll")  # it read its job's first status, not yet kept in the ledger
    first.signal(signal.SIGSTOP)  # alive but frozen (a loaded machine): its lease runs out
    second.go()
    assert second.reads("waiting")  # it waits for the live lease, then takes the job over, collects, closes
    assert second.values() == EXPECTED
    first.signal(signal.SIGCONT)
    first.go()  # its poll answers: the job is closed in the ledger, its draws in the cache
    assert first.values() == EXPECTED
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
