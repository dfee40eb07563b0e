"""OpenAI-compatible backends against the fault-injecting fake server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import json
import logging
import pickle
import time
from typing import Any, Sequence

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.backends import openai as openai_backends
from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
from tests.fixtures.fake_openai import (
    OK,
    Close,
    FakeOpenAI,
    Malformed,
    NoChoices,
    Redirect,
    Stall,
    Status,
    Truncated,
)

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

KEY = "sk-test-SECRET-0123456789"
SAMPLING = GenerationParams.create(temperature=0.7)


def completion(server: FakeOpenAI, **options: Any) -> OpenAICompletionBackend:
    return OpenAICompletionBackend("fake-model", base_url=server.base_url, api_key=KEY, **options)


def chat(server: FakeOpenAI, **options: Any) -> OpenAIChatBackend:
    return OpenAIChatBackend("fake-model", base_url=server.base_url, api_key=KEY, **options)


def run(backend: Any, requests: Sequence[Draw], report: BatchReport | None = None) -> list[str]:
    """One ``generate`` on a fresh loop, closing the session like the scheduler does."""

    async def main() -> list[str]:
        try:
            return await backend.generate(requests, report or BatchReport())
        finally:
            await backend.aclose()

    return asyncio.run(main())


def draws(*prompts: str, params: GenerationParams = SAMPLING) -> list[Draw]:
    counts: dict[str, int] = {}
    out = []
    for prompt in prompts:
        out.append(Draw(prompt, params, counts.get(prompt, 0)))
        counts[prompt] = counts.get(prompt, 0) + 1
    return out


# -- the wire --------------------------------------------------------------------------


def test_completions_send_many_prompts_in_one_request(fake_openai: FakeOpenAI) -> None:
    prompts = [f"p{i}" for i in range(20)]
    assert run(completion(fake_openai), draws(*prompts)) == [f"{p}#0" for p in prompts]
    assert len(fake_openai.requests) == 1
    body = fake_openai.requests[0].body
    assert body["prompt"] == prompts and "n" not in body and body["model"] == "fake-model"


def test_draws_of_one_prompt_use_n_and_map_back_in_order(fake_openai: FakeOpenAI) -> None:
    requests = draws("a", "b", "a", "c", "a", "b")
    assert run(completion(fake_openai), requests) == ["a#0", "b#0", "a#1", "c#0", "a#2", "b#1"]
    sent = sorted((r.body.get("n", 1), r.body["prompt"]) for r in fake_openai.requests)
    assert sent == [(1, "c"), (2, "b"), (3, "a")]


def test_choices_are_mapped_by_index_not_position(fake_openai: FakeOpenAI) -> None:
    shuffled = {"choices": [{"index": 1, "text": "B"}, {"index": 0, "text": "A"}]}
    fake_openai.script(Status(200, body=shuffled))
    assert run(completion(fake_openai), draws("a", "b")) == ["A", "B"]


def test_generation_params_pass_through(fake_openai: FakeOpenAI) -> None:
    params = GenerationParams.create(
        max_tokens=7, temperature=0.3, top_p=0.9, stop=["\n", "END"], seed=11, logit_bias={"50256": -100}
    )
    run(completion(fake_openai), [Draw("x", params)])
    body = fake_openai.requests[0].body
    assert body["max_tokens"] == 7 and body["temperature"] == 0.3 and body["top_p"] == 0.9
    assert body["stop"] == ["\n", "END"] and body["seed"] == 11 and body["logit_bias"] == {"50256": -100}


@pytest.mark.parametrize("model, dialect", [("gpt-4o-mini", "openai"), ("gpt-5-mini", "openai"), ("o3", "compatible"),
                                            ("openai/gpt-5.1", "compatible"), ("fake-model", "compatible")])
def test_chat_bounds_completions_with_max_completion_tokens_never_max_tokens(
    fake_openai: FakeOpenAI, model: str, dialect: str
) -> None:
    """The spec's field (max_tokens is deprecated and refused by o-series and GPT-5 models); seed and stop go as given."""
    backend = OpenAIChatBackend(model, base_url=fake_openai.base_url, api_key=KEY, dialect=dialect)
    temperature = 1.0 if backend.reasoning else 0.3  # reasoning models take only the default (1)
    stop = [] if model == "o3" else ["END"]  # o3 and o4-mini take no stop
    params = GenerationParams.create(max_tokens=7, temperature=temperature, stop=stop, seed=11)
    backend.check_params(params)
    run(backend, [Draw("x", params, 0), Draw("x", params, 1)])
    (body,) = (r.body for r in fake_openai.requests)
    assert body == {"model": model, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 7,
                    "temperature": temperature, "seed": 11, **({"stop": stop} if stop else {}), "n": 2}
    run(completion(fake_openai), [Draw("x", params, 0)])  # /completions has only max_tokens in the spec
    assert fake_openai.requests[1].body["max_tokens"] == 7 and "max_completion_tokens" not in fake_openai.requests[1].body


UNKNOWN_FIELD = Status(400, body={"error": {"message": "Unrecognized request argument supplied: max_completion_tokens"}})


def test_a_compatible_server_that_does_not_know_max_completion_tokens_learns_it_from_a_probe(
    fake_openai: FakeOpenAI, default_cache: Any
) -> None:
    from outlines.backends import quirks

    fake_openai.script(UNKNOWN_FIELD, UNKNOWN_FIELD)  # the request, then the probe that carries only the field
    params = GenerationParams.create(max_tokens=7)
    assert run(chat(fake_openai), [Draw("x", params)]) == ["x#0"]
    first, probe, again = (r.body for r in fake_openai.requests)
    assert first["max_completion_tokens"] == 7 and probe == {
        "model": "fake-model", "messages": [{"role": "user", "content": "Say OK."}], "max_completion_tokens": 16}
    assert again["max_tokens"] == 7 and "max_completion_tokens" not in again
    assert quirks.known(quirks.scope(fake_openai.base_url, "fake-model")) == {"refuses_max_completion_tokens"}
    run(chat(fake_openai), [Draw("y", params)])
    assert fake_openai.requests[3].body["max_tokens"] == 7 and fake_openai.count == 4  # known: no probe again


@pytest.mark.parametrize("model, dialect", [("gpt-4o-mini", "openai"), ("gpt-5-mini", "compatible")])
def test_openais_server_and_reasoning_models_never_fall_back_to_max_tokens(
    fake_openai: FakeOpenAI, model: str, dialect: str
) -> None:
    fake_openai.script(UNKNOWN_FIELD)
    backend = OpenAIChatBackend(model, base_url=fake_openai.base_url, api_key=KEY, dialect=dialect)
    with pytest.raises(BackendError, match="status=400"):
        run(backend, [Draw("x", GenerationParams.create(max_tokens=7))])
    assert fake_openai.count == 1  # no probe, no max_tokens


def test_a_refusal_of_one_requests_max_completion_tokens_is_that_requests(fake_openai: FakeOpenAI) -> None:
    from outlines.backends import quirks

    too_large = Status(400, body={"error": {"message": "max_completion_tokens is too large: 999999. This model "
                                            "supports at most 16384 completion tokens."}})
    fake_openai.script(too_large)  # the probe is answered: the server knows the field
    with pytest.raises(BackendError, match="too large"):
        run(chat(fake_openai), [Draw("x", GenerationParams.create(max_tokens=999999))])
    assert fake_openai.count == 2 and quirks.known(quirks.scope(fake_openai.base_url, "fake-model")) == frozenset()
    quirks.forget()


def test_later_draws_with_a_seed_get_a_shifted_seed(fake_openai: FakeOpenAI) -> None:
    params = GenerationParams.create(temperature=1.0, seed=100)
    run(completion(fake_openai), [Draw("x", params, 3), Draw("x", params, 4)])
    body = fake_openai.requests[0].body
    assert body["seed"] == 103 and body["n"] == 2


def test_chat_sends_one_request_per_prompt_with_system_prompt_and_n(fake_openai: FakeOpenAI) -> None:
    backend = chat(fake_openai, system_prompt="Be terse.")
    assert run(backend, draws("a", "b", "a")) == ["a#0", "b#0", "a#1"]
    bodies = sorted((r.body for r in fake_openai.requests), key=lambda b: b["messages"][-1]["content"])
    assert [b.get("n", 1) for b in bodies] == [2, 1]
    assert bodies[0]["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "a"}]
    assert all(r.path == "/v1/chat/completions" for r in fake_openai.requests)


def test_chat_sends_a_conversation_as_its_messages(fake_openai: FakeOpenAI) -> None:
    from outlines.chat import Conversation

    conversation = Conversation.of([("user", "hi"), ("assistant", "hello"), ("user", "more")])
    run(chat(fake_openai, system_prompt="Be terse."), [Draw(conversation, GenerationParams())])
    assert fake_openai.requests[0].body["messages"] == [{"role": "system", "content": "Be terse."}] + \
        conversation.messages
    own_system = Conversation.of([("system", "Mine."), ("user", "hi")])
    run(chat(fake_openai, system_prompt="Be terse."), [Draw(own_system, GenerationParams())])
    assert fake_openai.requests[1].body["messages"] == own_system.messages  # its own system message wins


def test_chat_without_content_is_a_typed_error(fake_openai: FakeOpenAI) -> None:
    refusal = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "refusal": "no"}}]}
    fake_openai.script(Status(200, body=refusal))
    with pytest.raises(BackendError, match="refused"):
        run(chat(fake_openai), draws("a"))


def test_identity_and_defaults() -> None:
    backend = OpenAICompletionBackend("m", base_url="http://127.0.0.1:1/v1/", api_key=KEY)
    assert backend.identity == ("openai_completion", "m", "http://127.0.0.1:1/v1")
    assert backend.max_batch == 128 and backend.max_concurrency == 32 and backend.max_retries == 3
    other = OpenAIChatBackend("m", base_url="http://127.0.0.1:1/v1", api_key="another key")
    assert other.identity == ("openai", "m", "http://127.0.0.1:1/v1", None)
    # Same identity (cache keys), but another key never shares a batch.
    same_but_key = OpenAIChatBackend("m", base_url="http://127.0.0.1:1/v1", api_key=KEY)
    assert other.identity == same_but_key.identity and other != same_but_key


def test_environment_configuration(monkeypatch: pytest.MonkeyPatch, fake_openai: FakeOpenAI) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", fake_openai.base_url)
    assert run(OpenAICompletionBackend("m"), draws("x")) == ["x#0"]
    assert fake_openai.requests[0].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize(
    "options, message",
    [
        ({"base_url": "http://user:pw@127.0.0.1:1/v1"}, "credentials"),
        ({"base_url": "ftp://127.0.0.1/v1"}, "http"),
        ({"max_batch": 0}, "max_batch"),
        ({"max_concurrency": 0}, "max_concurrency"),
    ],
)
def test_bad_options_fail_at_construction(options: dict[str, Any], message: str) -> None:
    options.setdefault("base_url", "http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match=message):
        OpenAICompletionBackend("m", **options)


# -- fallbacks -------------------------------------------------------------------------


def test_refused_lists_fall_back_to_one_prompt_per_request_and_say_so_once(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    fake_openai.refuse_lists = True
    backend = completion(fake_openai)
    with caplog.at_level(logging.WARNING, logger="outlines.backends.openai"):
        assert run(backend, draws("a", "b", "c")) == ["a#0", "b#0", "c#0"]
        assert run(backend, draws("d", "e")) == ["d#0", "e#0"]
    prompts = fake_openai.prompts()
    assert prompts[0] == ["a", "b", "c"] and sorted(prompts[1:4]) == ["a", "b", "c"]
    assert sorted(prompts[4:]) == ["d", "e"]  # remembered: no second list attempt
    assert [r.getMessage() for r in caplog.records].count(f"{fake_openai.base_url} refuses a list of prompts; "
                                                         "sending one prompt per request") == 1


@pytest.mark.parametrize("kind", [chat, completion])
def test_ignored_n_keeps_the_first_answer_and_asks_one_request_per_further_sample(
    fake_openai: FakeOpenAI, kind: Any
) -> None:
    fake_openai.ignore_n = True
    fake_openai.reply = lambda prompt, sample, body: f"{prompt}@seed{body.get('seed')}"
    seeded = GenerationParams.create(temperature=1.0, seed=5)
    out = run(kind(fake_openai), [Draw("a", seeded, 0), Draw("a", seeded, 1), Draw("a", seeded, 2)])
    assert out == ["a@seed5", "a@seed6", "a@seed7"]  # draw 0 is the answer to the request that asked n=3
    bodies = [r.body for r in fake_openai.requests]
    assert len(bodies) == 3 and bodies[0]["n"] == 3 and all("n" not in b for b in bodies[1:])
    assert sorted(b["seed"] for b in bodies[1:]) == [6, 7]
    fake_openai.reset()  # known now: one request per sample from the start, seeds as before
    assert run(kind(fake_openai), [Draw("b", seeded, 0), Draw("b", seeded, 1)]) == ["b@seed5", "b@seed6"]
    assert [r.body.get("n") for r in fake_openai.requests] == [None, None]


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_twenty_prompts_times_three_samples_cost_sixty_requests_on_a_server_ignoring_n(
    fake_openai: FakeOpenAI, constructor: Any
) -> None:
    fake_openai.ignore_n = fake_openai.refuse_lists = True  # as transformers serve
    llm = constructor("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=1.0)
    out = llm([f"q{i}" for i in range(20)], num_samples=3).eval(cache=False)
    assert out.shape == (20, 3)
    list_refusal = 1 if constructor is models.openai_completion else 0  # the one list the server refused
    assert fake_openai.count == 60 + list_refusal


@pytest.mark.parametrize(
    "body, refused",
    [
        ({"detail": "prompt must be a string."}, True),  # transformers serve
        ([{"type": "string_type", "loc": ["body", "prompt"], "msg": "Input should be a valid string"}], True),
        ("batched prompt lists are not supported", True),
        ("a list of prompts is not supported", True),
        ("This model's maximum context length is 2048 tokens; you requested 3000 tokens in the prompt", False),
        ({"error": {"message": "max_tokens is too large"}}, False),
    ],
)
def test_which_400s_mean_lists_are_refused(body: Any, refused: bool) -> None:
    text = body if isinstance(body, str) else json.dumps(body)
    assert openai_backends._refuses_lists(BackendError("HTTP 400", status=400, body=text)) is refused


def test_a_400_about_something_else_is_not_a_list_refusal(fake_openai: FakeOpenAI) -> None:
    fake_openai.script(Status(400, body={"error": {"message": "max_tokens is too large"}}))
    with pytest.raises(BackendError) as caught:
        run(completion(fake_openai), draws("a", "b"))
    assert caught.value.status == 400 and len(fake_openai.requests) == 1


# -- retries ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure, expected_sleep",
    [
        (Status(429, {"Retry-After": "2"}), 2.0),
        (Status(429, {"retry-after-ms": "1500", "Retry-After": "9"}), 1.5),
        (Status(429, {"Retry-After": "-10"}), "backoff"),
        (Status(500), "backoff"),
        (Status(502), "backoff"),
        (Status(503, {"Retry-After": "0"}), "backoff"),
        (Status(408), "backoff"),
        (Status(409), "backoff"),
        (Close(), "backoff"),
        (Truncated(), "backoff"),
    ],
    ids=lambda v: getattr(v, "status", type(v).__name__) if not isinstance(v, (float, str)) else str(v),
)
def test_transient_failures_are_retried(
    fake_openai: FakeOpenAI, sleeps: list[float], failure: Any, expected_sleep: Any
) -> None:
    fake_openai.script(failure, OK)
    assert run(completion(fake_openai), draws("a", "b")) == ["a#0", "b#0"]
    assert len(fake_openai.requests) == 2
    if expected_sleep == "backoff":
        assert len(sleeps) == 1 and 0.375 <= sleeps[0] <= 0.5
    else:
        assert sleeps == [expected_sleep]


def test_a_stall_past_the_read_timeout_is_retried(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    fake_openai.script(Stall(2.0), OK)
    started = time.perf_counter()
    assert run(completion(fake_openai, timeout=0.2), draws("a")) == ["a#0"]
    assert time.perf_counter() - started < 1.5 and len(fake_openai.requests) == 2


def test_an_unreachable_server_is_retried_then_fails(sleeps: list[float]) -> None:
    backend = OpenAICompletionBackend("m", base_url="http://127.0.0.1:9/v1", api_key=KEY, max_retries=2)
    with pytest.raises(BackendError, match="gave up after 3 attempts") as caught:
        run(backend, draws("a"))
    assert caught.value.retryable and len(sleeps) == 2 and KEY not in str(caught.value)


def test_backoff_grows_until_retries_run_out(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    fake_openai.script(*[Status(503)] * 4)
    with pytest.raises(BackendError, match="gave up after 4 attempts") as caught:
        run(completion(fake_openai), draws("a"))
    assert caught.value.status == 503 and len(fake_openai.requests) == 4
    assert len(sleeps) == 3 and sleeps[0] < sleeps[1] < sleeps[2]


@pytest.mark.parametrize("retry_after", ["3600", "inf", "1e40", "Wed, 21 Oct 2099 07:28:00 GMT"])
def test_a_retry_after_beyond_the_cap_fails_fast(
    fake_openai: FakeOpenAI, sleeps: list[float], retry_after: str
) -> None:
    fake_openai.script(Status(429, {"Retry-After": retry_after}))
    with pytest.raises(BackendError, match="max_retry_after") as caught:
        run(completion(fake_openai), draws("a"))
    assert caught.value.status == 429 and len(fake_openai.requests) == 1 and sleeps == []


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_client_errors_are_never_retried(fake_openai: FakeOpenAI, sleeps: list[float], status: int) -> None:
    fake_openai.script(Status(status, body={"error": {"message": f"nope, Incorrect API key provided: {KEY}"}}))
    with pytest.raises(BackendError) as caught:
        run(completion(fake_openai), draws("a"))
    error = caught.value
    assert len(fake_openai.requests) == 1 and sleeps == []
    assert error.status == status and not error.retryable
    assert error.endpoint == fake_openai.base_url + "/completions" and error.model == "fake-model"
    assert "nope" in (error.body or "") and KEY not in str(error) and KEY not in (error.body or "")


@pytest.mark.parametrize(
    "bad",
    [
        Malformed(),
        Malformed("[1, 2]"),
        NoChoices(),
        Status(200, body={"choices": [{"index": 0, "text": "only one"}]}),
        Status(200, body={"choices": [{"index": 0, "text": 1}, {"index": 1, "text": "b"}]}),
    ],
    ids=["not-json", "not-object", "no-choices", "too-few", "not-text"],
)
def test_malformed_bodies_are_typed_errors_without_retry(
    fake_openai: FakeOpenAI, sleeps: list[float], bad: Any
) -> None:
    fake_openai.script(bad)
    with pytest.raises(BackendError) as caught:
        run(completion(fake_openai), draws("a", "b"))
    assert caught.value.status == 200 and len(fake_openai.requests) == 1


def test_malformed_responses_are_never_cached(fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    from outlines.cache import Cache

    cache = Cache(tmp_path / "cache")
    llm = models.openai_completion("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.5)
    fake_openai.script(Malformed())
    with pytest.raises(Exception, match="malformed JSON"):
        llm("hello").eval(cache=cache)
    assert llm("hello").eval(cache=cache) == "hello#0"
    assert llm("hello").eval(cache=cache) == "hello#0"
    assert len(fake_openai.requests) == 2


# -- limits, sessions, cancellation ----------------------------------------------------


def test_concurrency_cap_is_observed_server_side(fake_openai: FakeOpenAI) -> None:
    fake_openai.latency = 0.05
    prompts = [f"p{i}" for i in range(20)]
    assert run(chat(fake_openai, max_concurrency=4), draws(*prompts)) == [f"{p}#0" for p in prompts]
    assert fake_openai.max_in_flight == 4


def test_429_lowers_concurrency_and_successes_restore_it(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    backend = chat(fake_openai, max_concurrency=8)

    async def main() -> tuple[int, int]:
        try:
            fake_openai.script(Status(429))
            await backend.generate(draws("first"), BatchReport())
            lowered = backend.client.state().limiter.limit
            await backend.generate(draws(*[f"p{i}" for i in range(200)]), BatchReport())
            return lowered, backend.client.state().limiter.limit
        finally:
            await backend.aclose()

    lowered, recovered = asyncio.run(main())
    assert lowered == 4 and recovered == 8


def test_rpm_and_tpm_budgets_pace_requests(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    run(chat(fake_openai, rpm=2, max_concurrency=1), draws("a", "b", "c"))
    assert sleeps == [pytest.approx(30.0, abs=0.5)]
    sleeps.clear()
    params = GenerationParams.create(max_tokens=100, temperature=0.5)
    run(chat(fake_openai, tpm=150, max_concurrency=1), draws("a", "b", params=params))
    assert len(sleeps) == 1 and sleeps[0] > 0  # the second request waits for the first one's tokens


def test_usage_is_reported(fake_openai: FakeOpenAI) -> None:
    report = BatchReport()
    run(completion(fake_openai), draws("one two", "three"), report)
    assert report.tokens == [3, 2, 0, 0] and report.requests == 1


def test_two_consecutive_runs_and_errors_leave_no_open_session(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    llm = models.openai_completion("fake-model", base_url=fake_openai.base_url, api_key=KEY)
    assert llm("a").eval(cache=False) == "a#0"
    assert llm("b").eval(cache=False) == "b#0"
    fake_openai.script(Status(401))
    with pytest.raises(Exception, match="401"):
        llm("c").eval(cache=False)
    assert llm("d").eval(cache=False) == "d#0"


def test_eval_inside_a_running_loop(fake_openai: FakeOpenAI) -> None:
    llm = models.openai("fake-model", base_url=fake_openai.base_url, api_key=KEY)

    async def main() -> tuple[str, str]:
        return llm("sync").eval(cache=False), await llm("async").aeval(cache=False)

    assert asyncio.run(main()) == ("sync#0", "async#0")


def test_cancelling_20_in_flight_requests_returns_every_connection(fake_openai: FakeOpenAI) -> None:
    backend = chat(fake_openai, max_concurrency=20)

    async def main() -> list[str]:
        try:
            fake_openai.script(*[Stall(30.0)] * 20)
            task = asyncio.ensure_future(backend.generate(draws(*[f"slow{i}" for i in range(20)]), BatchReport()))
            while fake_openai.in_flight < 20:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            state = backend.client.state()
            assert state.limiter.in_flight == 0
            connector = state.session.connector
            assert connector is not None and not connector._acquired  # type: ignore[attr-defined]
            return await asyncio.wait_for(backend.generate(draws(*[f"p{i}" for i in range(20)]), BatchReport()), 10)
        finally:
            await backend.aclose()

    assert asyncio.run(main()) == [f"p{i}#0" for i in range(20)]


def test_backends_pickle_without_sessions_and_keep_working(fake_openai: FakeOpenAI) -> None:
    backend = completion(fake_openai, rpm=1000)

    async def use_then_pickle() -> bytes:
        await backend.generate(draws("a"), BatchReport())
        try:
            return pickle.dumps(backend)
        finally:
            await backend.aclose()

    copy = pickle.loads(asyncio.run(use_then_pickle()))
    assert copy == backend and run(copy, draws("b")) == ["b#0"]
    assert fake_openai.requests[-1].headers["Authorization"] == f"Bearer {KEY}"


# -- secrets ---------------------------------------------------------------------------


def test_the_key_never_shows(fake_openai: FakeOpenAI, sleeps: list[float], caplog: pytest.LogCaptureFixture) -> None:
    backend = chat(fake_openai)
    llm = models.openai("fake-model", base_url=fake_openai.base_url, api_key=KEY)
    shown = [repr(backend), str(backend), repr(vars(backend)), repr(vars(backend.client)), str(backend.identity),
             repr(llm), repr(llm("x").owner.op)]  # type: ignore[union-attr]

    async def in_debug_mode() -> list[str]:
        try:
            return await backend.generate(draws("a"), BatchReport())
        finally:
            await backend.aclose()

    # Everything at DEBUG, aiohttp's own loggers and asyncio's debug mode included.
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="aiohttp"):
        fake_openai.script(Status(503), Close(), Status(400, body={"error": f"bad key {KEY}"}))
        with pytest.raises(BackendError) as caught:
            asyncio.run(in_debug_mode(), debug=True)
    shown += [str(caught.value), repr(caught.value), caught.value.body or "", caplog.text]
    assert "retrying" in caplog.text
    assert all(KEY not in text for text in shown)
    assert fake_openai.requests[0].headers["Authorization"] == f"Bearer {KEY}"


def test_the_key_never_shows_in_traces(fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    recorder = outlines.trace()
    llm = models.openai("fake-model", base_url=fake_openai.base_url, api_key=KEY)
    with recorder as trace:
        llm("traced").eval(cache=False)
    trace.to_json(tmp_path / "trace.json")
    assert KEY not in trace.summary() and KEY not in (tmp_path / "trace.json").read_text()
    assert trace.tokens == (1, 1)  # the usage the fake server reported reaches the trace


def test_extra_headers_are_sent_and_hidden(fake_openai: FakeOpenAI) -> None:
    backend = completion(fake_openai, headers={"api-key": "azure-SECRET-42", "X-Team": "research"})
    fake_openai.script(Status(403, body="denied for azure-SECRET-42"))
    with pytest.raises(BackendError) as caught:
        run(backend, draws("a"))
    assert fake_openai.requests[0].headers["api-key"] == "azure-SECRET-42"
    assert fake_openai.requests[0].headers["X-Team"] == "research"
    shown = [repr(vars(backend.client)), str(caught.value)]
    assert all("azure-SECRET-42" not in text for text in shown)


def test_authorization_is_not_forwarded_to_another_host(fake_openai: FakeOpenAI) -> None:
    with FakeOpenAI() as elsewhere:
        fake_openai.script(Redirect(elsewhere.base_url + "/completions"))
        assert run(completion(fake_openai), draws("a")) == ["a#0"]
        assert len(elsewhere.requests) == 1
        assert "Authorization" not in elsewhere.requests[0].headers
    fake_openai.script(Redirect(fake_openai.base_url + "/elsewhere/completions"))
    run(completion(fake_openai), draws("b"))
    assert fake_openai.requests[-1].headers["Authorization"] == f"Bearer {KEY}"  # same origin: kept


# -- through the library ---------------------------------------------------------------


def test_a_20_prompt_graph_is_one_request(fake_openai: FakeOpenAI) -> None:
    llm = models.openai_completion("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.7)
    question = outlines.string("question")
    answers = llm(question, num_samples=2)
    prompts = [f"q{i}" for i in range(20)]
    result = answers.eval({question: prompts}, cache=False)
    assert result.shape == (20, 2)
    assert result.tolist() == [[f"{p}#0", f"{p}#1"] for p in prompts]
    assert len(fake_openai.requests) == 1 and fake_openai.requests[0].body["n"] == 2


def test_greedy_draws_collapse_and_per_call_overrides_apply(fake_openai: FakeOpenAI) -> None:
    llm = models.openai_completion("fake-model", base_url=fake_openai.base_url, api_key=KEY, max_tokens=5)
    result = llm("g", num_samples=4, temperature=0).eval(cache=False)
    assert np.asarray(result).tolist() == ["g#0"] * 4
    body = fake_openai.requests[0].body
    assert len(fake_openai.requests) == 1 and "n" not in body
    assert body["temperature"] == 0 and body["max_tokens"] == 5


def test_repeated_greedy_requests_are_asked_once(fake_openai: FakeOpenAI) -> None:
    greedy = GenerationParams.create(temperature=0)
    assert run(completion(fake_openai), [Draw("g", greedy), Draw("h", greedy), Draw("g", greedy)]) == [
        "g#0", "h#0", "g#0"]
    assert fake_openai.prompts() == [["g", "h"]] and "n" not in fake_openai.requests[0].body


def test_mixed_params_in_one_call_stay_apart(fake_openai: FakeOpenAI) -> None:
    one, two = GenerationParams.create(temperature=1.0, seed=1), GenerationParams.create(temperature=1.0, seed=2)
    out = run(completion(fake_openai), [Draw("x", one, 0), Draw("x", one, 1), Draw("x", two, 0)])
    assert out == ["x#0", "x#1", "x#0"]
    assert sorted((r.body["seed"], r.body.get("n", 1)) for r in fake_openai.requests) == [(1, 2), (2, 1)]


def test_finished_chat_requests_are_cached_when_a_sibling_fails(fake_openai: FakeOpenAI, tmp_path) -> None:
    """3 chat prompts in one batch, one answered 400: the other 2 are cached, a re-run sends only 1."""
    import outlines
    from outlines.cache import Cache

    cache = Cache(tmp_path)
    llm = outlines.models.openai("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.5)
    class LateRefusal(Status):
        async def respond(self, server, request, body):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.3)  # after its siblings' answers have arrived
            return await super().respond(server, request, body)

    fake_openai.script(OK, OK, LateRefusal(400, body={"error": {"message": "bad prompt"}}))
    out = outlines.eval(llm(["a", "b", "c"]), cache=cache, errors="return")
    assert sum(isinstance(v, outlines.Failure) for v in out) == 1
    sent = len(fake_openai.requests)
    again = outlines.eval(llm(["a", "b", "c"]), cache=cache, errors="return")
    assert len(fake_openai.requests) - sent == 1
    kept = [i for i, v in enumerate(out) if not isinstance(v, outlines.Failure)]
    assert [again[i] for i in kept] == [out[i] for i in kept]
    assert not any(isinstance(v, outlines.Failure) for v in again)


# -- max_batch splits by prompts (issue 15) ----------------------------------------------


@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "cache"])
def test_max_batch_keeps_each_prompts_samples_in_one_request(fake_openai: FakeOpenAI, cached: bool, tmp_path) -> None:
    """200 prompts x 3 samples, max_batch 128: 5 requests of whole prompts (42, 42, 42, 42, 32), 200 prompts in all."""
    from outlines.cache import Cache

    llm = models.openai_completion("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.7)
    question = outlines.string("question")
    prompts = [f"q{i}" for i in range(200)]
    result = llm(question, num_samples=3).eval({question: prompts}, cache=Cache(tmp_path) if cached else False)
    assert result.tolist() == [[f"{p}#0", f"{p}#1", f"{p}#2"] for p in prompts]
    bodies = [r.body for r in fake_openai.requests]
    assert sorted(len(b["prompt"]) for b in bodies) == [32, 42, 42, 42, 42]
    assert all(b["n"] == 3 for b in bodies)
    sent = [p for b in bodies for p in b["prompt"]]
    assert sorted(sent) == sorted(prompts)  # each prompt once: its 3 samples travel together


def test_a_prompt_with_more_samples_than_max_batch_goes_in_pieces(fake_openai: FakeOpenAI) -> None:
    """10 samples of one prompt with max_batch 4: pieces of 4, 4 and 2, each with its own seed."""
    llm = models.openai_completion(
        "fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.7, seed=100, max_batch=4
    )
    result = llm("p", num_samples=10).eval(cache=False)
    assert result.shape == (10,)
    pieces = sorted((r.body["seed"], r.body["n"]) for r in fake_openai.requests)
    assert pieces == [(100, 4), (104, 4), (108, 2)]


def test_chat_max_batch_keeps_each_prompts_samples_in_one_request(fake_openai: FakeOpenAI) -> None:
    """Chat sends one request per prompt: 20 prompts x 3 samples with max_batch 16 are 20 requests with n=3."""
    llm = models.openai("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.7, max_batch=16)
    question = outlines.string("question")
    result = llm(question, num_samples=3).eval({question: [f"q{i}" for i in range(20)]}, cache=False)
    assert result.shape == (20, 3)
    assert len(fake_openai.requests) == 20 and all(r.body["n"] == 3 for r in fake_openai.requests)


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
@pytest.mark.parametrize("options, message", [
    ({"temperature": 2.5}, "temperature must be between 0 and 2 for OpenAI"),
    ({"top_p": 1.5}, "top_p must be between 0 and 1 for OpenAI"),
    ({"presence_penalty": -3}, "presence_penalty must be between -2 and 2 for OpenAI"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop takes at most 4 sequences for OpenAI"),
    ({"max_tokens": 0}, "max_tokens must be a positive integer"),
])
def test_settings_outside_the_specs_range_are_refused_at_build_time(
    constructor: Any, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):  # at construction, as model defaults
        constructor("fake-model", api_key=KEY, **options)
    llm = constructor("fake-model", api_key=KEY, temperature=2)  # the edge of the range is fine
    with pytest.raises(outlines.GraphBuildError, match=message):  # when a call is built with them
        llm("hi", **options)


@pytest.mark.parametrize("model", ["gpt-5-mini", "o3", "openai/gpt-5.1", "o4-mini-2025-04-16"])
@pytest.mark.parametrize("options, message", [
    ({"temperature": 0.3}, "temperature must be 1 for .* take only the default"),
    ({"temperature": 0}, "temperature must be 1 for .* take only the default"),
    ({"top_p": 0.9}, "top_p must be 1 for .* take only the default"),
])
def test_reasoning_models_refuse_sampling_settings_other_than_the_default_at_build_time(
    model: str, options: dict[str, Any], message: str
) -> None:
    """OpenAI answers "Only the default (1) value is supported" to every such request: refused before any is sent."""
    with pytest.raises(ValueError, match=message):
        models.openai(model, api_key=KEY, **options)
    assert models.openai(model, api_key=KEY).defaults.temperature is None  # no default of ours trips it
    llm = models.openai(model, api_key=KEY, temperature=1, top_p=1)  # the default, said aloud, is fine
    with pytest.raises(outlines.GraphBuildError, match=message):
        llm("hi", **options)
    models.openai("gpt-5-chat-latest", api_key=KEY, **options)  # GPT-5's chat snapshot does not reason
    models.openai("gpt-4o-mini", api_key=KEY, **options)


@pytest.mark.parametrize("model, refused", [("o3", True), ("o4-mini", True), ("gpt-5-mini", False),
                                            ("gpt-4o-mini", False)])
def test_o3_and_o4_mini_refuse_stop_at_build_time(model: str, refused: bool) -> None:
    """The spec's ``stop``: "Not supported with latest reasoning models o3 and o4-mini"."""
    if refused:
        with pytest.raises(ValueError, match=f"stop is not supported by {model}"):
            models.openai(model, api_key=KEY, stop=["END"])
    else:
        models.openai(model, api_key=KEY, stop=["END"])


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_more_samples_than_the_spec_allows_in_one_request_go_in_pieces_of_128(
    fake_openai: FakeOpenAI, constructor: Any
) -> None:
    """The spec caps ``n`` at 128: 300 samples with no max_batch are requests of 128, 128 and 44, seeds apart."""
    llm = constructor("fake-model", base_url=fake_openai.base_url, api_key=KEY, temperature=0.7, seed=5,
                      max_batch=None)
    result = llm("p", num_samples=300).eval(cache=False)
    assert result.tolist() == [f"p#{i % 128}" for i in range(300)]  # each piece's samples on its own draws
    assert sorted((r.body["seed"], r.body["n"]) for r in fake_openai.requests) == [(5, 128), (133, 128), (261, 44)]


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_a_missing_key_for_the_openai_api_fails_at_once_naming_where_to_give_one(
    monkeypatch: pytest.MonkeyPatch, sleeps: list[float], constructor: Any
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    llm = constructor("gpt-4o-mini", max_tokens=8)
    with outlines.trace() as trace:
        result = llm(["a", "b"]).eval(cache=False, errors="return")
    messages = {failure.message for failure in result}
    assert len(messages) == 1, messages
    (message,) = messages
    assert "no API key for https://api.openai.com/v1" in message
    assert "set OPENAI_API_KEY or pass api_key=" in message and f"{constructor.__name__}('gpt-4o-mini'" in message
    assert sleeps == [] and trace.requests == []  # nothing sent, nothing retried


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_a_server_asking_for_a_key_is_asked_once_and_the_error_names_where_to_give_one(
    fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, sleeps: list[float], constructor: Any
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    refusal = {"error": {"message": "You didn't provide an API key.", "type": "invalid_request_error"}}
    fake_openai.script(Status(401, body=refusal))
    llm = constructor("fake-model", base_url=fake_openai.base_url)
    with pytest.raises(outlines.common.errors.NodeError) as caught:
        llm("a").eval(cache=False)
    message = str(caught.value)
    assert "wants an API key (HTTP 401) and none was given" in message
    assert "set OPENAI_API_KEY or pass api_key=" in message and "provide an API key" in message
    assert len(fake_openai.requests) == 1 and sleeps == []
    assert "Authorization" not in fake_openai.requests[0].headers


def test_a_refused_key_says_so_and_never_shows_the_key(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    fake_openai.script(Status(401, body={"error": {"message": f"Incorrect API key provided: {KEY}"}}))
    with pytest.raises(BackendError) as caught:
        run(chat(fake_openai), draws("a"))
    message = str(caught.value)
    assert "refused the API key (HTTP 401): check OPENAI_API_KEY or api_key=" in message and KEY not in message
    assert caught.value.status == 401 and len(fake_openai.requests) == 1 and sleeps == []


def test_render_shows_the_messages_or_text_sent_and_no_token_ids() -> None:
    from outlines import chat as chat_values

    llm = models.openai("gpt-4o-mini", api_key=KEY, system_prompt="Be brief.")
    assert llm.render("Hi") == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    talk = chat_values.user("Hi") + chat_values.assistant("Hello") + "And you?"
    assert [m["role"] for m in llm.render(talk)] == ["system", "user", "assistant", "user"]
    completion_model = models.openai_completion("m", base_url="http://127.0.0.1:1/v1", api_key=KEY)
    assert completion_model.render("Q: 1 + 1 =") == "Q: 1 + 1 ="
    with pytest.raises(TypeError, match="do not expose token ids"):
        llm.render("Hi", tokens=True)


def test_the_fake_caches_answered_heads_as_openai_documents() -> None:
    """1,024 tokens at least, then steps of 128; only what was answered before a request arrived."""
    words = [f"w{i}" for i in range(1500)]
    with FakeOpenAI(latency=0.2) as server:
        backend = chat(server, prefix_warmup=False)
        together = BatchReport()
        run(backend, [Draw(" ".join(words) + f" q{i}", SAMPLING, 0) for i in range(3)], together)
        assert together.cached_tokens == 0  # sent at once: nothing was answered yet
        later = BatchReport()
        run(backend, [Draw(" ".join(words[:1300]) + " other", SAMPLING, 0)], later)
        assert later.cached_tokens == 1280 and later.tokens[0] == 1301
        short = BatchReport()
        run(backend, [Draw(" ".join(words[:1000]) + " x " * 200, SAMPLING, 0)], short)
        assert short.cached_tokens == 0  # shares under 1,024 tokens
