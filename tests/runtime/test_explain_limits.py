"""``explain`` on a huge model call stays quick: draws beyond a cap are counted by shape."""
from __future__ import annotations

from typing import Any

import pytest

import outlines
from outlines import models
from outlines.runtime import explain as explain_module


def test_ten_million_samples_are_counted_without_listing_each_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    def listing(self: Any, *args: Any) -> Any:
        raise AssertionError("explain listed every draw of a 10^7-draw call")

    monkeypatch.setattr(models.Generate, "draws", listing)
    monkeypatch.setattr(models.Generate, "columns", listing)
    llm = models.from_function(lambda p: p, temperature=0.7, max_batch=4_000_000)
    plan = outlines.explain(llm("hi", num_samples=10**7), cache=False)
    assert plan.draws == 10**7 and len(plan.batches) == 3
    assert plan.requests == 10**7  # a function called once per draw: one request each
    assert plan.unknown_draws == 10**7  # the cache status of these is not checked


def test_calls_under_the_cap_are_still_checked_draw_by_draw(tmp_path: Any) -> None:
    llm = models.from_function(lambda p: p + "!", temperature=0.7)
    call = llm("hi", num_samples=explain_module.MAX_CHECKED_DRAWS // 1000)
    store = outlines.cache.Cache(tmp_path)
    call.eval(cache=store)
    plan = outlines.explain(call, cache=store)
    assert plan.cache_hits == plan.draws == 100 and plan.batches == [] and plan.requests == 0
