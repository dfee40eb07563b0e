"""HTTP backends under bad input and faults: credentials, the 429 slot, retry hints, deadlines, options.

Each test here failed before the fixes of issue 16; they talk to the
fault-injecting fake server on 127.0.0.1 (``tests/fixtures/fake_openai.py``).
"""
from __future__ import annotations

import asyncio
import pickle
from typing import Any, Mapping

import pytest

import outlines
from outlines import models
from outlines.backends import http
from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
from outlines.cache import draw_key
from tests.fixtures.fake_openai import OK, FakeOpenAI, Redirect, Status, Trickle

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

SAMPLING = GenerationParams.create(temperature=0.7)


def generate_a(backend: Any) -> list[str]:
    """The backend's completion of one draw of the prompt "a", its session closed after."""

    async def main() -> list[str]:
        try:
            return await backend.generate([Draw("a", SAMPLING, 0)], BatchReport())
        finally:
            await backend.aclose()

    return asyncio.run(main())


# -- item 2: credentials separate batches, never cache keys ---------------------------
@pytest.mark.parametrize("cache", [False, True])
def test_models_differing_only_in_api_key_send_their_own_key(
    fake_openai: FakeOpenAI, cache: bool, tmp_path: Any
) -> None:
    alice = models.openai("m", base_url=fake_openai.base_url, api_key="sk-alice-0123456789", temperature=0.7)
    bob = models.openai("m", base_url=fake_openai.base_url, api_key="sk-bob-0123456789", temperature=0.7)
    store: Any = outlines.cache.Cache(tmp_path) if cache else False
    values = outlines.eval(alice("from alice"), bob("from bob"), alice("p"), bob("p"), cache=store)
    assert values == ("from alice#0", "from bob#0", "p#0", "p#0")
    sent = {(r.body["messages"][-1]["content"], r.headers["Authorization"]) for r in fake_openai.requests}
    assert sent == {
        ("from alice", "Bearer sk-alice-0123456789"),
        ("p", "Bearer sk-alice-0123456789"),
        ("from bob", "Bearer sk-bob-0123456789"),
        ("p", "Bearer sk-bob-0123456789"),
    }


def test_the_credential_fingerprint_is_in_equality_only() -> None:
    options: dict[str, Any] = {"base_url": "http://127.0.0.1:1/v1"}
    one = OpenAIChatBackend("m", api_key="sk-one-0123456789", **options)
    same = OpenAIChatBackend("m", api_key="sk-one-0123456789", **options)
    other = OpenAIChatBackend("m", api_key="sk-two-0123456789", **options)
    org = OpenAIChatBackend("m", api_key="sk-one-0123456789", headers={"OpenAI-Organization": "org-2"}, **options)
    assert one == same and hash(one) == hash(same)
    assert one != other and one != org
    assert one.identity == other.identity == org.identity  # cache keys never see the key
    draw = Draw("p", SAMPLING, 0)
    assert draw_key(one.identity, draw) == draw_key(other.identity, draw)
    for backend in (one, other):
        shown = repr(backend) + str(backend.identity) + repr(vars(backend))
        assert "sk-" not in shown
        assert pickle.loads(pickle.dumps(backend)) is not None
    assert "0123456789" not in one._credentials and len(one._credentials) == 64


# -- item 9: a 429 lowers the limit before its slot is freed ---------------------------
def test_a_429_admits_no_extra_request_under_the_old_limit(sleeps: list[float]) -> None:
    backend = OpenAIChatBackend("m", base_url="http://127.0.0.1:1/v1", api_key="sk-x", max_concurrency=2)
    calls: list[str] = []
    release = asyncio.Event()

    async def fake_send(session: Any, path: str, wire: Any, on_response: Any = None) -> tuple[int, dict[str, str], bytes]:
        prompt = wire.payload["messages"][-1]["content"]
        calls.append(prompt)
        if len(calls) == 1:
            while len(calls) < 2:  # answer once "b" holds the other slot and "c" waits
                await asyncio.sleep(0)
            return 429, {}, b'{"error": {"message": "slow down"}}'
        await release.wait()
        body = b'{"choices": [{"index": 0, "message": {"content": "%s!"}}]}' % prompt.encode()
        return 200, {}, body

    backend.client._send = fake_send  # type: ignore[method-assign]

    async def main() -> tuple[list[str], int, int, list[str]]:
        try:
            draws = [Draw(p, SAMPLING, 0) for p in ("a", "b", "c")]
            task = asyncio.ensure_future(backend.generate(draws, BatchReport()))
            for _ in range(50):  # let the 429 come back and every waiter run
                await asyncio.sleep(0)
            limiter = backend.client.state().limiter
            seen, in_flight, limit = list(calls), limiter.in_flight, limiter.limit
            release.set()
            return seen, in_flight, limit, await task
        finally:
            await backend.aclose()

    seen, in_flight, limit, texts = asyncio.run(main())
    assert limit == 1 and in_flight == 1  # halved from 2 while "a" still held its slot
    assert seen == ["a", "b"]  # neither "c" nor the retry of "a" slipped in under the old limit
    assert texts == ["a!", "b!", "c!"]


# -- smaller: retry hints, short keys, deadlines, options -------------------------------
@pytest.mark.parametrize("retry_after", ["0", "Wed, 21 Oct 2015 07:28:00 GMT"])
def test_a_zero_or_past_retry_after_still_backs_off(
    fake_openai: FakeOpenAI, sleeps: list[float], retry_after: str
) -> None:
    fake_openai.script(Status(503, {"Retry-After": retry_after}), Status(503, {"Retry-After": retry_after}))
    backend = OpenAICompletionBackend("m", base_url=fake_openai.base_url, api_key="sk-x")

    assert generate_a(backend) == ["a#0"]
    assert len(sleeps) == 2 and all(s >= 0.375 for s in sleeps) and sleeps[1] > sleeps[0]


@pytest.mark.parametrize("key", ["k", "abc", "sk-1234"])
def test_short_keys_are_redacted_too(fake_openai: FakeOpenAI, key: str) -> None:
    fake_openai.script(Status(401, body={"error": {"message": f"Incorrect API key provided: [{key}]"}}))
    llm = models.openai("m", base_url=fake_openai.base_url, api_key=key)
    with pytest.raises(outlines.NodeError) as caught:
        llm("hello").eval(cache=False)
    text = str(caught.value) + repr(caught.value.__cause__)
    assert f"[{key}]" not in text and "[***]" in text


def test_a_short_key_is_hidden_as_a_word_not_inside_other_words(fake_openai: FakeOpenAI) -> None:
    """Issue 38, item 15: api_key="k" once starred the k of every word ("Soc***etTimeoutError")."""
    fake_openai.script(Status(401, body={"error": {"message": "SocketTimeoutError, then key k was refused"}}))
    llm = models.openai("m", base_url=fake_openai.base_url, api_key="k")
    with pytest.raises(outlines.NodeError) as caught:
        llm("hello").eval(cache=False)
    text = str(caught.value)
    assert "SocketTimeoutError, then key *** was refused" in text and " k " not in text


def test_a_trickling_server_is_cut_off_by_total_timeout(fake_openai: FakeOpenAI, sleeps: list[float]) -> None:
    fake_openai.script(Trickle(interval=0.02, seconds=30), Trickle(interval=0.02, seconds=30))
    backend = OpenAICompletionBackend(
        "m", base_url=fake_openai.base_url, api_key="sk-x", timeout=5, total_timeout=0.3, max_retries=1
    )

    with pytest.raises(BackendError, match="gave up after 2 attempts.*Timeout") as caught:
        generate_a(backend)
    assert caught.value.retryable and fake_openai.count == 2


@pytest.mark.parametrize(
    "options, message",
    [
        ({"timeout": -1}, "timeout must be a positive number"),
        ({"timeout": 0}, "timeout must be a positive number"),
        ({"connect_timeout": -5}, "connect_timeout must be a positive number"),
        ({"total_timeout": 0}, "total_timeout must be a positive number"),
        ({"max_retry_after": -1}, "max_retry_after must be"),
        ({"rpm": 0}, "rpm must be a positive number"),
        ({"tpm": -10}, "tpm must be a positive number"),
        ({"max_retries": -1}, "max_retries must be"),
        ({"max_retries": 1.5}, "max_retries must be"),
        ({"max_batch": 2.5}, "max_batch must be a positive integer"),
        ({"max_batch": -1}, "max_batch must be a positive integer"),
        ({"max_concurrency": -1}, "max_concurrency must be a positive integer"),
    ],
)
@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_bad_http_options_fail_at_construction(constructor: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        constructor("m", base_url="http://127.0.0.1:1/v1", api_key="sk-x", **options)


# -- issue 27, item 1: no credential of any kind crosses to another origin ----------------
SECRETS = {"api-key": "azure-SECRET-1", "OpenAI-Organization": "org-SECRET-2", "X-Team-Token": "team-SECRET-3"}
KEY = "sk-SECRET-0123456789"


def _sent_secrets(server: FakeOpenAI) -> list[str]:
    """Every secret (key or extra header value) found in a request ``server`` received, by header name."""
    found = []
    for request in server.requests:
        for name, value in request.headers.items():
            if "SECRET" in value:
                found.append(name)
    return found


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_redirect_to_another_origin_carries_no_credential(fake_openai: FakeOpenAI, status: int, kind: str) -> None:
    constructor = OpenAIChatBackend if kind == "chat" else OpenAICompletionBackend
    backend = constructor("m", base_url=fake_openai.base_url, api_key=KEY, headers=SECRETS, max_retries=0)
    with FakeOpenAI() as elsewhere:  # another port: another origin
        path = "/chat/completions" if kind == "chat" else "/completions"
        fake_openai.script(Redirect(elsewhere.base_url + path, status=status))

        if status in (307, 308):  # method and body kept: followed, without any credential
            assert generate_a(backend) == ["a#0"]
            assert len(elsewhere.requests) == 1 and elsewhere.requests[0].method == "POST"
        else:  # a POST turned into a GET could not be answered: refused, naming the new address
            with pytest.raises(BackendError, match=rf"redirect \(HTTP {status}\).*{elsewhere.base_url}") as caught:
                generate_a(backend)
            assert "base_url" in str(caught.value) and not caught.value.retryable
            assert elsewhere.requests == []
        assert _sent_secrets(elsewhere) == []
    assert sorted(_sent_secrets(fake_openai)) == sorted(["Authorization", *SECRETS])  # the first hop had them all


def test_a_same_origin_redirect_keeps_every_header_and_loops_are_bounded(fake_openai: FakeOpenAI) -> None:
    backend = OpenAICompletionBackend("m", base_url=fake_openai.base_url, api_key=KEY, headers=SECRETS, max_retries=0)
    fake_openai.script(Redirect(fake_openai.base_url + "/elsewhere/completions", status=308))

    assert generate_a(backend) == ["a#0"]
    assert sorted(_sent_secrets(fake_openai)) == sorted(["Authorization", *SECRETS] * 2)
    fake_openai.reset()
    fake_openai.script(*[Redirect("/v1/completions", status=307)] * 10)  # relative, forever
    with pytest.raises(BackendError, match="more than 3 redirects"):
        generate_a(backend)
    assert fake_openai.count == 4


def test_back_on_the_first_origin_after_another_one_credentials_stay_dropped(fake_openai: FakeOpenAI) -> None:
    backend = OpenAICompletionBackend("m", base_url=fake_openai.base_url, api_key=KEY, headers=SECRETS, max_retries=0)
    with FakeOpenAI() as elsewhere:
        fake_openai.script(Redirect(elsewhere.base_url + "/completions"), OK)
        elsewhere.script(Redirect(fake_openai.base_url + "/completions"))

        assert generate_a(backend) == ["a#0"]
        assert _sent_secrets(elsewhere) == [] and fake_openai.count == 2
        assert len(_sent_secrets(fake_openai)) == 1 + len(SECRETS)  # the first request only
