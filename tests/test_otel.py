"""OpenTelemetry export of a trace (issue 17), against the SDK's in-memory exporter."""
from __future__ import annotations

from typing import Any

import pytest

import outlines
from outlines import models
from tests.fixtures.fake_openai import FakeOpenAI, Status

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import StatusCode  # noqa: E402

import outlines.otel  # noqa: E402


@pytest.fixture
def exporter() -> Any:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider, memory


def test_evals_batches_and_requests_become_nested_spans(
    exporter: Any, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    from outlines.backends import http

    async def no_wait(seconds: float) -> None:
        return None

    monkeypatch.setattr(http, "sleep", no_wait)
    provider, memory = exporter
    llm = models.openai("fake", base_url=fake_openai.base_url, api_key="sk-otel-secret", max_batch=2,
                        price=(1.0, 1.0), max_tokens=3)
    q = outlines.string("q")
    fake_openai.script(Status(500))  # one retried request
    with outlines.trace() as trace:
        llm(q).eval({q: ["a", "b", "c"]}, cache=False)
        (q + "!").eval({q: "x"}, cache=False)
    outlines.otel.export(trace, provider)
    spans = memory.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    assert len(by_name["outlines.eval"]) == 2
    assert len(by_name["outlines.batch"]) == 2  # 3 prompts, 2 per batch
    assert len(by_name["outlines.request"]) == 4 == len(fake_openai.requests)
    first_eval = min(by_name["outlines.eval"], key=lambda s: s.start_time)
    for batch in by_name["outlines.batch"]:
        assert batch.parent.span_id == first_eval.context.span_id
        assert first_eval.start_time <= batch.start_time <= batch.end_time <= first_eval.end_time
        assert batch.attributes["outlines.cost"] == pytest.approx(
            (batch.attributes["outlines.prompt_tokens"] + batch.attributes["outlines.completion_tokens"]) / 1e6)
    batch_ids = {b.context.span_id for b in by_name["outlines.batch"]}
    assert all(r.parent.span_id in batch_ids for r in by_name["outlines.request"])
    failed = [r for r in by_name["outlines.request"] if r.status.status_code == StatusCode.ERROR]
    assert len(failed) == 1 and "HTTP 500" in failed[0].status.description
    assert sum(b.attributes["outlines.size"] for b in by_name["outlines.batch"]) == 3
    assert all("sk-otel-secret" not in repr(dict(s.attributes)) for s in spans)
