"""The Anthropic Messages backend against the fake provider on 127.0.0.1 (``tests.fixtures.fake_batches``)."""
from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Iterator, Sequence

import pytest

import outlines
from outlines import models
from outlines.backends.anthropic import DEFAULT_MAX_TOKENS, AnthropicBackend
from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.cache import Cache, draw_key
from tests.fixtures.fake_batches import FakeBatches
from tests.fixtures.fake_openai import Close, Malformed, Status

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

KEY = "sk-ant-test-SECRET-0123456789"
SAMPLING = GenerationParams.create(temperature=0.7, max_tokens=64)


@pytest.fixture
def server() -> Iterator[FakeBatches]:
    with FakeBatches() as fake:
        yield fake


def backend(server: FakeBatches, **options: Any) -> AnthropicBackend:
    return AnthropicBackend("claude-fake", base_url=server.anthropic_url, api_key=KEY, **options)


def run(model: AnthropicBackend, draws: Sequence[Draw], report: BatchReport | None = None) -> list[str]:
    async def main() -> list[str]:
        try:
            return await model.generate(draws, report or BatchReport())
        finally:
            await model.aclose()

    return asyncio.run(main())


def test_a_request_speaks_the_messages_api(server: FakeBatches) -> None:
    params = GenerationParams.create(temperature=0.5, stop=["END"], seed=7, max_tokens=32, top_k=5)
    assert run(backend(server, system_prompt="Be brief."), [Draw("hello", params, 0)]) == ["hello#0"]
    (request,) = server.requests
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == KEY and request.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in request.headers
    # No seed and no n (the API rejects both); stops are stop_sequences; the system prompt is top-level.
    assert request.body == {"model": "claude-fake", "max_tokens": 32, "system": "Be brief.",
                            "messages": [{"role": "user", "content": "hello"}], "temperature": 0.5,
                            "top_k": 5, "stop_sequences": ["END"]}


@pytest.mark.parametrize("model, options, message", [
    ("claude-fake", {"temperature": 1.5}, "temperature must be between 0 and 1 for Anthropic"),
    ("claude-fake", {"top_p": 1.2}, "top_p must be between 0 and 1 for Anthropic"),
    ("claude-fake", {"temperature": 0.5, "top_p": 0.9}, "temperature or top_p, not both"),
    ("claude-fake", {"top_k": 0}, "top_k must be an integer >= 1"),
    ("claude-fake", {"max_tokens": 0}, "max_tokens must be a positive integer"),
    ("claude-opus-4-7", {"temperature": 0}, "claude-opus-4-7 takes no temperature"),
    ("claude-sonnet-5-5", {"top_p": 0.5}, "claude-sonnet-5-5 takes no top_p"),
])
def test_settings_outside_anthropics_range_are_refused_at_build_time(model: str, options: dict[str, Any],
                                                                     message: str) -> None:
    with pytest.raises(ValueError, match=message):  # at construction, as model defaults
        models.anthropic(model, api_key=KEY, **options)
    llm = models.anthropic(model, api_key=KEY)
    with pytest.raises(outlines.GraphBuildError, match=message):  # when a call is built with them
        llm("hi", **options)


def test_max_tokens_is_always_sent(server: FakeBatches) -> None:
    run(backend(server), [Draw("x", GenerationParams(), 0)])
    assert server.requests[0].body["max_tokens"] == DEFAULT_MAX_TOKENS
    claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY, max_tokens=12)
    claude("y").eval(cache=False)
    assert server.requests[-1].body["max_tokens"] == 12
    assert models.anthropic("claude-fake", api_key=KEY).defaults.max_tokens == DEFAULT_MAX_TOKENS


def test_a_conversation_keeps_its_turns_and_its_system_message_goes_top_level(server: FakeBatches) -> None:
    from outlines import chat

    conversation = chat.system("You grade essays.") + chat.user("Grade this.") + chat.assistant("Grade:")
    claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY, system_prompt="ignored")
    claude(conversation).eval(cache=False)
    body = server.requests[0].body
    assert body["system"] == "You grade essays."
    assert body["messages"] == [{"role": "user", "content": "Grade this."}, {"role": "assistant", "content": "Grade:"}]


def test_each_sample_is_its_own_request_and_its_own_draw(server: FakeBatches, tmp_path: Any) -> None:
    fresh = itertools.count()
    server.reply = lambda prompt, sample, body: f"{prompt}:{next(fresh)}"
    claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY, temperature=1.0)
    cache = Cache(tmp_path)
    samples = claude("tell", num_samples=3).eval(cache=cache)
    assert len(server.requests) == 3 and len(set(samples)) == 3
    assert all("n" not in r.body for r in server.requests)
    # Each is cached under its own draw key: a re-run sends nothing and replays them.
    assert list(claude("tell", num_samples=3).eval(cache=cache)) == list(samples)
    assert len(server.requests) == 3
    keys = {draw_key(claude.backend.identity, Draw("tell", claude.defaults, d)) for d in range(3)}
    assert len(keys) == 3


def test_greedy_samples_collapse_to_one_request(server: FakeBatches) -> None:
    claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY)
    assert list(claude("g", num_samples=4, temperature=0).eval(cache=False)) == ["g#0"] * 4
    assert len(server.requests) == 1


def test_usage_is_reported_prompt_cache_tokens_included(server: FakeBatches) -> None:
    report = BatchReport()
    run(backend(server), [Draw("one two three", SAMPLING, 0)], report)
    assert report.tokens == [3, 1, 0, 0]
    cached = {"id": "m", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}],
              "stop_reason": "end_turn",
              "usage": {"input_tokens": 4, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 6,
                        "output_tokens": 2}}
    server.script(Status(200, body=cached))
    report = BatchReport()
    assert run(backend(server), [Draw("x", SAMPLING, 0)], report) == ["ok"]
    assert report.tokens == [100, 2, 90, 6]  # prompt, completion, read from and written to the cache


def test_overloaded_and_rate_limits_are_retried_honouring_retry_after(server: FakeBatches, sleeps: list[float]) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.script(Status(529, body=overloaded), Status(429, headers={"retry-after": "7"}), Close())
    assert run(backend(server), [Draw("x", SAMPLING, 0)]) == ["x#0"]
    assert len(server.requests) == 4
    assert sleeps[1] == 7.0  # the server's hint, longer than the backoff


def test_client_errors_are_not_retried_and_name_the_cause(server: FakeBatches, sleeps: list[float]) -> None:
    invalid = {"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long"}}
    server.script(Status(400, body=invalid))
    with pytest.raises(BackendError, match="prompt is too long") as caught:
        run(backend(server), [Draw("x", SAMPLING, 0)])
    assert caught.value.status == 400 and not caught.value.retryable
    assert len(server.requests) == 1 and sleeps == []


def test_a_temperature_above_one_fails_its_draw_before_sending(server: FakeBatches) -> None:
    report = BatchReport()
    hot = GenerationParams.create(temperature=1.5)
    with pytest.raises(BackendError, match="between 0 and 1"):
        run(backend(server), [Draw("hot", hot, 0), Draw("fine", SAMPLING, 0)], report)
    assert report.results == {1: "fine#0"} and list(report.failures) == [0]
    assert [r.body["messages"][0]["content"] for r in server.requests] == ["fine"]


@pytest.mark.parametrize(("body", "message"), [
    ({"type": "message", "content": "text"}, "no list of 'content'"),
    ({"type": "message", "content": [{"type": "text", "text": 3}]}, "no 'text' string"),
    ({"type": "message", "content": [], "stop_reason": "refusal"}, "refused"),
    ({"type": "message", "content": [{"type": "tool_use", "id": "t"}], "stop_reason": "tool_use"}, "no text block"),
])
def test_malformed_answers_are_typed_errors(server: FakeBatches, body: Any, message: str) -> None:
    server.script(Status(200, body=body))
    with pytest.raises(BackendError, match=message):
        run(backend(server), [Draw("x", SAMPLING, 0)])


def test_text_blocks_are_joined_and_an_empty_turn_is_empty_text(server: FakeBatches) -> None:
    blocks = {"type": "message", "stop_reason": "end_turn",
              "content": [{"type": "text", "text": "a"}, {"type": "thinking", "thinking": "?"}, {"type": "text", "text": "b"}]}
    server.script(Status(200, body=blocks), Status(200, body={"type": "message", "content": [], "stop_reason": "end_turn"}))
    assert run(backend(server), [Draw("x", SAMPLING, 0), Draw("y", SAMPLING, 0)]) == ["ab", ""]


def test_a_body_that_is_not_json_is_a_typed_error(server: FakeBatches) -> None:
    server.script(Malformed())
    with pytest.raises(BackendError, match="malformed JSON"):
        run(backend(server), [Draw("x", SAMPLING, 0)])


def test_constraints_are_checked_and_retried_since_the_api_cannot_take_them(server: FakeBatches) -> None:
    answers = iter(["perhaps", "yes"])
    server.reply = lambda prompt, sample, body: next(answers)
    claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY)
    assert claude("Is it?", choices=["yes", "no"]).eval(cache=False) == "yes"
    assert len(server.requests) == 2
    assert not any(k in server.requests[0].body for k in ("response_format", "guided_choice", "output_format"))


def test_stop_sequences_end_the_text(server: FakeBatches) -> None:
    server.reply = lambda prompt, sample, body: "one END two"
    claude = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY, stop=["END"])
    assert claude("x").eval(cache=False) == "one "


def test_environment_configuration(monkeypatch: pytest.MonkeyPatch, server: FakeBatches) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.anthropic_url)
    assert models.anthropic("claude-fake")("env").eval(cache=False) == "env#0"
    assert server.requests[0].headers["x-api-key"] == "sk-ant-from-env"


def test_identity_equality_and_defaults() -> None:
    one = AnthropicBackend("claude-fake", api_key="k1", system_prompt="s")
    assert one.identity == ("anthropic", "claude-fake", "https://api.anthropic.com", "s")
    assert one == AnthropicBackend("claude-fake", api_key="k1", system_prompt="s")
    assert one != AnthropicBackend("claude-fake", api_key="k2", system_prompt="s")  # never one batch
    assert one.max_batch == 16 and one.max_concurrency == 32 and one.max_retries == 3
    assert one.requests_for([Draw("a", SAMPLING, 0), Draw("a", SAMPLING, 1), Draw("a", SAMPLING, 1)]) == 2


@pytest.mark.parametrize(("options", "message"), [
    ({"base_url": "ftp://h"}, "http"),
    ({"max_batch": 0}, "max_batch"),
    ({"system_prompt": 3}, "system_prompt"),
])
def test_bad_options_fail_at_construction(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AnthropicBackend("claude-fake", api_key="k", **options)


def test_the_key_never_shows(server: FakeBatches, sleeps: list[float], caplog: pytest.LogCaptureFixture,
                             tmp_path: Any) -> None:
    claude = backend(server)
    llm = models.anthropic("claude-fake", base_url=server.anthropic_url, api_key=KEY)
    shown = [repr(claude), repr(vars(claude)), repr(vars(claude.client)), str(claude.identity), repr(llm)]
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="aiohttp"):
        server.script(Status(503), Status(401, body={"type": "error", "error": {"message": f"bad key {KEY}"}}))
        with pytest.raises(BackendError) as caught:
            run(claude, [Draw("a", SAMPLING, 0)])
    shown += [str(caught.value), repr(caught.value), caught.value.body or "", caplog.text]
    cache = Cache(tmp_path)
    with outlines.trace() as trace:
        llm("traced").eval(cache=cache)
    assert cache.stats()["entries"] == 1  # committed: the file holds the draw, and no key
    shown += [trace.summary(), *(p.read_bytes().decode("latin-1") for p in tmp_path.iterdir())]
    assert "retrying" in caplog.text
    assert all(KEY not in text for text in shown)


# -- the prompt cache ----------------------------------------------------------------------------

#: 1,100 words: the fake's tokens, above the 1,024 most models cache.
HEAD = " ".join(f"w{i % 89}" for i in range(1100)) + " "


def test_siblings_carry_a_breakpoint_at_their_head_and_read_what_the_leader_wrote(server: FakeBatches) -> None:
    server.latency = 0.2
    report = BatchReport()
    draws = [Draw(HEAD + f"question {i}", SAMPLING, 0) for i in range(5)]
    assert run(backend(server, system_prompt="Be brief."), draws, report) == [d.prompt + "#0" for d in draws]
    first, *rest = sorted(server.requests, key=lambda r: r.time)
    assert all(r.time - first.time >= 0.18 for r in rest)  # the leader's answer came first
    for request in server.requests:
        assert request.body["system"] == "Be brief."
        marked, tail = request.body["messages"][0]["content"]
        assert marked == {"type": "text", "text": HEAD + "question ", "cache_control": {"type": "ephemeral"}}
        assert tail["text"] in [str(i) for i in range(5)] and "cache_control" not in tail
    head_tokens = 2 + 1101  # "Be brief." and the head's words, "question" included
    assert report.cache_write_tokens == head_tokens and report.cached_tokens == 4 * head_tokens
    assert report.tokens[0] == 5 * (head_tokens + 1)


def test_the_samples_of_one_long_prompt_share_it_whole(server: FakeBatches) -> None:
    report = BatchReport()
    run(backend(server), [Draw(HEAD + "tell me", SAMPLING, d) for d in range(3)], report)
    assert all(r.body["messages"][0]["content"] == [{"type": "text", "text": HEAD + "tell me",
                                                     "cache_control": {"type": "ephemeral"}}] for r in server.requests)
    assert report.cache_write_tokens == 1102 and report.cached_tokens == 2 * 1102


def test_heads_below_the_model_s_minimum_are_sent_plain(server: FakeBatches) -> None:
    report = BatchReport()
    # 1,100 words estimate to about 1,300 tokens: enough for most models, not for Haiku 4.5's 4,096.
    run(AnthropicBackend("claude-haiku-4-5", base_url=server.anthropic_url, api_key=KEY),
        [Draw(HEAD + f"q{i}", SAMPLING, 0) for i in range(3)], report)
    run(backend(server, prefix_warmup=False), [Draw(HEAD + f"q{i}", SAMPLING, 0) for i in range(3)], report)
    assert all(isinstance(r.body["messages"][0]["content"], str) for r in server.requests)
    assert report.cached_tokens == report.cache_write_tokens == 0


def test_breakpoints_split_the_text_where_the_head_ends() -> None:
    from outlines.backends.anthropic import _joined, cache_min_tokens, with_breakpoints

    body = {"model": "m", "max_tokens": 5, "system": "System text.",
            "messages": [{"role": "user", "content": "Doc. Question?"}, {"role": "assistant", "content": "A:"}]}
    text = _joined(body)
    in_system, in_user = text.index("text.") + 5, text.index("Doc.") + 4
    marked = with_breakpoints(body, [in_system, in_user])
    assert marked["system"] == [{"type": "text", "text": "System text.", "cache_control": {"type": "ephemeral"}}]
    assert marked["messages"][0]["content"] == [
        {"type": "text", "text": "Doc.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": " Question?"}]
    assert marked["messages"][1] == body["messages"][1] and body["messages"][0]["content"] == "Doc. Question?"
    # A head ending inside the next message's role marker ends with the text before it.
    marker = text.index("\x1eassistant") + 3
    assert with_breakpoints(body, [marker])["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    # A cut leaving only whitespace after it moves to the end (the API refuses blank blocks).
    spaced = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Doc.  \n"}]}
    cut = _joined(spaced).index("Doc.") + 4
    assert with_breakpoints(spaced, [cut])["messages"][0]["content"] == [
        {"type": "text", "text": "Doc.  \n", "cache_control": {"type": "ephemeral"}}]
    assert with_breakpoints(body, []) is body
    assert cache_min_tokens("claude-haiku-4-5-20251001") == 4096 and cache_min_tokens("claude-opus-4-1") == 1024
    assert cache_min_tokens("claude-3-5-haiku-latest") == 2048


def test_the_fake_refuses_what_the_api_refuses(server: FakeBatches) -> None:
    block = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    refused = server.refusal("/v1/messages", {"model": "m", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": [block] * 5}]})
    assert refused is not None and "A maximum of 4 blocks with cache_control" in refused.message
    refused = server.refusal("/v1/messages", {"model": "m", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": [{"type": "text", "text": " "}]}]})
    assert refused is not None and "non-whitespace" in refused.message
