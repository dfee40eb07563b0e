"""Budgets (issue 17): no batch is sent that could pass ``outlines.Budget``.

Against the fake OpenAI server on 127.0.0.1, whose replies carry ``usage``
counted with the same tokenizer the model is given (one token per word), so
every figure below is exact: prompt tokens plus ``max_tokens`` per sample is
what a batch may need; what it spent is what the server reported.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.common.errors import BudgetExceeded
from outlines.runtime.budget import Budget, BudgetGuard
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.recording import RecordingBackend


def words(text: str) -> int:
    return len(text.split())


#: 16 prompts of 3 words: a batch of 4 needs 4 * 3 prompt tokens + 4 * 5 completion tokens = 32.
PROMPTS = [f"prompt number {i}" for i in range(16)]
PER_BATCH = 4 * 3 + 4 * 5


@pytest.fixture
def server() -> Any:
    # Replies of 2 words: a batch of 4 spends 12 + 8 = 20 tokens, less than its bound of 32.
    with FakeOpenAI(tokenizer=words, reply=lambda prompt, sample, body: "short answer") as fake:
        yield fake


def completion(server: FakeOpenAI, **options: Any) -> models.Model:
    return models.openai_completion(
        "fake", base_url=server.base_url, api_key="sk-budget", max_batch=4, max_tokens=5, tokenizer=words,
        max_retries=0, **options,
    )


def test_budget_stops_sending_within_one_draw_of_the_limit(server: FakeOpenAI, tmp_path: Any) -> None:
    q = outlines.string("q")
    llm = completion(server)
    # Room for two batches sent together (2 * 32 = 64) and 3 draws of a third (3 * 8 = 24 of the 31 left).
    budget = Budget(tokens=2 * PER_BATCH + PER_BATCH - 1)
    with outlines.trace() as trace:
        values = llm(q).eval({"q": PROMPTS}, cache=Cache(tmp_path), errors="return", budget=budget)
    assert [len(r.body["prompt"]) for r in server.requests] == [4, 4, 3]
    failures = [v for v in values if isinstance(v, outlines.Failure)]
    assert len(failures) == 5 and all(f.error_type == "BudgetExceeded" for f in failures)
    assert failures[0].message.startswith("budget exhausted")
    assert sum(trace.tokens) == 2 * 20 + 3 * 5  # actual usage of what was sent
    assert budget.tokens - 2 * PER_BATCH - 3 * PER_BATCH // 4 < PER_BATCH // 4  # less than a draw left unspent


def test_a_budget_with_room_for_3_of_8_draws_of_one_batch_sends_those_and_a_rerun_pays_for_the_rest(
    tmp_path: Any,
) -> None:
    with FakeOpenAI(tokenizer=words, reply=lambda prompt, sample, body: "short answer") as server:
        llm = models.openai_completion("fake", base_url=server.base_url, api_key="sk-budget", max_batch=8,
                                       max_tokens=5, tokenizer=words, max_retries=0)
        q = outlines.string("q")
        cache = Cache(tmp_path)
        # One batch of 8 draws needs 8 * (3 + 5) = 64 tokens; the budget holds 3 draws and most of a fourth.
        values = llm(q).eval({"q": PROMPTS[:8]}, cache=cache, errors="return", budget=Budget(tokens=3 * 8 + 7))
        assert [r.body["prompt"] for r in server.requests] == [PROMPTS[:3]]
        assert list(values[:3]) == ["short answer"] * 3
        refused = list(values[3:])
        assert all(isinstance(f, outlines.Failure) and f.error_type == "BudgetExceeded" for f in refused)
        assert "the next batch (5 draw(s)" in refused[0].message
        first_tokens = server.prompt_tokens
        assert first_tokens == 3 * 3
        server.reset()
        with outlines.trace() as trace:
            again = llm(q).eval({"q": PROMPTS[:8]}, cache=cache)  # no budget: only the refused 5 go out
        assert list(again) == ["short answer"] * 8
        assert [r.body["prompt"] for r in server.requests] == [PROMPTS[3:8]]
        assert server.prompt_tokens == 5 * 3 and trace.tokens == (5 * 3, 5 * 2)
        # With errors="raise" the admitted part is sent and cached before the refusal is raised.
        server.reset()
        with pytest.raises(BudgetExceeded):
            llm(q).eval({"q": PROMPTS[8:16]}, cache=cache, budget=Budget(tokens=3 * 8 + 7))
        assert [r.body["prompt"] for r in server.requests] == [PROMPTS[8:11]]
        server.reset()
        llm(q).eval({"q": PROMPTS[8:16]}, cache=cache)
        assert [r.body["prompt"] for r in server.requests] == [PROMPTS[11:16]]


def test_usage_reported_by_finished_batches_frees_room_for_later_ones(server: FakeOpenAI, tmp_path: Any) -> None:
    q = outlines.string("q")
    llm = completion(server)
    # Two levels of one batch each: the second prompt is "short answer" (2 words).
    chain = llm(llm(q))
    first_bound, first_spent = 3 + 5, 3 + 2
    second_bound = 2 + 5
    # The second batch fits only once the first is charged what it really spent.
    budget = Budget(tokens=first_spent + second_bound)
    assert first_bound + second_bound > budget.tokens
    value = chain.eval({"q": "prompt number one"}, cache=Cache(tmp_path), budget=budget)
    assert value == "short answer" and len(server.requests) == 2


def test_a_rerun_with_a_larger_budget_sends_only_the_rest(server: FakeOpenAI, tmp_path: Any) -> None:
    q = outlines.string("q")
    llm = completion(server)
    cache = Cache(tmp_path)
    first = llm(q).eval({"q": PROMPTS}, cache=cache, errors="return", budget=Budget(tokens=2 * PER_BATCH))
    sent = [p for r in server.requests for p in r.body["prompt"]]
    assert len(sent) == 8 and sum(isinstance(v, outlines.Failure) for v in first) == 8
    server.reset()
    second = llm(q).eval({"q": PROMPTS}, cache=cache, budget=Budget(tokens=2 * PER_BATCH))
    rest = [p for r in server.requests for p in r.body["prompt"]]
    assert sorted(rest) == sorted(set(PROMPTS) - set(sent))
    assert list(second) == ["short answer"] * 16


def test_errors_raise_names_the_budget_after_the_running_batches_are_cached(server: FakeOpenAI, tmp_path: Any) -> None:
    q = outlines.string("q")
    llm = completion(server)
    cache = Cache(tmp_path)
    budget = Budget(tokens=PER_BATCH)
    with pytest.raises(BudgetExceeded) as caught:
        llm(q).eval({"q": PROMPTS}, cache=cache, budget=budget)
    error = caught.value
    assert isinstance(error, outlines.NodeError)
    assert error.needed_tokens == PER_BATCH and error.spent_tokens == PER_BATCH
    assert "Budget(tokens=32)" in str(error) and "would need up to 32 tokens" in str(error)
    assert len(server.requests) == 1
    server.reset()
    values = llm(q).eval({"q": PROMPTS[:4]}, cache=cache, budget=Budget(tokens=0))  # all cached: free
    assert list(values) == ["short answer"] * 4 and server.requests == []


def test_a_cost_budget_prices_prompt_and_completion_tokens(server: FakeOpenAI, tmp_path: Any) -> None:
    q = outlines.string("q")
    llm = completion(server, price=(1.0, 2.0))  # per million tokens
    per_batch = (12 * 1.0 + 20 * 2.0) / 1e6
    values = llm(q).eval({"q": PROMPTS}, cache=Cache(tmp_path), errors="return",
                         budget=Budget(cost=3 * per_batch))
    assert len(server.requests) == 3
    assert sum(isinstance(v, outlines.Failure) for v in values) == 4


def test_a_cost_budget_needs_a_price_and_a_token_budget_needs_max_tokens(tmp_path: Any) -> None:
    backend = RecordingBackend()
    q = outlines.string("q")
    llm = models.Model(backend)
    with pytest.raises(outlines.NodeError, match="needs max_tokens"):
        llm(q).eval({"q": "a"}, cache=False, budget=Budget(tokens=100))
    with pytest.raises(outlines.NodeError, match="needs a price"):
        llm(q, max_tokens=4).eval({"q": "a"}, cache=False, budget=Budget(cost=1.0))
    value = llm(q, max_tokens=4).eval({"q": "a"}, cache=False, budget=Budget(cost=1.0, prices={backend.model_name: (1, 1)}))
    assert isinstance(value, str)
    assert len(backend.batches) == 1


def test_budget_validates_its_arguments() -> None:
    with pytest.raises(ValueError, match="tokens=, cost= or both"):
        Budget()
    with pytest.raises(ValueError, match="integer >= 0"):
        Budget(tokens=-1)
    with pytest.raises(TypeError, match="outlines.Budget"):
        outlines.eval(outlines.constant("x"), budget=100)


def test_guard_settles_a_batch_at_its_reported_usage() -> None:
    backend = RecordingBackend()
    guard = BudgetGuard(Budget(tokens=100))
    from outlines.draws import Draw, GenerationParams

    draws = [Draw("a b c d", GenerationParams(max_tokens=10), 0)]
    ticket = guard.admit(backend, draws, "node")
    assert guard.reserved[ticket] == (2 + 10, 0.0)  # "a b c d": 7 characters, 2 tokens by the estimate
    guard.settle(ticket, backend, (3, 4), failed=False)
    assert guard.tokens == 7 and guard.reserved == {}
    np.testing.assert_equal(guard.exhausted, None)


def test_a_program_carries_its_budget(server: FakeOpenAI, tmp_path: Any) -> None:
    llm = completion(server)
    program = outlines.compile(lambda q: llm(q), cache=Cache(tmp_path), errors="return",
                               budget=Budget(tokens=PER_BATCH))
    values = program(PROMPTS[:8])
    assert len(server.requests) == 1 and sum(isinstance(v, outlines.Failure) for v in values) == 4
    assert list(program.with_options(budget=Budget(tokens=PER_BATCH))(PROMPTS[:8])) == ["short answer"] * 8
    assert len(server.requests) == 2


#: Prices per 1M tokens as users write them: round decimals, and ones no binary float holds exactly.
PRICES = st.one_of(st.sampled_from([0.1, 0.15, 0.3, 0.6, 0.075, 2.5, 15.0, 1 / 3, 0.0]),
                   st.integers(0, 100_000).map(lambda n: n / 1000))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prices=st.lists(st.tuples(PRICES, PRICES), min_size=1, max_size=2),
    prompts=st.lists(st.text(alphabet="ab ", max_size=30), min_size=1, max_size=12),
    max_batch=st.integers(1, 5),
    max_tokens=st.integers(1, 300),
    samples=st.integers(1, 3),
)
def test_a_budget_equal_to_explains_cost_admits_the_run_and_one_micro_unit_less_refuses_it(
    prices: list[tuple[float, float]], prompts: list[str], max_batch: int, max_tokens: int, samples: int,
) -> None:
    # Backends that report no usage: each batch is charged its whole reservation, as explain bounds it.
    backends = [RecordingBackend(name=f"model-{i}", max_batch=max_batch) for i in range(len(prices))]
    table = {backend.model_name: price for backend, price in zip(backends, prices)}
    q = outlines.string("q")
    outs = [models.Model(backend)(q, max_tokens=max_tokens, num_samples=samples) for backend in backends]
    givens = {"q": prompts}
    cost = outlines.explain(*outs, givens=givens, prices=table).cost
    assert cost is not None

    def refused(budget: float) -> int:
        values = outlines.eval(*outs, givens=givens, cache=False, errors="return", budget=Budget(cost=budget, prices=table))
        return sum(isinstance(v, outlines.Failure) for value in values for v in np.ravel(value))

    assert refused(cost) == 0
    micros = round(cost * 1_000_000)  # explain reports whole micro-units
    assert cost == micros / 1_000_000
    if micros:
        assert refused((micros - 1) / 1_000_000) > 0
