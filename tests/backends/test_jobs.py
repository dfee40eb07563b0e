"""Provider batch-job clients (OpenAI Batch, Anthropic Message Batches) against the fake provider on 127.0.0.1.

The fake runs jobs on a ``FakeClock`` that ``wait`` advances: nothing here
really sleeps. What the server was asked (uploads, creates, polls, downloads,
lines paid) is counted by the server itself.
"""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Awaitable, Callable, Iterator, Sequence, TypeVar

import pytest

from outlines import models
from outlines.backends.anthropic import AnthropicBackend
from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.backends.jobs import Backoff, JobClient, JobLimits, JobLine, JobStatus, job_client, split, wait
from outlines.backends.jobs.anthropic import AnthropicJobs
from outlines.backends.jobs.base import JobInDoubt
from outlines.backends.jobs.openai import OpenAIJobs
from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
from outlines.cache import draw_key, draw_keys
from tests.fixtures.fake_batches import FakeBatches, FakeClock, JobPlan, Lost
from tests.fixtures.fake_openai import Malformed, Status

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

KEY = "sk-jobs-SECRET-0123456789"
SAMPLING = GenerationParams.create(temperature=0.7, max_tokens=16, seed=100)
T = TypeVar("T")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[FakeBatches]:
    with FakeBatches(clock=clock, reply=_reply) as fake:
        yield fake


def _reply(prompt: str, sample: int, body: Any) -> str:
    """An answer that names its request: the prompt, the seed it was sent with, the sample."""
    return f"{prompt}|{body.get('seed')}|{sample}"


def client_for(server: FakeBatches, provider: str, **limits: Any) -> Any:
    if provider == "openai":
        return OpenAIJobs(OpenAIChatBackend("fake-model", base_url=server.base_url, api_key=KEY), **limits)
    return AnthropicJobs(AnthropicBackend("claude-fake", base_url=server.anthropic_url, api_key=KEY), **limits)


def run(client: JobClient, main: Callable[[], Awaitable[T]]) -> T:
    """``main()`` on a fresh loop, closing the client's session after."""

    async def closing() -> T:
        try:
            return await main()
        finally:
            await client.aclose()

    return asyncio.run(closing())


def draws(prompts: Sequence[str], samples: int = 1, params: GenerationParams = SAMPLING) -> list[Draw]:
    return [Draw(p, params, d) for p in prompts for d in range(samples)]


def lines_for(client: JobClient, batch: Sequence[Draw], report: BatchReport | None = None) -> list[JobLine]:
    """The client's lines for ``batch``, keyed as the runtime keys them (the backend's cache identity)."""
    return client.lines(batch, draw_keys(client.backend.cache_identities[0], batch), report)


def samples_of(lines: Sequence[JobLine]) -> dict[str, int]:
    return {line.custom_id: len(line.keys) for line in lines}


async def through(client: JobClient, lines: Sequence[JobLine], clock: FakeClock, **metadata: str) -> Any:
    """Create one job of ``lines``, wait for it, read its results."""
    status = await client.create(lines, {"outlines_run": "test", **metadata})
    status = await wait(client, status.id, clock=clock)
    return status, await client.results(status, samples_of(lines))


PROVIDERS = pytest.mark.parametrize("provider", ["openai", "anthropic"])


# -- lines ---------------------------------------------------------------------------------


@PROVIDERS
def test_custom_ids_are_draw_keys_and_lines_are_the_live_requests(server: FakeBatches, provider: str) -> None:
    client = client_for(server, provider)
    batch = draws(["a", "b"], samples=2)
    lines = lines_for(client, batch)
    keys = [draw_key(client.backend.identity, d).hex() for d in batch]
    assert sorted(k for line in lines for k in line.keys) == sorted(keys)
    assert all(line.custom_id == line.keys[0] for line in lines)
    if provider == "openai":  # one line per prompt, its two draws its n=2 samples
        assert [line.keys for line in lines] == [(keys[0], keys[1]), (keys[2], keys[3])]
        sent = [json.loads(line.data)["body"] for line in lines]
    else:  # the API has no n: one line per draw
        assert [line.keys for line in lines] == [(key,) for key in keys]
        sent = [json.loads(line.data)["params"] for line in lines]
    # The live backend sends exactly these bodies for the same draws.
    run(client, lambda: client.backend.generate(batch, BatchReport()))
    assert sorted(map(json.dumps, sent)) == sorted(json.dumps(r.body) for r in server.requests)
    assert all(line.size == len(line.data) + 1 for line in lines)


@PROVIDERS
def test_greedy_and_repeated_draws_share_a_line(server: FakeBatches, provider: str) -> None:
    client = client_for(server, provider)
    greedy = GenerationParams.create(temperature=0)
    lines = lines_for(client, [Draw("g", greedy, 0)] * 3 + [Draw("s", SAMPLING, 1), Draw("s", SAMPLING, 1)])
    assert [len(line.keys) for line in lines] == [1, 1]


@pytest.mark.parametrize("backend", [OpenAIChatBackend, OpenAICompletionBackend])
def test_a_prompt_with_more_samples_than_n_allows_is_several_lines_keyed_one_to_one(
    server: FakeBatches, clock: FakeClock, backend: Any
) -> None:
    """150 samples of one prompt: lines of n=128 and n=22 (the spec's most), each key on one line, all answered."""
    client = OpenAIJobs(backend("fake-model", base_url=server.base_url, api_key=KEY))
    batch = draws(["a"], samples=150)
    lines = lines_for(client, batch)
    bodies = [json.loads(line.data)["body"] for line in lines]
    assert [(body["n"], body["seed"]) for body in bodies] == [(128, 100), (22, 228)]
    assert [len(line.keys) for line in lines] == [128, 22] and len({k for line in lines for k in line.keys}) == 150
    _, results = run(client, lambda: through(client, lines, clock))
    assert sorted(len(result.texts) for result in results) == [22, 128]
    assert len({text for result in results for text in result.texts}) == 150


def test_completions_lines_name_their_endpoint(server: FakeBatches) -> None:
    client = OpenAIJobs(OpenAICompletionBackend("fake-model", base_url=server.base_url, api_key=KEY))
    (line,) = lines_for(client, draws(["a"], samples=3))
    record = json.loads(line.data)
    assert record["url"] == "/v1/completions" and record["body"]["prompt"] == "a" and record["body"]["n"] == 3


def test_a_draw_whose_request_cannot_be_built_fails_alone(server: FakeBatches) -> None:
    client = client_for(server, "anthropic")
    hot = GenerationParams.create(temperature=1.5)
    report = BatchReport()
    lines = lines_for(client, [Draw("hot", hot, 0), Draw("fine", SAMPLING, 0), Draw("hot", hot, 0)], report)
    assert len(lines) == 1 and sorted(report.failures) == [0, 2]
    with pytest.raises(BackendError, match="between 0 and 1"):
        lines_for(client, [Draw("hot", hot, 0)])


def test_job_client_picks_the_provider() -> None:
    assert isinstance(job_client(OpenAIChatBackend("m", api_key="k"), max_requests=10), OpenAIJobs)
    assert isinstance(job_client(AnthropicBackend("c", api_key="k")), AnthropicJobs)
    with pytest.raises(TypeError, match="no provider batch jobs"):
        job_client(models.from_function(str.upper).backend)
    assert isinstance(job_client(AnthropicBackend("c", api_key="k")), JobClient)


# -- a job, start to end --------------------------------------------------------------------


@PROVIDERS
def test_results_land_on_their_draws_in_any_order(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    prompts = [f"q{i}" for i in range(12)]
    batch = draws(prompts, samples=2)
    lines = lines_for(client, batch)
    status, results = run(client, lambda: through(client, lines, clock))
    assert status.state == "completed" and status.succeeded == len(lines)
    assert [r.custom_id for r in results] != [line.custom_id for line in lines]  # the file came shuffled
    texts = {line.keys[k]: r.texts[k] for r in results for line in lines if line.custom_id == r.custom_id
             for k in range(len(line.keys))}
    for draw in batch:
        text = texts[draw_key(client.backend.identity, draw).hex()]
        if provider == "openai":  # sample k of the line sent with seed 100 + its first draw
            assert text == f"{draw.prompt}|100|{draw.draw}"
        else:
            assert text == f"{draw.prompt}|None|0"
    # Nothing went live; one upload (OpenAI), one create, polls, one download.
    assert server.count == 0
    create = "batches.create" if provider == "openai" else "message_batches.create"
    download = "files.content" if provider == "openai" else "message_batches.results"
    assert server.counts[create] == 1 and server.counts[download] == 1
    assert server.counts["files.create"] == (1 if provider == "openai" else 0)
    assert set(server.paid().values()) == {1} and len(server.paid()) == len(lines)


@PROVIDERS
def test_usage_comes_from_the_results(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    lines = lines_for(client, draws(["one two", "three"]))
    report = BatchReport()

    async def main() -> Any:
        status = await wait(client, (await client.create(lines, {})).id, clock=clock)
        return await client.results(status, samples_of(lines), report)

    results = run(client, main)
    assert report.tokens == [3, 2, 0, 0] and sorted(r.usage[:2] for r in results) == [(1, 1), (2, 1)]


@PROVIDERS
def test_jobs_split_at_the_limits_they_are_given(clock: FakeClock, provider: str) -> None:
    limits = (4, 100_000)
    with FakeBatches(clock=clock, openai_limits=limits, anthropic_limits=limits) as server:
        client = client_for(server, provider, max_requests=4)
        lines = lines_for(client, draws([f"p{i}" for i in range(10)]))
        jobs = split(lines, client.limits)
        assert [len(job) for job in jobs] == [4, 4, 2]

        async def main() -> list[JobStatus]:
            created = [await client.create(job, {}) for job in jobs]
            return [await wait(client, s.id, clock=clock) for s in created]

        assert [s.state for s in run(client, main)] == ["completed"] * 3
        assert len(server.jobs) == 3 and sum(server.paid().values()) == 10


@PROVIDERS
def test_jobs_split_by_bytes_within_the_providers_limit(clock: FakeClock, provider: str) -> None:
    with FakeBatches(clock=clock) as probe:
        size = sum(line.size for line in lines_for(client_for(probe, provider), draws(["x" * 100] * 1)))
    limit = size * 3 + 20  # three lines and an envelope
    with FakeBatches(clock=clock, openai_limits=(100, limit), anthropic_limits=(100, limit)) as server:
        client = client_for(server, provider, max_bytes=limit)
        lines = lines_for(client, draws([f"{i:03d}" + "x" * 97 for i in range(7)]))
        jobs = split(lines, client.limits)
        assert [len(job) for job in jobs] == [3, 3, 1]

        async def main() -> list[JobStatus]:
            created = [await client.create(job, {}) for job in jobs]
            return [await wait(client, s.id, clock=clock) for s in created]

        assert [s.state for s in run(client, main)] == ["completed"] * 3


def test_the_fake_enforces_the_providers_limits(clock: FakeClock, sleeps: list[float]) -> None:
    with FakeBatches(clock=clock, openai_limits=(2, 10**6), anthropic_limits=(100, 300)) as server:
        openai, anthropic = client_for(server, "openai"), client_for(server, "anthropic")
        many = draws(["a", "b", "c"])
        server.expect_violations("must hold 1 to 2 requests, it holds 3", "exceeds 300 bytes")
        job_id = run(openai, lambda: openai.create(lines_for(openai, many), {})).id
        status = run(openai, lambda: wait(openai, job_id, clock=clock))
        assert status.state == "failed" and status.reason == "The input file must hold 1 to 2 requests, it holds 3."
        with pytest.raises(BackendError, match="413") as caught:
            run(anthropic, lambda: anthropic.create(lines_for(anthropic, many), {}))
        assert not caught.value.retryable


@PROVIDERS
@pytest.mark.parametrize("bad", ["a lone \ud800 surrogate", "y" * 300], ids=["surrogate", "too-large"])
def test_a_line_no_job_can_take_fails_its_draws_alone_naming_the_prompt(server: FakeBatches, provider: str,
                                                                         bad: str) -> None:
    """Issue 38, items 8 and 9: a line that cannot be encoded, or is larger than a job, fails only its draws."""
    client = client_for(server, provider, max_bytes=400)
    batch = draws(["fine", bad, "good"], samples=2)
    report = BatchReport()
    lines = lines_for(client, batch, report)
    assert sorted(report.failures) == [2, 3] and len({k for line in lines for k in line.keys}) == 4
    message = str(report.failures[2])
    assert isinstance(report.failures[2], BackendError) and not report.failures[2].retryable
    assert repr(bad[:20])[1:-1] in message  # named by its prompt (escaped), not by a cache key
    assert draw_keys(client.backend.cache_identities[0], [batch[2]])[0].hex() not in message
    expected = r"lone surrogate \('\\ud800' at character 7\)" if "\ud800" in bad else r"takes \d+ bytes, more than"
    assert re.search(expected, message)
    for line in lines:
        line.data.decode("utf-8")  # strict UTF-8: nothing a provider would refuse
    with pytest.raises(BackendError, match="cannot go in a job" if "\ud800" in bad else "more than one"):
        lines_for(client, [batch[2]])


def test_a_line_too_large_for_any_job_is_named_and_a_too_large_job_is_refused_unsent(server: FakeBatches) -> None:
    client = client_for(server, "openai", max_bytes=200)
    line = JobLine("big", ("big",), b"y" * 300, 301)
    with pytest.raises(ValueError, match="big"):
        split([line], client.limits)
    with pytest.raises(ValueError, match="split them"):
        run(client, lambda: client.create([line], {}))
    assert not server.counts


# -- waiting ---------------------------------------------------------------------------------


def test_polling_backs_off_to_its_cap_without_sleeping(clock: FakeClock) -> None:
    with FakeBatches(clock=clock, validate_s=0, run_s=60, finalize_s=0) as server:
        client = client_for(server, "openai")
        lines = lines_for(client, draws(["a"]))
        seen: list[str] = []

        async def main() -> JobStatus:
            status = await client.create(lines, {})
            return await wait(client, status.id, clock=clock, backoff=Backoff(first=1, factor=2, cap=8),
                              on_status=lambda s: seen.append(s.state))

        assert run(client, main).state == "completed"
    assert clock.slept == [1, 2, 4, 8, 8, 8, 8, 8, 8, 8]  # 63 s of the job's time, none of ours
    assert server.counts["batches.get"] == len(clock.slept) + 1 == len(seen)
    assert seen[0] == "in_progress" and seen[-1] == "completed"


def test_a_deadline_returns_the_job_unfinished(server: FakeBatches, clock: FakeClock) -> None:
    client = client_for(server, "anthropic")
    lines = lines_for(client, draws(["a"]))

    async def main() -> JobStatus:
        status = await client.create(lines, {})
        return await wait(client, status.id, clock=clock, deadline=3.0, backoff=Backoff(first=2))

    status = run(client, main)
    assert status.state == "in_progress" and not status.finished and sum(clock.slept) == 3.0


@PROVIDERS
def test_transient_poll_failures_do_not_end_the_wait(server: FakeBatches, clock: FakeClock, provider: str,
                                                     sleeps: list[float]) -> None:
    """Issue 38, item 12: a gateway's 200 with an error body, a 503 past the client's retries, a garbled body."""
    client = client_for(server, provider)
    get = "batches.get" if provider == "openai" else "message_batches.get"
    gateway = Status(200, body={"error": {"message": "upstream timed out", "type": "server_error"}})
    server.script_route(get, gateway, *[Status(503)] * (client.client.max_retries + 1), Malformed("<html>"))
    lines = lines_for(client, draws(["a", "b"]))
    seen: list[str] = []

    async def main() -> JobStatus:
        status = await client.create(lines, {})
        return await wait(client, status.id, clock=clock, backoff=Backoff(first=1, factor=1), failures=3,
                          on_status=lambda s: seen.append(s.state))

    assert run(client, main).state == "completed"
    assert server.counts[get] == 2 + client.client.max_retries + 1 + len(seen) and seen[-1] == "completed"


@pytest.mark.parametrize("faults, raised", [
    ([Status(404, body={"error": {"message": "No batch found"}})], "404"),  # a refusal ends it at once
    ([Status(200, body={"error": {"message": "down"}})] * 3, "status"),  # more failures in a row than allowed
])
def test_a_refused_poll_or_too_many_failures_in_a_row_end_the_wait(server: FakeBatches, clock: FakeClock,
                                                                   faults: list[Any], raised: str) -> None:
    client = client_for(server, "openai")
    lines = lines_for(client, draws(["a"]))

    async def main() -> JobStatus:
        status = await client.create(lines, {})
        server.script_route("batches.get", *faults)
        return await wait(client, status.id, clock=clock, failures=2)

    with pytest.raises(BackendError, match=raised):
        run(client, main)
    assert server.counts["batches.get"] == len(faults)


def test_a_deadline_passing_before_any_poll_answered_raises(server: FakeBatches, clock: FakeClock) -> None:
    client = client_for(server, "openai")
    lines = lines_for(client, draws(["a"]))

    async def main() -> JobStatus:
        status = await client.create(lines, {})
        server.script_route("batches.get", *[Malformed("<html>")] * 3)
        return await wait(client, status.id, clock=clock, deadline=1.5, backoff=Backoff(first=1, factor=1))

    with pytest.raises(BackendError, match="malformed"):
        run(client, main)
    assert server.counts["batches.get"] == 3 and sum(clock.slept) == 1.5


# -- faults ----------------------------------------------------------------------------------


@PROVIDERS
def test_an_expired_job_keeps_its_finished_half(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    lines = lines_for(client, draws([f"e{i}" for i in range(10)]))
    server.plan(JobPlan(validate_s=0, run_s=10, finalize_s=1, expire_s=5.5))
    status, results = run(client, lambda: through(client, lines, clock))
    assert status.state == "expired"
    outcomes = {r.custom_id: r.outcome for r in results}
    done = [line.custom_id for line in lines[:5]]
    assert sorted(c for c, o in outcomes.items() if o == "succeeded") == sorted(done)
    assert sorted(c for c, o in outcomes.items() if o == "expired") == sorted(line.custom_id for line in lines[5:])
    # Only the missing half goes again, and every line is paid once in all.
    again = [line for line in lines if outcomes[line.custom_id] == "expired"]
    status, results = run(client, lambda: through(client, again, clock))
    assert status.state == "completed" and len(results) == 5
    assert server.paid() == {line.custom_id: 1 for line in lines}


@PROVIDERS
def test_cancel_keeps_what_finished(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    lines = lines_for(client, draws([f"c{i}" for i in range(4)]))
    server.plan(JobPlan(validate_s=0, run_s=8, finalize_s=0))

    async def main() -> Any:
        status = await client.create(lines, {})
        clock.advance(4.5)  # two of four lines done
        cancelling = await client.cancel(status.id)
        finished = await wait(client, status.id, clock=clock)
        return cancelling, finished, await client.results(finished, samples_of(lines))

    cancelling, finished, results = run(client, main)
    assert cancelling.state == "cancelling" and finished.state == "cancelled"
    assert sorted(r.outcome for r in results) == ["cancelled", "cancelled", "succeeded", "succeeded"]
    assert sum(server.paid().values()) == 2


@PROVIDERS
def test_line_errors_follow_the_retry_rules(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    lines = lines_for(client, draws(["ok", "busy", "bad", "slow"]))
    ids = {json.loads(line.data).get("body", json.loads(line.data).get("params"))["messages"][-1]["content"]:
           line.custom_id for line in lines}
    overloaded = 529 if provider == "anthropic" else 500
    server.plan(JobPlan(errors={ids["busy"]: overloaded, ids["bad"]: 400, ids["slow"]: 429}))
    status, results = run(client, lambda: through(client, lines, clock))
    by_id = {r.custom_id: r for r in results}
    assert by_id[ids["ok"]].outcome == "succeeded"
    for name, retryable in (("busy", True), ("bad", False), ("slow", True)):
        result = by_id[ids[name]]
        assert result.outcome == "errored" and result.error is not None
        assert result.error.retryable is retryable, name
        assert ids[name] in str(result.error)
    assert status.succeeded == 1 and status.failed == 3
    assert server.paid() == {ids["ok"]: 1}


def test_a_failed_job_quotes_the_providers_reason(server: FakeBatches, clock: FakeClock) -> None:
    client = client_for(server, "openai")
    broken = JobLine("x1", ("x1",), b'{"custom_id": "x1", "method": "POST", "url": "/v1/chat/completions", "bo', 10)
    server.expect_violations("Line 1: the line is not valid JSON")

    async def main() -> JobStatus:
        status = await client.create([broken], {})
        return await wait(client, status.id, clock=clock)

    status = run(client, main)
    assert status.state == "failed" and status.reason == "Line 1: the line is not valid JSON."
    with pytest.raises(BackendError, match="failed: Line 1: the line is not valid JSON"):
        run(client, lambda: client.results(status, {}))
    assert not server.paid()


def test_a_batch_refused_at_create_is_a_clear_error_sent_once(server: FakeBatches, sleeps: list[float]) -> None:
    client = client_for(server, "anthropic")
    server.plan(JobPlan(fail="requests.0.params.model: Field required"))
    with pytest.raises(BackendError, match="Field required") as caught:
        run(client, lambda: client.create(lines_for(client, draws(["a"])), {}))
    assert caught.value.status == 400 and server.counts["message_batches.create"] == 1 and not server.jobs


@PROVIDERS
def test_malformed_provider_answers_are_clear_errors(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    get = "batches.get" if provider == "openai" else "message_batches.get"
    lines = lines_for(client, draws(["m1", "m2"]))

    async def poll() -> JobStatus:  # a poll's garbled answer is transient: here it ends the wait, as persistent ones do
        return await wait(client, (await client.create(lines, {})).id, clock=clock, failures=0)

    server.script_route(get, Malformed())
    with pytest.raises(BackendError, match="malformed JSON"):
        run(client, poll)
    server.script_route(get, Status(200, body={"id": 7}))
    with pytest.raises(BackendError, match="a .*batch needs a string 'id'"):
        run(client, poll)
    server.plan(JobPlan(malformed=1))
    with pytest.raises(BackendError, match="malformed line 1 in the results"):
        run(client, lambda: through(client, lines, clock))


def test_a_sample_count_that_does_not_match_fails_its_line(clock: FakeClock) -> None:
    with FakeBatches(clock=clock, ignore_n=True) as server:
        client = client_for(server, "openai")
        lines = lines_for(client, draws(["n"], samples=2))
        _, (result,) = run(client, lambda: through(client, lines, clock))
    assert result.outcome == "errored" and result.error is not None and not result.error.retryable


# -- never paying twice -------------------------------------------------------------------------


def test_a_create_whose_answer_is_lost_is_found_not_sent_again(server: FakeBatches, sleeps: list[float]) -> None:
    client = client_for(server, "openai")
    server.script_route("batches.create", Lost())
    lines = lines_for(client, draws(["lost", "found"]))
    status = run(client, lambda: client.create(lines, {"outlines_intent": "i-lost"}))
    assert list(server.jobs) == [status.id] and server.counts["batches.create"] == 1
    assert sum(server.submitted.values()) == len(lines)


def test_an_anthropic_create_whose_answer_is_lost_names_the_batch_it_cannot_tell_yet(
        server: FakeBatches, clock: FakeClock, sleeps: list[float]) -> None:
    # A batch carries no metadata: the one that appeared is not taken on its size while it runs (another
    # program's could be that size), nor is the create sent again. Once it has ended, its results tell.
    client = client_for(server, "anthropic")
    server.script_route("message_batches.create", Lost())
    lines = lines_for(client, draws(["lost", "found"]))
    since = clock.time()
    with pytest.raises(JobInDoubt, match="msgbatch_fake.* may be the one whose answer was lost") as caught:
        run(client, lambda: client.create(lines, {}))
    assert caught.value.jobs == list(server.jobs) and server.counts["message_batches.create"] == 1
    clock.advance(60)
    found = run(client, lambda: client.find({}, 2, since, custom_ids=[line.custom_id for line in lines]))
    assert found is not None and [found.id] == list(server.jobs)
    assert sum(server.submitted.values()) == len(lines)


@PROVIDERS
def test_a_create_that_made_nothing_is_sent_again(server: FakeBatches, provider: str, sleeps: list[float]) -> None:
    client = client_for(server, provider)
    create = "batches.create" if provider == "openai" else "message_batches.create"
    server.script_route(create, Status(500))
    status = run(client, lambda: client.create(lines_for(client, draws(["again"])), {"outlines_intent": "i-again"}))
    assert list(server.jobs) == [status.id] and server.counts[create] == 2 and len(sleeps) == 1


def test_find_looks_by_metadata_through_every_page(server: FakeBatches, clock: FakeClock) -> None:
    client = client_for(server, "openai")

    async def main() -> Any:
        ids = []
        for i in range(5):
            ids.append((await client.create(lines_for(client, draws([f"j{i}"])), {"outlines_intent": f"i{i}"})).id)
            clock.advance(1)
        pages, after = [], None
        while True:
            page, after = await client.page(after, limit=2)
            pages.append([s.id for s in page])
            if after is None:
                break
        found = await client.find({"outlines_intent": "i1"}, 1, clock.time() - 100)
        missing = await client.find({"outlines_intent": "nope"}, 1, clock.time() - 100)
        return ids, pages, found, missing

    ids, pages, found, missing = run(client, main)
    assert pages == [ids[4:2:-1], ids[2:0:-1], ids[:1]]  # newest first, two a page
    assert found is not None and found.id == ids[1] and missing is None


def test_anthropic_find_takes_a_batch_by_its_results_never_by_its_size(server: FakeBatches,
                                                                       clock: FakeClock) -> None:
    client = client_for(server, "anthropic")
    ours = lines_for(client, draws(["ours-1", "ours-2"]))
    custom_ids = [line.custom_id for line in ours]

    async def main() -> Any:
        since = clock.time()
        # Another program's batch of the same size, created first, then ours (and others of other sizes).
        stranger = await client.create(lines_for(client, draws(["theirs-1", "theirs-2"])), {})
        clock.advance(1)
        mine = await client.create(ours, {})
        for size in (1, 3):
            await client.create(lines_for(client, draws([f"s{size}-{k}" for k in range(size)])), {})
        with pytest.raises(JobInDoubt) as running:  # both may be ours while they run: no guess
            await client.find({}, 2, since, custom_ids=custom_ids)
        clock.advance(60)
        found = await client.find({}, 2, since, custom_ids=custom_ids)
        known = await client.find({}, 2, since, exclude=[mine.id], custom_ids=custom_ids)
        return stranger, mine, running.value, found, known

    stranger, mine, running, found, known = run(client, main)
    assert sorted(running.jobs) == sorted([stranger.id, mine.id]) and "run again once they have ended" in str(running)
    assert found is not None and found.id == mine.id and known is None


@PROVIDERS
def test_jobs_of_finds_the_jobs_holding_our_requests(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    client = client_for(server, provider)
    ours = lines_for(client, draws(["o1", "o2", "o3"]))

    async def main() -> Any:
        since = clock.time()
        mine = await client.create(ours[:2], {"outlines_run": "r", "outlines_intent": "i1"})
        other_run = await client.create(lines_for(client, draws(["x1"])), {"outlines_run": "r2"})
        known = await client.create(ours[2:], {"outlines_run": "r", "outlines_intent": "i3"})
        running = await client.jobs_of("r", since, ours, exclude=[known.id])
        clock.advance(60)
        ended = await client.jobs_of("r", since, ours, exclude=[known.id])
        return mine, other_run, running, ended

    mine, other_run, running, ended = run(client, main)
    assert [(status.id, held) for status, held in ended] == [(mine.id, ours[:2])]
    # OpenAI tells a run's jobs by their metadata while they run; Anthropic's batches only by their results.
    found = [(status.id, held) for status, held in running]
    assert found == ([(mine.id, ours[:2])] if provider == "openai" else [])
    # What was read: the run's input files (twice), or the ended batches' results (the other run's too).
    assert server.counts["files.content"] == (2 if provider == "openai" else 0)
    assert server.counts["message_batches.results"] == (0 if provider == "openai" else 2)


@PROVIDERS
def test_jobs_of_skips_a_job_it_cannot_read(server: FakeBatches, clock: FakeClock, provider: str) -> None:
    # A stranger's job whose input file was deleted (or whose results are gone) must not stop our runs.
    client = client_for(server, provider)
    ours = lines_for(client, draws(["k1"]))

    async def main() -> Any:
        since = clock.time()
        gone = await client.create(ours, {"outlines_run": "r"})
        clock.advance(60)
        job = server.job(gone.id)
        if provider == "openai":
            server.files.pop(job.input_file_id)
        else:
            server.script_route("message_batches.results", Status(404))
        return await client.jobs_of("r", since, ours)

    assert run(client, main) == []


# -- the wire ------------------------------------------------------------------------------------


def test_a_results_url_elsewhere_is_read_from_the_base_url(server: FakeBatches) -> None:
    client = client_for(server, "anthropic")
    elsewhere = {"id": "msgbatch_x", "processing_status": "ended", "request_counts": {"succeeded": 1},
                 "created_at": "2025-01-01T00:00:00Z", "results_url": "http://127.0.0.1:9/steal?key=1"}
    server.script_route("message_batches.get", Status(200, body=elsewhere))
    status = run(client, lambda: client.status("msgbatch_x"))
    assert status.results == ("/v1/messages/batches/msgbatch_x/results",)
    assert status.created_at == 1735689600.0 and status.state == "completed"


def test_ids_that_are_not_one_path_segment_are_refused(server: FakeBatches) -> None:
    client = client_for(server, "openai")
    with pytest.raises(ValueError, match="not a provider id"):
        run(client, lambda: client.status("../files/x"))


@PROVIDERS
def test_the_key_is_sent_and_never_shown(server: FakeBatches, provider: str, sleeps: list[float]) -> None:
    client = client_for(server, provider)
    get = "batches.get" if provider == "openai" else "message_batches.get"
    server.script_route(get, Status(403, body=f"denied for {KEY}"))
    with pytest.raises(BackendError) as caught:
        run(client, lambda: client.status("batch_1"))
    shown = [str(caught.value), repr(caught.value), repr(client), repr(vars(client))]
    assert all(KEY not in text for text in shown) and "***" in str(caught.value)
    keyless = OpenAIJobs(OpenAIChatBackend("m", base_url=server.base_url, api_key=""))
    with pytest.raises(BackendError, match="401"):
        run(keyless, lambda: keyless.status("batch_1"))


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="requests"):
        JobLimits(0, 10)
    with pytest.raises(ValueError, match="bytes"):
        OpenAIJobs(OpenAIChatBackend("m", api_key="k"), max_bytes=-1)


# -- job mode end to end: what the lines carry ------------------------------------------------


def _sent_lines(server: FakeBatches) -> list[Any]:
    return [line for job in server.jobs.values() for line in job.lines]


@pytest.mark.parametrize("dialect", ["openai", "compatible"])
def test_batch_mode_sends_choices_and_patterns_as_openai_takes_them(clock: FakeClock, tmp_path: Any,
                                                                    dialect: str) -> None:
    """OpenAI's server: choices as a strict enum, a pattern as a strict string pattern, 150 samples on two lines;
    the answers come back wrapped in an object and land unwrapped; one job, no live request, no retry round.
    A line cannot be probed: it carries the spec's fields whatever the model's dialect."""
    import outlines
    from outlines.cache import Cache
    from outlines.runtime.jobs import Jobs

    def answer(prompt: str, sample: int, body: Any) -> str:
        value = body["response_format"]["json_schema"]["schema"]["properties"]["value"]
        return json.dumps({"value": value["enum"][-1] if "enum" in value else str(100 + sample)})

    with FakeBatches(clock=clock, reply=answer) as server:
        llm = models.openai("fake-model", base_url=server.base_url, api_key=KEY, dialect=dialect, temperature=0.7,
                            max_tokens=8)
        picked, counted = llm("pick", choices=["yes", "no"], num_samples=150), llm("count", regex="[0-9]+")
        plan = outlines.explain(picked, counted, jobs=Jobs(clock=clock))
        assert "choices=: sent as response_format (the provider enforces it)" in plan.summary()
        assert "regex=: sent as response_format" in plan.summary()
        settings = Jobs(clock=clock, backoff=Backoff(first=1.0, cap=5.0))
        chosen, number = outlines.eval(picked, counted, jobs=settings, cache=Cache(tmp_path))
        assert chosen.tolist() == ["no"] * 150 and number == "100"
        assert server.count == 0 and server.counts["batches.create"] == 1
        bodies = sorted((line.body for line in _sent_lines(server)), key=lambda b: -b.get("n", 1))
        assert [b.get("n", 1) for b in bodies] == [128, 22, 1]  # the spec's most samples per request
        for body in bodies:
            assert not any(k.startswith("guided_") for k in body) and body["response_format"]["json_schema"]["strict"]
            assert "max_tokens" not in body and body["max_completion_tokens"] == 8
        assert bodies[0]["response_format"]["json_schema"]["schema"]["properties"]["value"] == {
            "type": "string", "enum": ["yes", "no"]}
        assert bodies[2]["response_format"]["json_schema"]["schema"]["properties"]["value"] == {
            "type": "string", "pattern": "^(?:[0-9]+)$"}


def test_batch_mode_runs_a_constraint_no_job_line_can_carry_live_and_says_so(clock: FakeClock,
                                                                            tmp_path: Any) -> None:
    """Anthropic's job requests carry no constraint, nor do OpenAI's /completions lines: those draws run live,
    checked here, and a draw that breaks it is asked again at once, never in a new job (up to 24 h each);
    explain says so before anything is paid. Unconstrained draws of the same models still go in jobs."""
    import outlines
    from outlines.cache import Cache
    from outlines.runtime.jobs import Jobs

    answers = iter(["perhaps", "yes"] + ["yes"] * 200)
    with FakeBatches(clock=clock, reply=lambda prompt, sample, body: next(answers)) as server:
        claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY, temperature=0.5)
        legacy = models.openai_completion("fake-model", base_url=server.base_url, api_key=KEY, dialect="openai")
        settings = Jobs(clock=clock, backoff=Backoff(first=1.0, cap=5.0))
        summary = outlines.explain(claude("Is it?", choices=["yes", "no"]), legacy("p", regex="y.*"),
                                   jobs=settings).summary()
        assert summary.count("not expressible in the provider's job requests: these draws run live") == 2
        assert "asked again at once, up to 3 more" in summary and "new job round" not in summary
        value = outlines.eval(claude("Is it?", choices=["yes", "no"]), jobs=settings, cache=Cache(tmp_path))
        assert value == "yes" and server.counts["message_batches.create"] == 0  # no job: live, retried at once
        assert server.count == 2  # "perhaps" (refused here), then "yes"
        server.reply = lambda prompt, sample, body: "yy"
        assert outlines.eval(legacy("p", regex="y.*"), jobs=settings, cache=Cache(tmp_path)) == "yy"
        assert server.count == 3 and server.counts["batches.create"] == 0
        assert outlines.eval(legacy("q"), jobs=settings, cache=Cache(tmp_path)) == "yy"  # unconstrained: a job
        assert server.count == 3 and server.counts["batches.create"] == 1
