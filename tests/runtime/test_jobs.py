"""Job mode (``eval(..., jobs=Jobs(...))``) against the fake batch provider on 127.0.0.1.

The server runs its jobs on a ``FakeClock`` that the evaluation's waiting
advances: nothing really sleeps. Every assertion counts what the server was
asked (uploads, creates, polls, downloads, live requests, lines paid).
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import outlines
from outlines import models
from outlines.backends.jobs import Backoff, job_client
from outlines.cache import Cache
from outlines.cache.ledger import Ledger
from outlines.common.errors import Failure, JobsRunning, NodeError
from outlines.runtime.jobs import Jobs
from tests.fixtures.fake_batches import FakeBatches, FakeClock, JobPlan

KEY = "sk-jobs-SECRET-0123456789"
PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])
CREATE = {"openai": "batches.create", "anthropic": "message_batches.create"}


def reply(prompt: str, sample: int, body: Any) -> str:
    """Deterministic: the same request gets the same answer, live or in a job."""
    return f"<{prompt}|{body.get('seed')}|{sample}>"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[FakeBatches]:
    with FakeBatches(clock=clock, reply=reply) as fake:
        yield fake


@pytest.fixture
def cache(tmp_path: Path) -> Cache:
    return Cache(tmp_path / "cache")


def model(server: FakeBatches, provider: str) -> Any:
    if provider == "openai":
        return models.openai("fake-model", base_url=server.base_url, api_key=KEY)
    return models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY)


def two_levels(m: Any, **params: Any) -> Any:
    q = outlines.string("q")
    return m("then " + m(q, **params), **params)


def jobs(clock: FakeClock, **options: Any) -> Jobs:
    return Jobs(clock=clock, backoff=Backoff(first=1.0, cap=5.0), **options)


@PROVIDERS
def test_each_round_is_one_job_and_nothing_goes_live(server: FakeBatches, clock: FakeClock, cache: Cache,
                                                     provider: str) -> None:
    m = model(server, provider)
    out = two_levels(m, max_tokens=8)
    prompts = [f"p{i}" for i in range(20)]
    value = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache)
    assert list(value) == [f"<then <{p}|None|0>|None|0>" for p in prompts]
    assert server.count == 0  # no live request
    assert server.counts[CREATE[provider]] == 2  # depth 2: two rounds, one job each
    assert set(server.paid().values()) == {1} and len(server.paid()) == 40
    # Every job is closed in the ledger, and a re-run is answered by the cache alone.
    assert [r.state for r in Ledger(cache).jobs()] == ["collected", "collected"]
    again = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache)
    assert list(again) == list(value) and server.counts[CREATE[provider]] == 2


def test_samples_and_shuffled_results_land_on_their_draws(server: FakeBatches, clock: FakeClock,
                                                          cache: Cache) -> None:
    m = model(server, "openai")
    q = outlines.string("q")
    out = m(q, num_samples=3, temperature=0.7, seed=5, max_tokens=8)
    value = outlines.eval(out, givens={"q": ["a", "b", "c", "d"]}, jobs=jobs(clock), cache=cache)
    live = outlines.eval(out, givens={"q": ["a", "b", "c", "d"]}, cache=False)
    assert value.tolist() == live.tolist()  # the same requests, so the same texts, in the right places
    assert server.counts["batches.create"] == 1 and server.count == 4


def test_a_round_splits_only_at_the_limits(clock: FakeClock, cache: Cache) -> None:
    with FakeBatches(clock=clock, reply=reply, openai_limits=(4, 10_000_000)) as server:
        m = model(server, "openai")
        out = m(outlines.string("q"), max_tokens=4)
        outlines.eval(out, givens={"q": [f"p{i}" for i in range(10)]}, jobs=jobs(clock, max_requests=4), cache=cache)
        assert server.counts["batches.create"] == 3 and server.count == 0


def test_other_backends_stay_live_in_batch_mode(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    upper = outlines.fn(str.upper)
    m = model(server, "openai")
    out = upper(m(outlines.string("q"), max_tokens=4))
    assert outlines.eval(out, givens={"q": "x"}, jobs=jobs(clock), cache=cache) == "<X|NONE|0>"
    assert server.counts["batches.create"] == 1


def test_batch_mode_needs_a_cache_and_a_valid_option(server: FakeBatches, clock: FakeClock) -> None:
    out = model(server, "openai")(outlines.string("q"))
    with pytest.raises(NodeError, match="job mode needs a cache"):
        outlines.eval(out, givens={"q": "x"}, jobs=jobs(clock), cache=False)
    with pytest.raises(TypeError, match="jobs= must be True, False or outlines.Jobs"):
        outlines.eval(out, givens={"q": "x"}, jobs="yes")
    with pytest.raises(ValueError, match="deadline"):
        Jobs(deadline=-1)
    with pytest.raises(ValueError, match="at most 512 characters"):  # it travels as a metadata value
        Jobs(run="r" * 513)
    assert Jobs(run="r" * 512).run == "r" * 512


# -- durability -----------------------------------------------------------------------------------


@PROVIDERS
def test_submit_returns_at_once_and_a_later_call_collects(server: FakeBatches, clock: FakeClock, cache: Cache,
                                                          provider: str) -> None:
    m = model(server, provider)
    out = m(outlines.string("q"), max_tokens=4)
    prompts = ["a", "b", "c"]
    with pytest.raises(JobsRunning, match="call again to collect") as raised:
        outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, wait=False), cache=cache)
    assert len(raised.value.jobs) == 1 and raised.value.requests == 3
    assert [r.state in ("validating", "in_progress") for r in Ledger(cache).jobs()] == [True]
    # Asking again without waiting still pays nothing more.
    with pytest.raises(JobsRunning):
        outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, wait=False), cache=cache)
    value = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache)
    assert list(value) == [f"<{p}|None|0>" for p in prompts]
    assert server.counts[CREATE[provider]] == 1 and set(server.paid().values()) == {1}


def test_a_job_created_before_the_ledger_heard_of_it_is_found_not_paid_again(
        server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    m = model(server, "openai")
    out = m(outlines.string("q"), max_tokens=4)
    prompts = ["a", "b"]
    # What a process killed between create and the ledger write leaves: an intent, a job, no id.
    backend = out.owner.op.backend
    client = job_client(backend)
    ledger = Ledger(cache)
    from outlines.draws import DrawColumns
    from outlines.cache import draw_keys
    draws = DrawColumns.of([d for d in _draws(out, prompts)])
    lines = client.lines(draws, draw_keys(backend.cache_identities[0], draws))
    record = ledger.record_intent(provider="openai", backend=list(backend.identity), run="outlines",
                                  lines=[(line.custom_id, line.keys) for line in lines])
    created = asyncio.run(_create(client, lines, record.metadata))
    value = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache)
    assert list(value) == ["<a|None|0>", "<b|None|0>"]
    assert server.counts["batches.create"] == 1  # the lost job was found, not made again
    assert Ledger(cache).get(record.intent).job_id == created  # type: ignore[union-attr]


def test_an_intent_never_created_is_abandoned_and_sent(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    m = model(server, "openai")
    out = m(outlines.string("q"), max_tokens=4)
    backend = out.owner.op.backend
    client = job_client(backend)
    from outlines.draws import DrawColumns
    from outlines.cache import draw_keys
    draws = DrawColumns.of(_draws(out, ["a"]))
    lines = client.lines(draws, draw_keys(backend.cache_identities[0], draws))
    record = Ledger(cache).record_intent(provider="openai", backend=list(backend.identity), run="outlines",
                                         lines=[(line.custom_id, line.keys) for line in lines])
    assert outlines.eval(out, givens={"q": ["a"]}, jobs=jobs(clock), cache=cache).tolist() == ["<a|None|0>"]
    assert Ledger(cache).get(record.intent).state == "abandoned"  # type: ignore[union-attr]
    assert server.counts["batches.create"] == 1


def _draws(out: Any, prompts: list[str]) -> list[Any]:
    from outlines.draws import Draw
    params = out.owner.op.params
    return [Draw(p, params, 0) for p in prompts]


async def _create(client: Any, lines: Any, metadata: Any) -> str:
    try:
        return str((await client.create(lines, metadata)).id)
    finally:
        await client.aclose()


# -- faults ---------------------------------------------------------------------------------------


@PROVIDERS
def test_an_expired_job_keeps_its_half_and_only_the_rest_goes_again(server: FakeBatches, clock: FakeClock,
                                                                     cache: Cache, provider: str) -> None:
    # Validating 1 s, running 10 s: it expires at 6 s, half its lines done.
    server.plan(JobPlan(validate_s=1.0, run_s=10.0, expire_s=6.0))
    m = model(server, provider)
    prompts = [f"p{i}" for i in range(10)]
    value = outlines.eval(m(outlines.string("q"), max_tokens=4), givens={"q": prompts}, jobs=jobs(clock),
                          cache=cache)
    assert list(value) == [f"<{p}|None|0>" for p in prompts]
    first, second = sorted(server.jobs.values(), key=lambda job: job.created)
    assert len(first.lines) == 10 and len(second.lines) == 5
    assert {line.custom_id for line in second.lines}.isdisjoint(first.lines[i].custom_id for i in first.done(clock.now))
    assert set(server.paid().values()) == {1} and len(server.paid()) == 10


@PROVIDERS
def test_error_lines_follow_the_retry_policy(server: FakeBatches, clock: FakeClock, cache: Cache,
                                             provider: str) -> None:
    m = model(server, provider)
    out = m(outlines.string("q"), max_tokens=4)
    backend = out.owner.op.backend
    from outlines.cache import draw_keys
    keys = [k.hex() for k in draw_keys(backend.cache_identities[0], _draws(out, ["a", "b", "c"]))]
    # "a" fails once with a 500 (retryable: it goes again), "b" with a 400 (it fails).
    server.plan(JobPlan(errors={keys[0]: 500, keys[1]: 400}))
    value = outlines.eval(out, givens={"q": ["a", "b", "c"]}, jobs=jobs(clock), cache=cache, errors="return")
    assert value[0] == "<a|None|0>" and value[2] == "<c|None|0>"
    assert isinstance(value[1], Failure) and "400" in value[1].message
    assert server.counts[CREATE[provider]] == 2 and len(list(server.jobs.values())[-1].lines) == 1


@PROVIDERS
def test_a_failed_job_quotes_the_provider(server: FakeBatches, clock: FakeClock, cache: Cache, provider: str) -> None:
    server.plan(JobPlan(fail="line 1: the model fake-model does not exist"))
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    with pytest.raises(NodeError, match="does not exist"):
        outlines.eval(out, givens={"q": ["a"]}, jobs=jobs(clock), cache=cache)
    # OpenAI's job ends failed, Anthropic refuses the create: either way the ledger holds nothing open.
    assert [(r.state, r.note is not None) for r in Ledger(cache).jobs()] == [("abandoned", True)]


def test_a_malformed_results_file_is_a_clear_error_and_the_ledger_keeps_the_job(
        server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    server.plan(JobPlan(malformed=1))
    out = model(server, "openai")(outlines.string("q"), max_tokens=4)
    with pytest.raises(NodeError, match="malformed line"):
        outlines.eval(out, givens={"q": ["a", "b"]}, jobs=jobs(clock), cache=cache)
    (record,) = Ledger(cache).jobs()
    assert record.open and record.state == "completed" and record.job_id is not None


def test_after_the_deadline_stragglers_go_live(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    server.plan(JobPlan(validate_s=1.0, run_s=100.0))
    out = model(server, "openai")(outlines.string("q"), max_tokens=4)
    prompts = [f"p{i}" for i in range(4)]
    value = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, deadline=30.0), cache=cache)
    assert list(value) == [f"<{p}|None|0>" for p in prompts]
    assert server.counts["batches.cancel"] == 1 and 0 < server.count < 4  # only the stragglers went live
    assert sum(server.paid().values()) + server.count == 4


# -- job mode and live mode agree -----------------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(1, 3), width=st.integers(1, 5), samples=st.integers(1, 3))
def test_batch_mode_gives_the_live_values(server: FakeBatches, clock: FakeClock, tmp_path: Path, depth: int,
                                          width: int, samples: int) -> None:
    m = model(server, "openai")
    out = outlines.string("q")
    for level in range(depth):
        out = m(f"level {level}: " + out, max_tokens=4, temperature=0.5, seed=level)
    if samples > 1:
        out = m(out, num_samples=samples, temperature=0.9, seed=7, max_tokens=4)
    prompts = [f"w{i}" for i in range(width)]
    cache = Cache(tmp_path / f"c{depth}-{width}-{samples}-{len(server.jobs)}")
    batch = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache)
    live = outlines.eval(out, givens={"q": prompts}, cache=False)
    assert np.asarray(batch).tolist() == np.asarray(live).tolist()


# -- kill -9 at every step, then a re-run ------------------------------------------------------------

#: The evaluating process: a graph of two rounds in job mode; with ``KILL_AT`` it SIGKILLs itself at
#: that step (after the upload; after create, before the ledger heard; while polling; while downloading).
CHILD = r'''
import json, os, signal, sys
import outlines
from outlines import models
from outlines.backends.jobs import Backoff
from outlines.backends.jobs.openai import OpenAIJobs
from outlines.cache import Cache
from outlines.cache.ledger import Ledger
from outlines.runtime.jobs import Jobs

url, folder, kill_at = sys.argv[1], sys.argv[2], sys.argv[3]

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def after(cls, name, step, before=False):
    original = getattr(cls, name)
    if getattr(original, "__code__", None) and original.__code__.co_flags & 0x80:  # a coroutine function
        async def wrapped(*args, **kwargs):
            result = await original(*args, **kwargs)
            die()
    else:
        def wrapped(*args, **kwargs):
            if before:
                die()
            result = original(*args, **kwargs)
            die()
    if kill_at == step:
        setattr(cls, name, wrapped)

after(OpenAIJobs, "_upload", "upload")
after(Ledger, "record_created", "create", before=True)
after(Ledger, "advance", "poll")
after(OpenAIJobs, "results", "download")
m = models.openai("fake-model", base_url=url, api_key="sk-child")
q = outlines.string("q")
out = m("then " + m(q, max_tokens=4), max_tokens=4)
value = outlines.eval(out, givens={"q": [f"p{i}" for i in range(6)]}, cache=Cache(folder),
                      jobs=Jobs(backoff=Backoff(first=0.02, cap=0.05), lease=2.0, heartbeat=0.2))
print(json.dumps(list(value)))
'''


@pytest.mark.parametrize("step", ["upload", "create", "poll", "download"])
def test_kill_9_at_each_step_then_a_rerun_pays_each_draw_once(tmp_path: Path, step: str) -> None:
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    with FakeBatches(speed=100.0, reply=reply) as server:
        def child(kill_at: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, str(script), server.base_url, str(tmp_path / "cache"), kill_at],
                                  capture_output=True, text=True, env=env, timeout=120)

        killed = child(step)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        done = child("never")  # takes the dead child's jobs over once their 2 s lease has expired
        assert done.returncode == 0, done.stderr
        prompts = [f"p{i}" for i in range(6)]
        assert json.loads(done.stdout) == [f"<then <{p}|None|0>|None|0>" for p in prompts]
        paid = server.paid()
        assert len(paid) == 12 and set(paid.values()) == {1}  # every draw paid exactly once, none lost
        assert server.count == 0
        # Each round's job was created once, whatever the kill: the re-run found it.
        created = sum(len(job.lines) for job in server.jobs.values())
        assert created == 12 and server.counts["batches.create"] == 2
        assert all(not record.open for record in Ledger(tmp_path / "cache" / "draws-v2.sqlite3").jobs())


def test_program_submit_then_call_collects_and_jobs_lists_and_cancels(server: FakeBatches, clock: FakeClock,
                                                                     cache: Cache) -> None:
    m = model(server, "openai")
    prog = outlines.compile(lambda q: m("then " + m(q, max_tokens=4), max_tokens=4), jobs=jobs(clock), cache=cache)
    prompts = ["a", "b"]
    running = prog.submit(prompts)
    assert len(running) == 1 and server.counts["batches.create"] == 1
    (record,) = outlines.jobs(cache=cache)
    assert record.job_id == running[0] and record.requests == 2 and record.run == "outlines"
    # The first round runs on; the call waits for it, then does the second round.
    assert list(prog(prompts)) == ["<then <a|None|0>|None|0>", "<then <b|None|0>|None|0>"]
    assert server.counts["batches.create"] == 2 and outlines.jobs(cache=cache) == []
    assert len(outlines.jobs(cache=cache, open=None)) == 2
    # Cancelling: what the job finished is kept, the rest goes again.
    server.plan(JobPlan(validate_s=1.0, run_s=100.0))
    other = m(outlines.string("q"), max_tokens=3)
    with pytest.raises(JobsRunning):
        outlines.eval(other, givens={"q": ["c", "d"]}, jobs=jobs(clock, wait=False), cache=cache)
    clock.advance(60.0)  # one of the two lines is done
    (status,) = outlines.cancel_jobs(m, cache=cache)
    assert status.state in ("cancelling", "cancelled")
    assert list(outlines.eval(other, givens={"q": ["c", "d"]}, jobs=jobs(clock), cache=cache)) == \
        ["<c|None|0>", "<d|None|0>"]
    assert set(server.paid().values()) == {1} and len(list(server.jobs.values())[-1].lines) == 1
    with pytest.raises(ValueError, match="batch mode"):  # program.py's submit message
        outlines.compile(lambda q: m(q)).submit("x")


def test_traces_record_each_job_and_cost_the_batch_price(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    price = {"input": 1.0, "output": 2.0, "job_discount": 0.5}
    m = models.openai("fake-model", base_url=server.base_url, api_key=KEY, price=price)
    out = two_levels(m, max_tokens=8)
    prompts = [f"p{i}" for i in range(5)]
    with outlines.trace() as batch_trace:
        outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache)
    with outlines.trace() as live_trace:
        outlines.eval(out, givens={"q": prompts}, cache=False)
    assert [(j.requests, j.draws, j.state) for j in batch_trace.jobs] == [(5, 5, "collected")] * 2
    assert all(j.bytes > 0 and j.polls >= 1 and j.waited > 0 and not j.resumed for j in batch_trace.jobs)
    assert [b.jobs for b in batch_trace.batches] == [[j.id] for j in batch_trace.jobs]
    assert batch_trace.tokens == live_trace.tokens
    # Each is rounded up to a whole micro-unit (outlines.backends.usage.reported): half of one is within one of the other.
    assert batch_trace.cost() == pytest.approx(0.5 * live_trace.cost(), abs=1e-6)  # type: ignore[operator]
    assert "jobs" in batch_trace.to_dict() and KEY not in json.dumps(batch_trace.to_dict())


def test_progress_shows_each_open_job() -> None:
    from outlines.backends.jobs import JobStatus
    from outlines.runtime.jobs import JobEvent
    from outlines.runtime.progress import Counter, Progress

    counter = Counter()
    progress = Progress(counter, _NoQueue())
    status = JobStatus("batch_7", "in_progress", total=20, succeeded=3, failed=1)
    counter.job_event(1, JobEvent("status", "openai", "m", status, requests=20))
    assert "job batch_7 in_progress 4/20" in progress.line()
    counter.job_event(1, JobEvent("collected", "openai", "m", JobStatus("batch_7", "completed", total=20)))
    assert "job" not in progress.line()


class _NoQueue:
    plan: Any = type("P", (), {"nodes": []})()

    def queued_draws(self) -> int:
        return 0


def test_explain_shows_rounds_jobs_and_the_batch_price(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    m = models.openai("fake-model", base_url=server.base_url, api_key=KEY, max_batch=4,
                      price={"input": 1.0, "output": 2.0, "job_discount": 0.5})
    out = two_levels(m, max_tokens=8)
    prompts = [f"p{i}" for i in range(10)]
    live = outlines.explain(out, givens={"q": prompts}, cache=cache)
    batch = outlines.explain(out, givens={"q": prompts}, cache=cache, jobs=Jobs(max_requests=4))
    (usage,) = batch.usage.values()
    assert [b.jobs for b in batch.batches] == [3, 3] and usage.rounds == 2 and usage.jobs == 6
    assert len(live.batches) == 6 and all(b.jobs == 0 for b in live.batches)  # live: max_batch splits
    assert batch.cost == pytest.approx(0.5 * live.cost)  # type: ignore[operator]
    assert "2 round(s), 6 provider job(s) at the batch price" in batch.summary()
    outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, max_requests=4), cache=cache)
    assert server.counts["batches.create"] == 6 and server.count == 0  # what explain said


def test_budgets_count_the_batch_price(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    price = {"input": 1_000_000.0, "output": 1_000_000.0, "job_discount": 0.5}
    m = models.openai("fake-model", base_url=server.base_url, api_key=KEY, price=price)
    out = m(outlines.string("q"), max_tokens=4)
    prompts = ["a", "b"]  # at most 22 tokens (prompts with their chat wrapping, 4 completion tokens each)
    with pytest.raises(outlines.BudgetExceeded):
        outlines.eval(out, givens={"q": prompts}, budget=outlines.Budget(cost=15.0), cache=False)
    assert server.count == 1  # live: the budget has room for one of the two draws, which is sent
    value = outlines.eval(out, givens={"q": prompts}, budget=outlines.Budget(cost=15.0), jobs=jobs(clock),
                          cache=cache)
    assert list(value) == ["<a|None|0>", "<b|None|0>"] and server.count == 1  # job mode: no live request


def test_a_loop_of_k_iterations_takes_k_rounds(server: FakeBatches, clock: FakeClock, cache: Cache) -> None:
    m = models.openai("fake-model", base_url=server.base_url, api_key=KEY, max_tokens=4)
    goal = outlines.string("goal")

    @outlines.fn
    def unfinished(total: str, goal: str) -> bool:
        return total.count("|") < 3 * int(goal)

    def step(total: Any) -> Any:
        return total + m("n" + goal)

    final = outlines.while_loop(lambda total: unfinished(total, goal), step, init="", max_iter=10)
    totals = outlines.eval(final, givens={goal: ["1", "3", "2"]}, jobs=jobs(clock), cache=cache)
    live = outlines.eval(final, givens={goal: ["1", "3", "2"]}, cache=False)
    assert totals.tolist() == live.tolist()
    # Each answer adds two "|": the elements need 2, 5 and 3 iterations: five rounds, one job each, over the
    # elements still running.
    assert [len(job.lines) for job in sorted(server.jobs.values(), key=lambda j: j.id)] == [3, 3, 2, 1, 1]
    assert server.count == 3 + 3 + 2 + 1 + 1  # only the live run went live


@PROVIDERS
def test_structured_outputs_keep_their_meaning(clock: FakeClock, cache: Cache, provider: str) -> None:
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    def person(prompt: str, sample: int, body: Any) -> str:
        return json.dumps({"name": prompt.upper(), "age": 30}) if prompt != "bad" else "not json"

    with FakeBatches(clock=clock, reply=person) as server:
        out = model(server, provider)(outlines.string("q"), json_schema=Person, max_tokens=32, temperature=0)
        prompts = ["a", "b", "bad"]
        people = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock), cache=cache, errors="return")
        # OpenAI's job lines carry the schema; Anthropic's cannot, so its draws run live, checked here.
        assert (server.count, len(server.jobs)) == ((0, 1) if provider == "openai" else (3, 0))
        live = outlines.eval(out, givens={"q": prompts}, cache=False, errors="return")
    assert people[0] == Person(name="A", age=30) and people[1] == Person(name="B", age=30)
    assert isinstance(people[2], Failure)  # greedy and invalid: fails at once, as live
    assert [repr(p) for p in people] == [repr(p) for p in live]
    if provider == "openai":  # the schema travels in each job line, as in a live request
        assert all("response_format" in line.body for job in server.jobs.values() for line in job.lines)


def test_a_request_no_job_ever_answers_fails_after_max_asks(server: FakeBatches, clock: FakeClock,
                                                           cache: Cache) -> None:
    from outlines.runtime.jobs import MAX_ASKS

    server.plan(*[JobPlan(validate_s=2.0, expire_s=1.0)] * MAX_ASKS)  # each job expires before it starts
    out = model(server, "openai")(outlines.string("q"), max_tokens=4)
    value = outlines.eval(out, givens={"q": ["a"]}, jobs=jobs(clock), cache=cache, errors="return")
    assert isinstance(value[0], Failure) and f"unanswered {MAX_ASKS} times" in value[0].message
    assert server.counts["batches.create"] == MAX_ASKS and not server.paid()


def test_not_waiting_raises_jobs_running_even_when_failures_are_returned(server: FakeBatches, clock: FakeClock,
                                                                          cache: Cache) -> None:
    out = model(server, "openai")(outlines.string("q"), max_tokens=4)
    with pytest.raises(JobsRunning):
        outlines.eval(out, givens={"q": ["a"]}, jobs=jobs(clock, wait=False), cache=cache, errors="return")


def test_draws_whose_constraint_no_job_line_carries_cost_the_live_price(server: FakeBatches, clock: FakeClock,
                                                                        cache: Cache) -> None:
    """In job mode Anthropic's constrained draws go live: explain, the budget and the trace price them live,
    the job's draws at the batch price, so a budget of explain's cost admits the run."""
    from fractions import Fraction

    from outlines.backends.usage import Price

    price = Price.of({"input": 1.0, "output": 2.0, "job_discount": 0.5})
    m = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY, max_tokens=4, price=price)
    q = outlines.string("q")
    free, picked = m(q), m("Pick for " + q, choices=["yes", "no"])
    prompts = ["a", "b", "c"]
    givens = {"q": prompts}
    plan = outlines.explain(free, picked, givens=givens, jobs=jobs(clock))
    (usage,) = plan.usage.values()
    assert usage.jobs == 1 and 0 < usage.job_prompt_tokens < usage.prompt_tokens
    everything_in_jobs = price.money(usage.prompt_tokens, usage.completion_tokens or 0, jobs=True)
    assert usage.money is not None and usage.money > everything_in_jobs  # the live draws at the live price
    assert "the draws below live" in plan.summary()
    server.reply = lambda prompt, sample, body: "yes" if "Pick" in str(prompt) else reply(prompt, sample, body)
    with outlines.trace() as trace:
        outlines.eval(free, picked, givens=givens, jobs=jobs(clock), cache=cache,
                      budget=outlines.Budget(cost=plan.cost))
    assert server.counts[CREATE["anthropic"]] == 1 and server.count == len(prompts)  # one job; the rest live
    live = [b for b in trace.batches if not b.jobs]
    job = [b for b in trace.batches if b.jobs]
    assert len(live) >= 1 and len(job) == 1
    expected = sum((price.money(b.prompt_tokens, b.completion_tokens, jobs=bool(b.jobs)) for b in trace.batches),
                   Fraction(0))
    assert trace.cost() == outlines.backends.usage.reported(expected)
