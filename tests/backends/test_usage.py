"""Token usage read off the wire, and prices with prompt-cache reads, writes and the batch discount."""
from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outlines.backends.base import BatchReport
from outlines.backends.usage import MICROS, Price, WireUsage, exact_money, reported, wire_usage


def test_wire_usage_reads_both_providers_cache_counts() -> None:
    openai = {"prompt_tokens": 2010, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 1920}}
    assert wire_usage(openai) == WireUsage(2010, 7, 1920, 0)
    assert wire_usage({"prompt_tokens": 5, "completion_tokens": 1}) == WireUsage(5, 1, 0, 0)
    assert wire_usage({"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": None}) == (5, 1, 0, 0)
    anthropic = {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 1900,
                 "cache_creation_input_tokens": 100}
    assert wire_usage(anthropic) == WireUsage(2010, 3, 1900, 100)  # prompt = input + read + written
    assert wire_usage({"prompt_tokens": 5, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": -1}}) is None
    assert wire_usage({"prompt_tokens": "5", "completion_tokens": 1}) is None and wire_usage([]) is None


def test_a_report_adds_up_cache_counts_and_forwards_them_whole() -> None:
    inner = BatchReport()
    inner.usage(*WireUsage(2010, 7, 1920))
    inner.usage(100, 1)
    outer = BatchReport()
    outer.usage(*inner.tokens)  # how fallback chains, constraint retries and Dask workers forward usage
    assert outer.tokens == [2110, 8, 1920, 0] and outer.cached_tokens == 1920 and outer.cache_write_tokens == 0


def test_prices_bill_cached_reads_writes_and_batch_jobs_apart() -> None:
    price = Price.of({"input": 2.0, "output": 8.0, "cached_input": 0.5, "cache_write": 2.5, "job_discount": 0.5})
    assert price.cost(1_000_000, 0) == 2.0
    assert price.cost(1_000_000, 0, cached_tokens=800_000) == pytest.approx(0.2 * 2.0 + 0.8 * 0.5)
    assert price.cost(1_000_000, 0, cache_write_tokens=1_000_000) == pytest.approx(2.5)
    assert price.cost(1_000_000, 1_000_000, jobs=True) == pytest.approx(5.0)
    assert Price(2.0, 8.0).cost(1_000_000, 0, cached_tokens=1_000_000) == 2.0  # no cached price: billed as input
    assert Price.of((0.15, 0.6)) == Price(0.15, 0.6)


def test_batch_discount_is_a_deprecated_name_of_job_discount() -> None:
    with pytest.warns(DeprecationWarning, match="use job_discount"):
        assert Price.of({"input": 1.0, "output": 2.0, "batch_discount": 0.5}) == Price(1.0, 2.0, job_discount=0.5)
    with pytest.warns(DeprecationWarning, match="use job_discount="):
        price = Price(1.0, 2.0, batch_discount=0.5)
    with pytest.warns(DeprecationWarning, match="use job_discount"):
        assert price.batch_discount == 0.5 == price.job_discount
    for method in (price.money, price.cost):
        with pytest.warns(DeprecationWarning, match="use jobs="):
            assert method(1_000_000, 0, batch=True) == method(1_000_000, 0, jobs=True) != method(1_000_000, 0)


@pytest.mark.parametrize(("value", "error", "message"), [
    ({"input": 1, "output": 1, "cached": 0.1}, TypeError, "unknown price field 'cached'"),
    ({"input": 1, "output": 1, "job_discount": 1.0}, ValueError, "fraction taken off"),
    ({"input": 1, "output": 1, "cached_input": -1}, ValueError, "cached_input must be a number >= 0"),
    ((1, 2, 3), TypeError, "a price is"),
])
def test_bad_prices_say_what_is_wrong(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Price.of(value)


PRICE = st.one_of(st.sampled_from([0.1, 0.15, 0.075, 1 / 3, 2.5, 0.0]), st.integers(0, 100_000).map(lambda n: n / 1000))


@settings(max_examples=300, deadline=None)
@given(
    price=st.builds(Price, PRICE, PRICE, cached_input=st.none() | PRICE, cache_write=st.none() | PRICE,
                    job_discount=st.sampled_from([0.0, 0.5, 0.25])),
    parts=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5), st.integers(0, 10**6)), min_size=1,
                   max_size=20),
    jobs=st.booleans(),
)
def test_money_of_a_run_split_in_any_way_adds_up_exactly_and_is_reported_rounded_up_to_a_micro_unit(
    price: Price, parts: list[tuple[int, int, int]], jobs: bool,
) -> None:
    # (prompt, completion, cached) tokens per batch; the cached ones are part of the prompt's.
    batches = [(prompt + cached, completion, cached) for prompt, completion, cached in parts]
    whole = price.money(sum(b[0] for b in batches), sum(b[1] for b in batches),
                        cached_tokens=sum(b[2] for b in batches), jobs=jobs)
    assert sum(price.money(p, c, cached_tokens=k, jobs=jobs) for p, c, k in batches) == whole
    shown = price.cost(sum(b[0] for b in batches), sum(b[1] for b in batches),
                       cached_tokens=sum(b[2] for b in batches), jobs=jobs)
    assert shown == reported(whole) and whole <= exact_money(shown) < whole + Fraction(1, MICROS)
    assert exact_money(shown) * MICROS == round(shown * MICROS)  # whole micro-units, read back exactly


def test_prices_and_budgets_are_read_as_the_decimals_they_are_written_as() -> None:
    assert exact_money(0.1) == Fraction(1, 10) and exact_money(3) == 3 and exact_money(1e-7) == Fraction(1, 10**7)
    assert Price(0.1, 0.2).money(1, 1) == Fraction(3, 10**7)
    assert Price(0.1, 0.2).cost(1, 1) == 1e-6  # 0.3 micro-units, reported as one
    assert reported(Fraction(0)) == 0.0
