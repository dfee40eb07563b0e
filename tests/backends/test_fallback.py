"""Fallback chains (issue 17): draws that fail on the primary go to the next model.

Two fake OpenAI servers on 127.0.0.1: the primary answers 429 to scripted
requests, the fallback answers normally. Requests are counted on each server
exactly (retries included, waits patched out), and the cache holds each draw
under the key of the model that answered it.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import outlines
from outlines import cache as cache_module
from outlines import models
from outlines.backends.base import BackendError
from outlines.draws import Draw
from outlines.backends.fallback import FallbackBackend, falls_back
from outlines.cache import Cache
import tests.fixtures.fake_openai as fake
from tests.fixtures.fake_openai import FakeOpenAI, Status


@dataclasses.dataclass(frozen=True)
class LimitPrompt(fake.Action):
    """Answer 429 to a request for ``prompt``, normally to the others."""

    prompt: str

    async def respond(self, server: FakeOpenAI, request: Any, body: Any) -> Any:
        if fake.prompt_of(body) == self.prompt:
            return await Status(429).respond(server, request, body)
        return server.answer(request, body)


@pytest.fixture
def servers() -> Any:
    with FakeOpenAI(reply=lambda p, s, b: f"{b['model']}:{p}") as primary, \
            FakeOpenAI(reply=lambda p, s, b: f"{b['model']}:{p}") as secondary:
        yield primary, secondary


def chat(server: FakeOpenAI, name: str, retries: int) -> models.Model:
    return models.openai(name, base_url=server.base_url, api_key="sk-fallback", max_retries=retries, max_tokens=8)


def test_draws_that_exhaust_their_retries_on_429_go_to_the_fallback(
    servers: tuple[FakeOpenAI, FakeOpenAI], sleeps: list[float], tmp_path: Any
) -> None:
    primary, secondary = servers
    llm = models.fallback(chat(primary, "main", retries=2), chat(secondary, "spare", retries=2))
    q = outlines.string("q")
    # Prompt "b" is rate limited on every attempt (1 + 2 retries); "a" and "c" answer at once.
    # Requests arrive in any order, so the 429s are chosen by prompt, not by position.
    primary.script(*[LimitPrompt("b")] * 5)
    cache = Cache(tmp_path)
    with outlines.trace() as trace:
        values = llm(q).eval({"q": ["a", "b", "c"]}, cache=cache)
    assert list(values) == ["main:a", "spare:b", "main:c"]
    # "a", "c" once each and "b" three times on the primary; "b" once on the fallback.
    assert sorted(fake.prompt_of(r.body) for r in primary.requests) == ["a", "b", "b", "b", "c"]
    assert [fake.prompt_of(r.body) for r in secondary.requests] == ["b"]
    assert len(sleeps) == 2  # the primary's two retry waits for "b"
    # The trace names the model each request asked.
    asked = [r.model for r in trace.requests]
    assert sum("'main'" in m for m in asked) == 5 and sum("'spare'" in m for m in asked) == 1
    main, spare = llm.backend.backends
    assert trace.batches[0].answered_by == {repr(main): 2, repr(spare): 1}
    assert f"fallback chains answered: {repr(main)} 2, {repr(spare)} 1" in trace.summary()
    # Each draw is cached under the model that answered it.
    draw = lambda p: Draw(p, llm.defaults, 0)  # noqa: E731
    keys = {p: (cache_module.draw_key(main.identity, draw(p)), cache_module.draw_key(spare.identity, draw(p)))
            for p in "abc"}
    stored = cache.get_many([k for pair in keys.values() for k in pair], record=False, expect=str)
    assert stored == {keys["a"][0]: "main:a", keys["b"][1]: "spare:b", keys["c"][0]: "main:c"}
    # A re-run reads both models' entries: nothing is sent.
    primary.reset(), secondary.reset()
    assert list(llm(q).eval({"q": ["a", "b", "c"]}, cache=cache)) == ["main:a", "spare:b", "main:c"]
    assert primary.requests == [] and secondary.requests == []


def test_errors_outside_on_fail_the_draw_without_falling_back(
    servers: tuple[FakeOpenAI, FakeOpenAI], sleeps: list[float]
) -> None:
    primary, secondary = servers
    llm = models.fallback(chat(primary, "main", retries=3), chat(secondary, "spare", retries=0))
    primary.script(Status(400))
    value = llm("x").eval(cache=False, errors="return")
    assert isinstance(value, outlines.Failure) and "status=400" in value.message
    assert len(primary.requests) == 1 and secondary.requests == []


def test_the_last_model_failing_fails_the_draw_with_its_error(
    servers: tuple[FakeOpenAI, FakeOpenAI], sleeps: list[float]
) -> None:
    primary, secondary = servers
    llm = models.fallback(chat(primary, "main", retries=1), chat(secondary, "spare", retries=1), on=("5xx",))
    primary.script(Status(503), Status(500))
    secondary.script(Status(502), Status(502))
    with pytest.raises(outlines.NodeError, match="status=502"):
        llm("x").eval(cache=False)
    assert len(primary.requests) == 2 and len(secondary.requests) == 2


def test_falls_back_on_statuses_and_transport_failures() -> None:
    on = (429, "5xx", "timeout")
    assert falls_back(BackendError("x", status=503), on)
    assert falls_back(BackendError("x", status=408), on)
    assert falls_back(BackendError("ServerDisconnectedError", retryable=True), on)
    assert not falls_back(BackendError("x", status=401), on)
    assert not falls_back(RuntimeError("boom"), on)
    assert not falls_back(BackendError("x", status=503), (429,))
    with pytest.raises(ValueError, match="'5xx', '4xx' or 'timeout'"):
        FallbackBackend([models.openai("a", api_key="k").backend] * 2, on=("sometimes",))
    with pytest.raises(ValueError, match="at least two"):
        FallbackBackend([models.openai("a", api_key="k").backend])
    with pytest.raises(TypeError, match="takes models"):
        models.fallback(models.openai("a", api_key="k"), "gpt-4o")  # type: ignore[arg-type]
