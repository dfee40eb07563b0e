"""Fuzzing response bodies: whatever a server sends, only ``BackendError`` escapes.

Two layers: parsing (``post_json`` patched to return arbitrary JSON, many
examples, no sockets) and the wire (arbitrary statuses, headers and bytes from
the fake server on 127.0.0.1, fewer examples).
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outlines.backends import http
from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
from tests.fixtures.fake_openai import FakeOpenAI, Status

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

PARAMS = GenerationParams.create(temperature=0.5)
REQUESTS = [Draw("a", PARAMS, 0), Draw("b", PARAMS, 0), Draw("a", PARAMS, 1)]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
indices = st.one_of(st.integers(-2, 6), st.none(), st.text(max_size=2), st.floats(allow_nan=False))
choice = st.fixed_dictionaries(
    {},
    optional={
        "index": indices,
        "text": st.one_of(st.text(max_size=5), json_values),
        "message": st.one_of(
            json_values,
            st.fixed_dictionaries({}, optional={"content": st.one_of(st.text(max_size=5), json_values),
                                                "refusal": st.one_of(st.text(max_size=5), st.none())}),
        ),
    },
)
bodies = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"choices": st.one_of(st.lists(choice, max_size=6), json_values)},
        optional={"usage": st.one_of(json_values, st.fixed_dictionaries(
            {"prompt_tokens": st.one_of(st.integers(), json_values),
             "completion_tokens": st.one_of(st.integers(), json_values)}))},
    ),
)


def _check(outputs: list[str]) -> None:
    assert len(outputs) == len(REQUESTS) and all(isinstance(o, str) for o in outputs)


@pytest.mark.parametrize("backend_type", [OpenAICompletionBackend, OpenAIChatBackend])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_parsing_arbitrary_json_raises_only_backend_errors(
    monkeypatch: pytest.MonkeyPatch, backend_type: type, body: Any
) -> None:
    backend = backend_type("m", base_url="http://127.0.0.1:9/v1", api_key="sk-fuzz")

    async def post_json(path: str, payload: Any, report: Any, *, tokens: float = 0.0, on_response: Any = None) -> Any:
        if not isinstance(body, dict):
            raise BackendError("response is not a JSON object", status=200)
        return body

    monkeypatch.setattr(backend.client, "post_json", post_json)
    try:
        outputs = asyncio.run(backend.generate(REQUESTS, BatchReport()))
    except BackendError:
        return
    _check(outputs)


@pytest.fixture(scope="module")
def server() -> Any:
    with FakeOpenAI() as fake:
        yield fake


raw_bodies = st.one_of(
    st.binary(max_size=64),
    bodies.map(lambda b: __import__("json").dumps(b).encode()),
    st.sampled_from([b"[" * 100_000, b"\xff\xfe{}", b'{"choices": [{"text": "x"', b""]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=st.sampled_from([200, 201, 299, 304, 400, 404, 418, 429, 500, 503]),
    retry_after=st.one_of(st.none(), st.text(max_size=8), st.floats().map(str)),
    body=raw_bodies,
)
def test_the_wire_raises_only_backend_errors(
    server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch, status: int, retry_after: str | None, body: bytes
) -> None:
    async def no_sleep(seconds: float) -> None:
        assert seconds >= 0

    monkeypatch.setattr(http, "sleep", no_sleep)
    headers = {"Retry-After": retry_after} if retry_after is not None and retry_after.isprintable() else {}
    server.reset()
    server.script(*[Status(status, headers, body)] * 2)
    backend = OpenAICompletionBackend("m", base_url=server.base_url, api_key="sk-fuzz", max_retries=1)

    async def main() -> list[str]:
        try:
            return await backend.generate(REQUESTS, BatchReport())
        finally:
            await backend.aclose()

    try:
        outputs = asyncio.run(main())
    except BackendError as error:
        assert "sk-fuzz" not in str(error)
        return
    _check(outputs)
