"""Job mode under provider faults (issue 38): echoed keys, bad elements, bad polls, a job stuck cancelling.

Against the fake batch provider on 127.0.0.1, its jobs on a ``FakeClock``
that the evaluation's waiting advances (nothing really sleeps), with the
fixtures and helpers of ``test_jobs``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import outlines
from outlines.cache import Cache, draw_keys
from outlines.common.errors import Failure, NodeError
from tests.fixtures.fake_batches import FakeBatches, FakeClock, JobPlan
from tests.fixtures.fake_openai import OK, Action, Malformed, Status
from outlines.runtime.jobs import Jobs
from tests.runtime.test_jobs import CREATE, KEY, PROVIDERS, _draws, cache, clock, jobs, model, reply, server

__all__ = ["cache", "clock", "server"]  # fixtures, used by name

GET = {"openai": "batches.get", "anthropic": "message_batches.get"}
CANCEL = {"openai": "batches.cancel", "anthropic": "message_batches.cancel"}


def keys_of(out: Any, prompts: list[str]) -> list[str]:
    """The hex cache keys (``custom_id``s) of the first draw of each prompt."""
    backend = out.owner.op.backend
    return [key.hex() for key in draw_keys(backend.cache_identities[0], _draws(out, prompts))]


def stored_bytes(cache: Cache) -> bytes:
    """Every byte the cache keeps on disk (its database, journal and any other file)."""
    cache.flush()
    return b"".join(path.read_bytes() for path in sorted(Path(cache.path).rglob("*")) if path.is_file())


# -- item 7: a key the provider echoes is kept nowhere ------------------------------------------------


@PROVIDERS
def test_a_key_the_provider_echoes_is_stored_and_shown_nowhere(server: FakeBatches, clock: FakeClock, cache: Cache,
                                                                provider: str) -> None:
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    echoed = f"Incorrect API key provided: {KEY}. Find yours at https://example.com."
    # A line refused with the key quoted in its error, then a job refused (failed, or its create) quoting it.
    server.plan(JobPlan(errors={keys_of(out, ["b"])[0]: 401}, message=echoed), JobPlan(fail=echoed))
    with outlines.trace() as trace:
        value = outlines.eval(out, givens={"q": ["a", "b", "c"]}, jobs=jobs(clock), cache=cache, errors="return")
        with pytest.raises(NodeError) as caught:
            outlines.eval(out, givens={"q": ["d"]}, jobs=jobs(clock), cache=cache)
    assert value[0] == "<a|None|0>" and isinstance(value[1], Failure) and "Incorrect API key" in value[1].message
    assert "Incorrect API key" in str(caught.value)
    records = outlines.jobs(cache=cache, open=None)
    assert len(records) == 2 and any("Incorrect API key" in (r.note or "") for r in records)
    shown = [repr(value[1]), str(value[1]), str(caught.value), repr(caught.value.cause),
             str(trace.errors()), json.dumps(trace.to_dict()), repr(records),
             json.dumps([r.to_json().decode() for r in records])]
    assert [i for i, text in enumerate(shown) if KEY in text] == [] and "***" in str(caught.value)
    assert KEY.encode() not in stored_bytes(cache)


# -- items 8 and 9: a line no job can take fails alone -------------------------------------------------


@PROVIDERS
@pytest.mark.parametrize("bad", ["a lone \ud800 surrogate", "y" * 600], ids=["surrogate", "too-large"])
def test_a_line_no_job_can_take_fails_its_element_alone_and_the_job_goes(server: FakeBatches, clock: FakeClock,
                                                                         cache: Cache, provider: str, bad: str) -> None:
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    prompts = ["a", bad, "c"]
    value = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, max_bytes=500), cache=cache, errors="return")
    assert value[0] == "<a|None|0>" and value[2] == "<c|None|0>"
    failure = value[1]
    assert isinstance(failure, Failure) and failure.node == out.owner.label  # its element, its node
    assert repr(bad[:20])[1:-1] in failure.message and keys_of(out, [bad])[0] not in failure.message
    assert ("lone surrogate" if "\ud800" in bad else "more than one") in failure.message
    assert server.counts[CREATE[provider]] == 1 and sorted(server.submitted) == sorted(keys_of(out, ["a", "c"]))
    assert set(server.paid().values()) == {1} and server.count == 0  # the others in the job, nothing live
    with pytest.raises(NodeError, match="cannot go in a job" if "\ud800" in bad else "more than one") as caught:
        outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, max_bytes=500), cache=cache)
    assert caught.value.node == out.owner.label


# -- item 12: a bad poll answer does not end the run --------------------------------------------------


@PROVIDERS
def test_a_bad_poll_answer_does_not_end_a_long_wait(server: FakeBatches, clock: FakeClock, cache: Cache,
                                                     provider: str) -> None:
    server.plan(JobPlan(validate_s=1.0, run_s=60.0))
    get = GET[provider]
    gateway = Status(200, body={"error": {"message": "upstream connect error", "type": "server_error"}})
    server.script_route(get, OK, gateway, OK, Malformed("<html>bad gateway</html>"))
    out = model(server, provider)(outlines.string("q"), max_tokens=4)
    value = outlines.eval(out, givens={"q": ["a", "b"]}, jobs=jobs(clock), cache=cache)
    assert list(value) == ["<a|None|0>", "<b|None|0>"] and server.count == 0
    assert server.counts[CREATE[provider]] == 1 and set(server.paid().values()) == {1}


# -- item 5: the deadline bounds the wait after the cancel too ----------------------------------------


@PROVIDERS
def test_a_job_stuck_cancelling_past_the_deadline_stays_open_and_its_draws_go_live(
        clock: FakeClock, cache: Cache, provider: str) -> None:
    with FakeBatches(clock=clock, reply=reply, cancel_s=1e9) as stuck:  # cancelled, it never stops
        stuck.plan(JobPlan(validate_s=1.0, run_s=100.0))
        out = model(stuck, provider)(outlines.string("q"), max_tokens=4)
        prompts = [f"p{i}" for i in range(4)]
        start = clock.now
        value = outlines.eval(out, givens={"q": prompts}, jobs=jobs(clock, deadline=30.0, cancel_wait=20.0),
                              cache=cache)
        assert list(value) == [f"<{p}|None|0>" for p in prompts] and stuck.count == 4  # all of them live
        assert clock.now - start <= 50.0 and sum(clock.slept) <= 50.0  # deadline + cancel_wait, not forever
        assert stuck.counts[CANCEL[provider]] == 1 and stuck.counts[GET[provider]] <= 20
        (job,) = stuck.jobs.values()
        (record,) = outlines.jobs(cache=cache)  # open: a later run that asks for its draws collects it
        assert record.job_id == job.id and record.state == "cancelling"
        # What is paid: the lines the job finished before it was cancelled, in it and again live (documented).
        assert len(stuck.paid()) == len(job.done(clock.now)) > 0


def test_cancel_wait_must_be_seconds() -> None:
    with pytest.raises(ValueError, match="cancel_wait"):
        Jobs(cancel_wait=-1.0)
    assert Jobs(deadline=60.0).cancel_wait == 600.0


def test_with_no_cancel_wait_the_deadline_is_the_bound(clock: FakeClock, cache: Cache) -> None:
    with FakeBatches(clock=clock, reply=reply, cancel_s=1e9) as stuck:
        stuck.plan(JobPlan(validate_s=1.0, run_s=100.0))
        out = model(stuck, "openai")(outlines.string("q"), max_tokens=4)
        value = outlines.eval(out, givens={"q": ["a", "b"]}, jobs=jobs(clock, deadline=30.0, cancel_wait=0.0),
                              cache=cache)
        assert list(value) == ["<a|None|0>", "<b|None|0>"] and sum(clock.slept) == 30.0
        (record,) = outlines.jobs(cache=cache)
        assert record.state == "cancelling" and stuck.counts["batches.cancel"] == 1


@dataclasses.dataclass(frozen=True)
class FinishedMeanwhile(Action):
    """The job finishes between the last poll and the cancel, which the provider then refuses."""

    clock: FakeClock

    async def respond(self, server: Any, request: web.Request, body: Any) -> web.StreamResponse:
        self.clock.advance(1000.0)
        return web.json_response({"error": {"message": "Cannot cancel a batch with status 'completed'."}}, status=400)


def test_a_cancel_refused_because_the_job_just_finished_collects_it(server: FakeBatches, clock: FakeClock,
                                                                     cache: Cache) -> None:
    server.plan(JobPlan(validate_s=1.0, run_s=100.0))
    server.script_route("batches.cancel", FinishedMeanwhile(clock))
    out = model(server, "openai")(outlines.string("q"), max_tokens=4)
    value = outlines.eval(out, givens={"q": ["a", "b"]}, jobs=jobs(clock, deadline=30.0), cache=cache)
    assert list(value) == ["<a|None|0>", "<b|None|0>"] and server.count == 0  # all from the job, none live
    assert outlines.jobs(cache=cache) == [] and set(server.paid().values()) == {1}
