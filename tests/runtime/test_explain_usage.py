"""Token and cost plans (issue 17): ``explain`` counts what a run will be billed.

The fake OpenAI server reports ``usage`` counted with the tokenizer the model
is given (one token per word; every message's content for chat), so the
prompt tokens ``explain`` predicts, after cache hits and deduplication, must
equal what the server reports for the run. Completion tokens are bounded by
``max_tokens`` per sample.
"""
from __future__ import annotations

import math
from typing import Any

import pytest

import outlines
from outlines import models
from outlines.backends.usage import Price, estimate_tokens, tiktoken_counter
from outlines.cache import Cache
from tests.fixtures.fake_openai import FakeOpenAI


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture
def server() -> Any:
    with FakeOpenAI(tokenizer=words, reply=lambda prompt, sample, body: f"answer-{sample}") as fake:
        yield fake


@outlines.prompt
def ask(question):
    """Question: {{ question }}
    Answer briefly."""


@outlines.prompt
def judge(question, answers):
    """Which answer to {{ question }} is best?
    {% for a in answers %}- {{ a }}
    {% endfor %}"""


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_predicted_prompt_tokens_equal_the_usage_the_server_reports(
    server: FakeOpenAI, tmp_path: Any, constructor: Any
) -> None:
    llm = constructor("fake", base_url=server.base_url, api_key="sk-x", tokenizer=words, max_tokens=7,
                      max_batch=4, price=(2.0, 8.0))
    q = outlines.string("q")
    answers = llm(ask(q), num_samples=3)
    questions = ["what is two plus two", "name a colour", "what is two plus two", "why is the sky blue"]
    cache = Cache(tmp_path)
    plan = outlines.explain(answers, givens={q: questions}, cache=cache)
    usage = plan.usage[repr(llm.backend)]
    assert usage.exact and plan.exact
    with outlines.trace() as trace:
        answers.eval({q: questions}, cache=cache)
    reported = trace.tokens
    assert plan.prompt_tokens == reported[0] > 0
    assert usage.requests == len(server.requests) and usage.batches == len(trace.batches)
    # One meaning per word in the summary: batches are backend calls, requests go on the wire.
    assert plan.requests == len(server.requests) and plan.batches_per_backend == {repr(llm.backend): usage.batches}
    assert f"batches: {usage.batches} (" in plan.summary() and f"; requests: {plan.requests}" in plan.summary()
    assert f"{usage.requests} request(s) in {usage.batches} batch(es)" in plan.summary()
    # 3 unique questions x 3 samples, at most 7 tokens each.
    assert plan.completion_tokens == 3 * 3 * 7 >= reported[1]
    # Money is summed exactly and rounded once: the batches cost, to the micro-unit, what the run costs whole.
    assert plan.cost == Price(2.0, 8.0).cost(plan.prompt_tokens, 63)
    assert trace.cost() == Price(2.0, 8.0).cost(*reported) and len(trace.batches) > 1
    assert "cost" in trace.summary() and "tokens:" in plan.summary()


def test_cache_hits_and_duplicates_cost_no_tokens(server: FakeOpenAI, tmp_path: Any) -> None:
    llm = models.openai("fake", base_url=server.base_url, api_key="sk-x", tokenizer=words, max_tokens=5)
    q = outlines.string("q")
    cache = Cache(tmp_path)
    llm(q).eval({q: ["one two"]}, cache=cache)
    server.reset()
    plan = outlines.explain(llm(q), givens={q: ["one two", "three four five", "three four five"]}, cache=cache)
    assert plan.prompt_tokens == 3 and plan.completion_tokens == 5
    with outlines.trace() as trace:
        llm(q).eval({q: ["one two", "three four five", "three four five"]}, cache=cache)
    assert trace.tokens[0] == 3 and len(server.requests) == 1


def test_prices_from_a_user_table_and_prompts_computed_from_model_outputs(server: FakeOpenAI) -> None:
    llm = models.openai("fake", base_url=server.base_url, api_key="sk-x", tokenizer=words, max_tokens=4)
    q = outlines.string("q")
    chain = llm(judge(q, llm(ask(q), num_samples=2)))
    plan = outlines.explain(chain, givens={q: "hi there"}, cache=False, prices={"fake": (1.0, 1.0)})
    usage = plan.usage[repr(llm.backend)]
    assert usage.exact and usage.unknown_prompts == 1  # the judge's prompt is computed from model outputs
    assert usage.prompt_tokens == words(ask("hi there").eval(cache=False))
    assert usage.completion_tokens == 2 * 4 + 4
    assert usage.cost == (usage.prompt_tokens + usage.completion_tokens) / 1e6
    no_price = outlines.explain(chain, givens={q: "hi"}, cache=False)
    assert no_price.cost is None
    unbounded = outlines.explain(models.openai("fake", base_url=server.base_url, api_key="k")(q), givens={q: "x"})
    assert unbounded.completion_tokens is None and "unbounded" in unbounded.summary()


def test_without_a_tokenizer_chat_prompts_are_estimated_with_the_chat_format() -> None:
    llm = models.openai("some-unknown-model", base_url="http://127.0.0.1:9/v1", api_key="k", max_tokens=1)
    backend = llm.backend
    assert tiktoken_counter("some-unknown-model") is None and not backend.tokens_exact
    # One user message: its content's estimate, 3 tokens for the message, 3 for the reply.
    assert backend.count_tokens("abcdefgh") == estimate_tokens("abcdefgh") + 3 + 3 == 8
    completion = models.openai_completion("some-unknown-model", base_url="http://127.0.0.1:9/v1", api_key="k")
    assert completion.backend.count_tokens("abcdefgh") == 2
    with pytest.raises(TypeError, match="tokenizer must be a callable"):
        models.openai("m", api_key="k", tokenizer="cl100k_base")
    with pytest.raises(ValueError, match="price input must be a number"):
        models.openai("m", api_key="k", price=(-1, 2))


def test_a_local_model_counts_prompt_tokens_exactly_with_its_own_tokenizer(tiny_model_path: str, tmp_path: Any) -> None:
    pytest.importorskip("transformers")
    llm = models.transformers(tiny_model_path, max_tokens=3, temperature=0, max_batch=2)
    q = outlines.string("q")
    questions = ["a short one", "a somewhat longer question here", "x"]
    cache = Cache(tmp_path)
    plan = outlines.explain(llm(ask(q)), givens={q: questions}, cache=cache)
    assert plan.usage[repr(llm.backend)].exact and plan.usage[repr(llm.backend)].batches == 2
    with outlines.trace() as trace:
        llm(ask(q)).eval({q: questions}, cache=cache)
    assert plan.prompt_tokens == trace.tokens[0] > 0
    assert plan.completion_tokens == 3 * 3 >= trace.tokens[1]


def test_explain_gives_a_loop_the_range_of_its_draws_requests_and_cost_per_backend(server: FakeOpenAI) -> None:
    llm = models.openai("fake", base_url=server.base_url, api_key="sk-x", tokenizer=words, max_tokens=4,
                        price=(1.0, 1.0))
    q = outlines.string("q")
    more = outlines.fn(lambda t: t.count("|") < 2, name="more")
    loop = outlines.while_loop(more, lambda t: t + llm(q + t) + "|", init="", max_iter=5)
    questions = ["a", "b", "c"]
    plan = outlines.explain(loop, givens={q: questions}, cache=False)
    name = repr(llm.backend)
    (estimate,) = plan.loops
    assert (estimate.max_iter, estimate.elements) == (5, 3)
    assert estimate.iteration[name].draws == 3 and estimate.iteration[name].requests == 3  # a request per prompt
    assert estimate.draws(name) == (3, 15) and estimate.requests(name) == (3, 15)
    low, high = estimate.cost(name)
    assert low == pytest.approx(3 * 4 / 1e6) and high == pytest.approx(5 * low)  # completions bounded by max_tokens
    assert plan.draws_range == (3, 15) and plan.requests_range == (3, 15)
    text = plan.summary()
    assert "requests: 0" not in text and "draws: 0" not in text
    assert "requests: 3 to 15" in text and "draws: 3 to 15" in text
    assert "openai: fake: 3 to 15 draw(s), 3 to 15 request(s), cost <= " in text and plan.names[name] == "openai: fake"
    assert plan.to_dict()["loops"][0]["max_iter"] == 5
    loop.eval({q: questions}, cache=False)
    assert low <= len(server.requests) * 4 / 1e6 and 3 <= len(server.requests) <= 15  # 2 iterations: 6


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_explain_predicts_requests_from_the_quirks_known_of_the_server(constructor: Any) -> None:
    from outlines.backends import quirks

    quirks.forget()
    with FakeOpenAI(ignore_n=True, refuse_lists=True) as server:  # as transformers serve
        llm = constructor("fake-model", base_url=server.base_url, api_key="sk-local", temperature=1.0)
        q = outlines.string("q")
        answers = llm(q, num_samples=3)
        givens = {q: [f"q{i}" for i in range(5)]}
        unknown = outlines.explain(answers, givens=givens, cache=False)
        assert "quirks" not in unknown.summary()
        answers.eval(givens, cache=False)  # learns that the server ignores n (and refuses lists)
        plan = outlines.explain(answers, givens=givens, cache=False)
        server.reset()
        answers.eval(givens, cache=False)
        assert plan.requests == server.count == 15 != unknown.requests  # one request per prompt and sample
        assert plan.usage[repr(llm.backend)].quirks == sorted(quirks.known(server.base_url))
        assert "server quirks known: ignores_n" in plan.summary()
    quirks.forget()


def test_cached_tokens_are_estimated_before_the_run_and_said_to_be_an_estimate() -> None:
    from tests.fixtures.fake_openai import pieces

    head = "".join(f"w{i % 10}x " for i in range(1500))  # 1,500 tokens of 4 characters, for both sides
    price = Price(2.0, 8.0, cached_input=0.5)
    with FakeOpenAI(tokenizer=pieces, latency=0.05) as fake:
        llm = models.openai("fake", base_url=fake.base_url, api_key="sk-x", tokenizer=pieces, max_tokens=2,
                            max_batch=4, price=price)
        q = outlines.string("q")
        questions = [f"question {i:02d}?" for i in range(10)]
        plan = outlines.explain(llm(head + q), givens={q: questions}, cache=False)
        usage = plan.usage[repr(llm.backend)]
        # 9 of the 10 prompts read the head the first one carries, across the 3 batches.
        assert usage.cached_tokens == plan.cached_tokens == 9 * len(pieces(head + "question "))
        assert plan.exact and "of them cached (an estimate: the cost would be about" in plan.summary()
        # The cost stays an upper bound, as a Budget prices each batch: the cache's discount is not promised.
        assert usage.prompt_cost == price.cost(usage.prompt_tokens, 0)
        assert usage.cache_saving == math.ceil(usage.cached_tokens * (2.0 - 0.5)) / 1e6  # in micro-units, rounded up
        with outlines.trace() as trace:
            llm(head + q).eval({q: questions}, cache=False, budget=outlines.Budget(cost=plan.cost))
        # The server caches whole 128-token steps of the head: the estimate is at most one step per prompt more.
        assert 0 < fake.cached_tokens <= plan.cached_tokens < fake.cached_tokens + 9 * 128
        assert trace.cached_tokens[0] == fake.cached_tokens
    unrelated = outlines.explain(llm(q), givens={q: [head[i:] + "?" for i in range(0, 40, 4)]}, cache=False)
    assert unrelated.cached_tokens == 0 and "cached" not in unrelated.summary()
