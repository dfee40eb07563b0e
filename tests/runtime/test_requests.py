"""Wire requests seen from the scheduler: per-draw failures, the request bound, executors.

Against the fault-injecting fake OpenAI server on 127.0.0.1: one failing
request of a chat batch fails only its own draw (issue 16, item 3);
``max_concurrency`` bounds the requests in flight across the evaluation
(issue 16, item 8); each request reaches the trace with its times.
"""
from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.runtime.executor import Executor, LocalExecutor
from tests.fixtures.fake_openai import FakeOpenAI, Stall, Status
from tests.fixtures.recording import RecordingBackend

KEY = "sk-requests-test"
PROMPTS = [f"p{i}" for i in range(16)]


def chat(server: FakeOpenAI, **options: Any) -> models.Model:
    return models.openai("fake-model", base_url=server.base_url, api_key=KEY, max_retries=0, **options)


def test_one_failing_request_of_a_chat_batch_fails_only_its_draw(fake_openai: FakeOpenAI, tmp_path: Any) -> None:
    llm = chat(fake_openai)
    q = outlines.string("q")
    # The first request to arrive gets a 400 (not retried); the others are slow, so they
    # are still in flight when it fails: nothing may cancel them.
    fake_openai.script(Status(400), *[Stall(0.2)] * 15)
    cache = Cache(tmp_path)
    with outlines.trace() as trace:
        values = llm(q).eval({"q": PROMPTS}, cache=cache, errors="return")
    assert len(trace.batches) == 1 and trace.batches[0].size == 16
    failed = [i for i, v in enumerate(values) if isinstance(v, outlines.Failure)]
    assert len(failed) == 1 and len(fake_openai.requests) == 16
    bad = fake_openai.prompts()[0]
    assert PROMPTS[failed[0]] == bad and "status=400" in values[failed[0]].message
    assert [v for i, v in enumerate(values) if i not in failed] == [f"{p}#0" for p in PROMPTS if p != bad]
    # The fifteen siblings were cached: a re-run sends only the failed draw.
    fake_openai.reset()
    again = llm(q).eval({"q": PROMPTS}, cache=cache, errors="return")
    assert fake_openai.prompts() == [bad]
    assert list(again) == [f"{p}#0" for p in PROMPTS]


def test_with_errors_raise_a_failing_request_still_fails_the_evaluation(fake_openai: FakeOpenAI) -> None:
    q = outlines.string("q")
    fake_openai.script(Status(400))
    node = chat(fake_openai)(q)
    with pytest.raises(outlines.NodeError, match=re.escape(node.owner.label)):
        node.eval({"q": PROMPTS}, cache=False)


@pytest.mark.parametrize("bound", [1, 3])
def test_max_concurrency_bounds_the_requests_in_flight(fake_openai: FakeOpenAI, bound: int) -> None:
    fake_openai.latency = 0.02
    q = outlines.string("q")
    values = chat(fake_openai)(q).eval({"q": PROMPTS}, cache=False, max_concurrency=bound)
    assert list(values) == [f"{p}#0" for p in PROMPTS]
    assert len(fake_openai.requests) == 16 and fake_openai.max_in_flight == bound


def test_without_a_bound_one_chat_batch_sends_its_requests_at_once(fake_openai: FakeOpenAI) -> None:
    fake_openai.latency = 0.05
    q = outlines.string("q")
    chat(fake_openai)(q).eval({"q": PROMPTS}, cache=False)
    assert fake_openai.max_in_flight > 3  # what max_concurrency=1 used to let through


def test_max_concurrency_bounds_calls_of_a_one_prompt_function() -> None:
    in_flight = [0, 0]

    async def one(prompt: str) -> str:
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        await asyncio.sleep(0.005)
        in_flight[0] -= 1
        return prompt

    q = outlines.string("q")
    models.from_function(one)(q).eval({"q": PROMPTS}, cache=False, max_concurrency=1)
    assert in_flight[1] == 1


@pytest.mark.parametrize("bound", [0, -1, 2.5, True, "4"])
def test_max_concurrency_must_be_a_positive_integer(bound: Any) -> None:
    q = outlines.string("q")
    with pytest.raises(ValueError, match="max_concurrency must be a positive integer"):
        (q + "!").eval({"q": "x"}, max_concurrency=bound)


def test_each_request_reaches_the_trace_with_its_batch(fake_openai: FakeOpenAI) -> None:
    q = outlines.string("q")
    with outlines.trace() as trace:
        chat(fake_openai)(q).eval({"q": PROMPTS[:4]}, cache=False)
    (batch,) = trace.batches
    assert len(trace.requests) == 4 == batch.requests
    assert all(r.batch == batch.id and batch.start <= r.start <= r.end <= batch.end for r in trace.requests)
    assert trace.to_dict()["requests"][0]["batch"] == batch.id


def test_an_executor_that_is_neither_protocol_nor_client_is_named() -> None:
    q = outlines.string("q")
    with pytest.raises(TypeError, match="executor must be .* got int 5"):
        (q + "!").eval({"q": "x"}, executor=5)


def test_any_object_implementing_the_protocol_is_an_executor() -> None:
    class Counting(LocalExecutor):
        def __init__(self) -> None:
            self.batches = 0

        async def generate(self, backend: Any, draws: Any, report: Any) -> Any:
            self.batches += 1
            return await super().generate(backend, draws, report)

    executor = Counting()
    assert isinstance(executor, Executor) and not isinstance(5, Executor)
    llm = RecordingBackend().model()
    q = outlines.string("q")
    assert list(llm(q).eval({"q": ["a", "b"]}, cache=False, executor=executor)) == ["a.", "b."]
    assert executor.batches == 1
