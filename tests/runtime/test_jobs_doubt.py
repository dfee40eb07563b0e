"""Every doubt about a job's fate is settled by asking the provider before anything is paid again.

Against the fake batch provider on 127.0.0.1 (a ``FakeClock`` that waiting
advances): a completed job without readable results, a create answered by an
error body, a lost Anthropic create among a stranger's batches, a job deleted
at the provider, a damaged ledger row and a deleted cache. Each test counts
what the provider was asked to run (``submitted``) and what it billed
(``paid()``): no line is paid twice unless the user says so (``forget_job``).
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import outlines
from outlines import models
from outlines.draws import Draw, DrawColumns
from outlines.backends.jobs import job_client
from outlines.cache import Cache, draw_keys
from outlines.cache.ledger import Ledger
from outlines.common.errors import JobsRunning, NodeError
from tests.fixtures.fake_batches import FakeBatches, FakeClock, JobPlan, Made
from tests.fixtures.fake_openai import Status
from tests.runtime.test_jobs import CREATE, PROVIDERS, _draws, cache, clock, jobs, model, reply, server

pytestmark = [pytest.mark.filterwarnings("ignore:outlines cache. a damaged job record"),
              pytest.mark.filterwarnings("ignore:outlines cache. .* damaged job line")]


PROMPTS = ["a", "b", "c"]
EXPECTED = [f"<{p}|None|0>" for p in PROMPTS]


def once(server: FakeBatches, lines: int = len(PROMPTS)) -> None:
    """Every line was sent in one job and paid once."""
    assert len(server.submitted) == lines and set(server.submitted.values()) == {1}
    assert len(server.paid()) == lines and set(server.paid().values()) == {1}


# -- 2. a completed job whose results cannot be read ---------------------------------------------------


@pytest.mark.parametrize("provider,unreadable", [("openai", "empty"), ("openai", "absent"), ("anthropic", "empty")])
def test_a_completed_job_whose_results_cannot_be_read_stops_and_is_not_bought_again(
        server: FakeBatches, clock: FakeClock, cache: Cache, provider: str, unreadable: str) -> None:
    server.plan(JobPlan(unreadable=unreadable))
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    for _ in range(2):  # a re-run reads the same job again: it buys nothing either
        with pytest.raises(NodeError, match="paid answer.s. cannot be read") as caught:
            outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)
        assert "forget_job" in str(caught.value)
        assert server.counts[CREATE[provider]] == 1
        once(server)
    (record,) = outlines.jobs(cache=cache)  # kept open, named in the error
    assert record.state == "completed" and record.job_id in str(caught.value)
    # The way out, when the user knows the results are gone: forget the job; its lines are bought again.
    assert outlines.forget_job(record.job_id or "", cache=cache).state == "abandoned"
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    assert server.counts[CREATE[provider]] == 2 and outlines.jobs(cache=cache) == []


def test_an_ended_batch_without_its_results_url_is_read_at_the_documented_path(
        server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    server.plan(JobPlan(unreadable="absent"))
    out = model(server, "anthropic")(outlines.string("q"), max_tokens=4)
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    once(server)


@PROVIDERS
def test_unread_lines_that_no_count_explains_go_again_once_then_stop(server: FakeBatches, clock: FakeClock,
                                                                     cache: Cache, provider: str) -> None:
    # A server that reports no counts: nothing says whether the unread lines were answered.
    server.plan(*[JobPlan(unreadable="empty", counts=False)] * 3)
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    with pytest.raises(NodeError, match="gives no counts.*sent again once already"):
        outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)
    assert server.counts[CREATE[provider]] == 2 and set(server.submitted.values()) == {2}
    with pytest.raises(NodeError, match="gives no counts"):  # the re-run reads the open job: no third
        outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)
    assert server.counts[CREATE[provider]] == 2


@PROVIDERS
def test_unread_lines_the_counts_say_were_not_answered_go_again(server: FakeBatches, clock: FakeClock,
                                                                cache: Cache, provider: str) -> None:
    # The job expires before it starts: its (empty) results name nothing, and its counts say nothing ran.
    server.plan(JobPlan(validate_s=2.0, expire_s=1.0, unreadable="empty"))
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    assert server.counts[CREATE[provider]] == 2
    assert len(server.paid()) == 3 and set(server.paid().values()) == {1}


# -- 3. a create answered by an error body --------------------------------------------------------------


@PROVIDERS
def test_a_create_answered_by_an_error_body_is_looked_up_not_paid_again(server: FakeBatches, clock: FakeClock,
                                                                        cache: Cache, provider: str) -> None:
    error = {"error": {"message": "internal error", "type": "server_error"}}
    server.script_route(CREATE[provider], Made(Status(200, body=error)))  # made, then answered by an error
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    assert server.counts[CREATE[provider]] == 1
    once(server)
    assert [r.state for r in Ledger(cache).jobs()] == ["collected"]


# -- 4. Anthropic: a lost create among a stranger's batches of the same size ------------------------------


def test_anthropic_rerun_after_a_lost_create_takes_its_own_batch_not_a_strangers(
        server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    m = model(server, "anthropic")
    out = m(outlines.string("q"), max_tokens=4)
    backend = out.owner.op.backend
    client = job_client(backend)
    # Another program's batch of the same size, created first (and finished first).
    stranger = m(outlines.string("q"), max_tokens=5).owner.op
    other = DrawColumns.of([Draw(p, stranger.params, 0) for p in ["x", "y", "z"]])
    theirs = client.lines(other, draw_keys(backend.cache_identities[0], other))
    # What a process killed between create and the ledger write leaves: an intent, a batch, no id.
    draws = DrawColumns.of(_draws(out, PROMPTS))
    lines = client.lines(draws, draw_keys(backend.cache_identities[0], draws))
    record = Ledger(cache).record_intent(provider="anthropic", backend=list(backend.identity), run="outlines",
                                         lines=[(line.custom_id, line.keys) for line in lines])
    server.plan(JobPlan(run_s=2.0), JobPlan(run_s=20.0))

    async def create_both() -> list[str]:
        try:
            made = [(await client.create(theirs, {})).id]
            clock.advance(1.0)
            return made + [(await client.create(lines, {})).id]
        finally:
            await client.aclose()

    stranger_id, ours_id = asyncio.run(create_both())
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    assert server.counts["message_batches.create"] == 2  # nothing re-sent
    assert Ledger(cache).get(record.intent).job_id == ours_id  # type: ignore[union-attr]
    assert stranger_id not in {r.job_id for r in Ledger(cache).jobs()}
    assert set(server.paid().values()) == {1} and len(server.paid()) == 6


def test_anthropic_without_waiting_names_the_batches_it_cannot_tell_apart(server: FakeBatches, clock: FakeClock,
                                                                          cache: Cache) -> None:
    server.script_route("message_batches.create", Made(Status(200, body={"type": "error"})))
    out = model(server, "anthropic")(outlines.string("q"), max_tokens=4)
    with pytest.raises(NodeError, match="msgbatch_fake.* may be the one") as caught:
        outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock, wait=False), cache=cache)
    assert list(server.jobs)[0] in str(caught.value) and server.counts["message_batches.create"] == 1
    (record,) = outlines.jobs(cache=cache)  # the intent is kept: the next run settles it
    assert record.state == "intent"
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    once(server)


# -- 6. a job deleted at the provider ------------------------------------------------------------------


@PROVIDERS
def test_a_job_deleted_at_the_provider_stops_with_a_way_out(server: FakeBatches, clock: FakeClock, cache: Cache,
                                                            provider: str) -> None:
    server.plan(JobPlan(run_s=100.0))
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    with pytest.raises(JobsRunning) as running:
        outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock, wait=False), cache=cache)
    (job_id,) = running.value.jobs
    server.delete(job_id)
    for wait in (True, False, True):
        with pytest.raises(NodeError, match="unknown to the provider .404") as caught:
            outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock, wait=wait), cache=cache)
        assert job_id in str(caught.value) and f"outlines.forget_job('{job_id}')" in str(caught.value)
        assert server.counts[CREATE[provider]] == 1
    outlines.forget_job(job_id, cache=cache)
    assert list(outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)) == EXPECTED
    assert server.counts[CREATE[provider]] == 2
    # Both jobs were recorded at the same moment of the fake clock: found by id, not by order.
    (record,) = [r for r in outlines.jobs(cache=cache, open=False, run="outlines") if r.job_id == job_id]
    assert record.job_id == job_id and record.state == "abandoned" and record.note == "forgotten by its owner"
    with pytest.raises(ValueError, match="no job 'batch_nope'"):
        outlines.forget_job("batch_nope", cache=cache)


# -- 10 and 11. a damaged ledger row, a deleted cache ---------------------------------------------------


def _damage(cache: Cache, table: str) -> None:
    with sqlite3.connect(cache.file) as connection:
        connection.execute(f"UPDATE {table} SET checksum = checksum + 1")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("fault", ["damaged row", "damaged lines", "deleted cache"])
def test_a_job_the_ledger_lost_is_found_at_the_provider_not_paid_again(
        server: FakeBatches, clock: FakeClock, tmp_path: Path, provider: str, fault: str) -> None:
    folder = tmp_path / "cache"
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    with pytest.raises(JobsRunning):
        outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock, wait=False), cache=Cache(folder))
    if provider == "anthropic":  # a batch carries no metadata: it is known by its results once it ended
        clock.advance(60.0)
    if fault == "deleted cache":
        shutil.rmtree(folder)
    else:
        _damage(Cache(folder), "jobs" if fault == "damaged row" else "job_lines")
    cache = Cache(folder)
    with outlines.trace() as trace:
        value = outlines.eval(out, givens={"q": PROMPTS}, jobs=jobs(clock), cache=cache)
    assert list(value) == EXPECTED
    assert server.counts[CREATE[provider]] == 1
    once(server)
    assert [j.resumed for j in trace.jobs] == [True]  # the run says it found the job
    (record,) = Ledger(cache).jobs()
    assert record.job_id == list(server.jobs)[0] and record.state == "collected"


def test_a_stranger_job_of_the_same_run_with_other_requests_is_left_alone(server: FakeBatches, clock: FakeClock,
                                                                          cache: Cache, tmp_path: Path) -> None:
    # Another cache ran the same prompts with other samples: same first custom_id, another request (n).
    m = model(server, "openai")
    q = outlines.string("q")
    outlines.eval(m(q, num_samples=3, temperature=0.7, max_tokens=4), givens={"q": PROMPTS}, jobs=jobs(clock),
                  cache=Cache(tmp_path / "other"))
    value = outlines.eval(m(q, num_samples=2, temperature=0.7, max_tokens=4), givens={"q": PROMPTS},
                          jobs=jobs(clock), cache=cache)
    assert value.shape == (3, 2) and server.counts["batches.create"] == 2


#: An evaluating process on Anthropic that SIGKILLs itself after its batch was created, before the ledger
#: heard of it (with ``die``), or runs to the end and prints its values.
CHILD = r'''
import json, os, signal, sys
import outlines
from outlines import models
from outlines import models
from outlines.backends.jobs import Backoff
from outlines.cache import Cache
from outlines.cache.ledger import Ledger
from outlines.runtime.jobs import Jobs

url, folder, step = sys.argv[1], sys.argv[2], sys.argv[3]
if step == "die":
    def record_created(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    Ledger.record_created = record_created
m = models.anthropic("claude-fake", base_url=url, api_key="sk-ant-child")
out = m(outlines.string("q"), max_tokens=4)
value = outlines.eval(out, givens={"q": [f"p{i}" for i in range(4)]}, cache=Cache(folder),
                      jobs=Jobs(backoff=Backoff(first=0.02, cap=0.05)))
print(json.dumps(list(value)))
'''


def test_anthropic_kill_9_after_create_then_a_rerun_takes_its_own_batch(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from tests.fixtures.subprocesses import python_env

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = python_env()
    with FakeBatches(speed=100.0, reply=reply) as server:
        def child(step: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, str(script), server.anthropic_url, str(tmp_path / "cache"), step],
                                  capture_output=True, text=True, env=env, timeout=120)

        # Another program's batch of the same size, started just before: the re-run must not take it.
        stranger = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key="sk-ant-other")
        with pytest.raises(JobsRunning):
            outlines.eval(stranger(outlines.string("q"), max_tokens=5), givens={"q": ["w", "x", "y", "z"]},
                          jobs=outlines.Jobs(wait=False), cache=Cache(tmp_path / "other"))
        killed = child("die")
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        done = child("never")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == [f"<p{i}|None|0>" for i in range(4)]
        assert server.counts["message_batches.create"] == 2 and server.count == 0
        ours = [job for job in server.jobs.values() if job.lines[0].body["max_tokens"] == 4]
        assert len(ours) == 1 and all(line.custom_id in server.paid() for line in ours[0].lines)
        assert set(server.submitted.values()) == {1}
        (record,) = Ledger(tmp_path / "cache" / "draws-v2.sqlite3").jobs()
        assert record.job_id == ours[0].id and record.state == "collected"
