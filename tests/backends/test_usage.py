"""Token usage read off the wire, and prices with prompt-cache reads, writes and the batch discount."""
from __future__ import annotations

import pytest

from outlines.backends.base import BatchReport
from outlines.backends.usage import Price, WireUsage, wire_usage


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
    price = Price.of({"input": 2.0, "output": 8.0, "cached_input": 0.5, "cache_write": 2.5, "batch_discount": 0.5})
    assert price.cost(1_000_000, 0) == 2.0
    assert price.cost(1_000_000, 0, cached_tokens=800_000) == pytest.approx(0.2 * 2.0 + 0.8 * 0.5)
    assert price.cost(1_000_000, 0, cache_write_tokens=1_000_000) == pytest.approx(2.5)
    assert price.cost(1_000_000, 1_000_000, batch=True) == pytest.approx(5.0)
    assert Price(2.0, 8.0).cost(1_000_000, 0, cached_tokens=1_000_000) == 2.0  # no cached price: billed as input
    assert Price.of((0.15, 0.6)) == Price(0.15, 0.6)


@pytest.mark.parametrize(("value", "error", "message"), [
    ({"input": 1, "output": 1, "cached": 0.1}, TypeError, "unknown price field 'cached'"),
    ({"input": 1, "output": 1, "batch_discount": 1.0}, ValueError, "fraction taken off"),
    ({"input": 1, "output": 1, "cached_input": -1}, ValueError, "cached_input must be a number >= 0"),
    ((1, 2, 3), TypeError, "a price is"),
])
def test_bad_prices_say_what_is_wrong(value: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Price.of(value)
