"""Prompt-cache warm-up: the plan of each batch, and OpenAI backends against the caching fake server."""
from __future__ import annotations

import asyncio
import time
from typing import Any, Sequence

import pytest

import outlines
from outlines import models
from outlines.backends.base import BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
from outlines.backends.warmup import ALONE, MAX_BOUNDARIES, Warmup
from tests.fixtures.fake_openai import CACHE_MIN_TOKENS, CACHE_STEP, FakeOpenAI, Status

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

KEY = "sk-test-SECRET-0123456789"
SAMPLING = GenerationParams.create(temperature=0.7)
#: 1,200 words (the fake's tokens) and about 1,900 tokens by the client's estimate.
HEAD = " ".join(f"w{i % 97}" for i in range(1200)) + " "
LATENCY = 0.3


def plan(batches: Sequence[Sequence[str]], *, exact: bool = False, min_chars: int = 8) -> list[list[Any]]:
    """The turns of consecutive batches planned on one ``Warmup`` (one event loop)."""
    async def main() -> list[list[Any]]:
        warmup = Warmup()
        return [warmup.turns(texts, lambda head: len(head) >= min_chars, min_chars=min_chars, wait=5.0, exact=exact)
                for texts in batches]

    return asyncio.run(main())


# -- the plan ------------------------------------------------------------------------------


def test_each_shared_head_gets_one_leader_and_its_followers() -> None:
    a, b = "Header A: one two three. ", "Header B: four five six. "
    (turns,) = plan([[a + "q1", b + "q1", "alone", a + "q2", b + "q2", a + "q3"]])
    assert [t.lead is not None for t in turns] == [True, True, False, False, False, False]
    assert turns[2] is ALONE
    assert turns[3].after is turns[0].lead and turns[5].after is turns[0].lead and turns[4].after is turns[1].lead
    assert turns[0].heads == (len(a) + 1,)  # the group's head: "Header A: one two three. q"


def test_a_head_too_short_to_cache_is_sent_as_it_is() -> None:
    (turns,) = plan([["short a", "short b"]], min_chars=100)
    assert turns == [ALONE, ALONE]


def test_the_next_batch_follows_the_head_already_warming() -> None:
    head = "A long shared document. " * 4
    first, second = plan([[head + "q1", head + "q2"], [head + "q3", head + "q44", head + "other"]])
    assert first[0].lead is not None
    assert all(t.lead is None and t.after is first[0].lead for t in second)  # one leader for both batches


def test_a_remembered_head_much_shorter_than_the_group_s_does_not_serve_it() -> None:
    doc = "A shared document. " * 5
    header = "A long few-shot header for one group. " * 20  # more than TOLERANCE characters
    first, second = plan([[doc + "x1", doc + "y2"], [doc + header + "q1", doc + header + "q2"]])
    assert second[0].lead is not None and second[0].lead is not first[0].lead


def test_marked_boundaries_chain_the_remembered_heads_within_four() -> None:
    doc = "A shared document. " * 5
    nested = [doc + "".join(f"part {j}. " * 100 for j in range(k)) for k in range(7)]  # each starts with the last
    turns = plan([[head + f"{i}?" for i in range(2)] for head in nested], exact=True)
    assert turns[0][0].heads == (len(doc),)
    assert turns[1][0].heads == (len(nested[0]), len(nested[1]))  # reads the doc, writes its own head
    assert turns[6][0].heads == tuple(len(head) for head in nested[3:])  # the longest three remembered, and its own
    assert turns[6][1].heads == turns[6][0].heads and turns[6][1].after is turns[6][0].lead


def test_a_lone_request_follows_a_warming_head_of_another_batch() -> None:
    head = "A long shared document. " * 4
    first, second = plan([[head + "q1", head + "q2"], [head + "a different and longer question"]])
    assert second[0].after is first[0].lead and second[0].lead is None


def test_followers_wait_at_most_the_bound() -> None:
    async def main() -> float:
        warmup = Warmup()
        turns = warmup.turns(["same head, a", "same head, b"], lambda head: True, min_chars=4, wait=0.05)
        start = time.perf_counter()
        await turns[1].ready()  # the leader never answers
        return time.perf_counter() - start

    assert 0.04 <= asyncio.run(main()) < 1.0


# -- against the fake server ---------------------------------------------------------------------


def run(backend: Any, draws: Sequence[Draw], report: BatchReport | None = None) -> list[str]:
    async def main() -> list[str]:
        try:
            return await backend.generate(draws, report or BatchReport())
        finally:
            await backend.aclose()

    return asyncio.run(main())


def cached_head(prompt_words: int) -> int:
    """The cached tokens OpenAI bills for a head of ``prompt_words`` tokens: 1,024, then steps of 128."""
    return CACHE_MIN_TOKENS + (prompt_words - CACHE_MIN_TOKENS) // CACHE_STEP * CACHE_STEP


@pytest.fixture
def server() -> Any:
    with FakeOpenAI(latency=LATENCY) as fake:
        yield fake


@pytest.mark.parametrize("warm", [True, False])
def test_chat_siblings_of_a_long_head_wait_for_the_leader_and_hit_the_cache(server: FakeOpenAI, warm: bool) -> None:
    prompts = [HEAD + f"question {i}" for i in range(6)]
    report = BatchReport()
    start = time.perf_counter()
    texts = run(OpenAIChatBackend("m", base_url=server.base_url, api_key=KEY, prefix_warmup=warm),
                [Draw(p, SAMPLING, 0) for p in prompts], report)
    wall = time.perf_counter() - start
    assert texts == [p + "#0" for p in prompts]
    arrivals = sorted(r.time for r in server.requests)
    if warm:
        assert arrivals[1] - arrivals[0] >= LATENCY * 0.9  # the others went once the leader answered
        assert report.cached_tokens == 5 * cached_head(1200) and wall < 3 * LATENCY + 1.0
    else:
        assert arrivals[-1] - arrivals[0] < LATENCY / 2 and report.cached_tokens == 0  # all at once: all miss
    assert report.tokens[0] == 6 * 1202


def test_followers_connect_while_the_leader_is_in_flight(server: FakeOpenAI) -> None:
    # Released when the leader's response starts, each follower only writes
    # its request: the connections were opened while they waited.
    prompts = [HEAD + f"question {i}" for i in range(6)]
    backend = OpenAIChatBackend("m", base_url=server.base_url, api_key=KEY)
    report = BatchReport()

    async def main() -> tuple[int, int, list[str]]:
        try:
            sending = asyncio.ensure_future(backend.generate([Draw(p, SAMPLING, 0) for p in prompts], report))
            while server.count < 1:  # the leader has arrived; its answer is LATENCY away
                await asyncio.sleep(0.005)
            await asyncio.sleep(LATENCY / 2)
            during = await asyncio.to_thread(server.open_connections), server.count
            return (*during, await sending)
        finally:
            await backend.aclose()

    connections, requests, texts = asyncio.run(main())
    assert requests == 1 and connections == len(prompts)  # the leader's, and one per follower, before it answered
    assert texts == [p + "#0" for p in prompts] and server.count == len(prompts)  # no request more
    assert report.cached_tokens == 5 * cached_head(1202)


def test_opening_connections_never_takes_the_last_request_slots(server: FakeOpenAI) -> None:
    prompts = [HEAD + f"question {i}" for i in range(6)]
    backend = OpenAIChatBackend("m", base_url=server.base_url, api_key=KEY, max_concurrency=3)

    async def main() -> tuple[int, list[str]]:
        try:
            sending = asyncio.ensure_future(backend.generate([Draw(p, SAMPLING, 0) for p in prompts], BatchReport()))
            while server.count < 1:
                await asyncio.sleep(0.005)
            await asyncio.sleep(LATENCY / 2)
            return await asyncio.to_thread(server.open_connections), await sending
        finally:
            await backend.aclose()

    connections, texts = asyncio.run(main())
    assert connections == 2  # the leader's and one held: a third would leave no room for a request
    assert texts == [p + "#0" for p in prompts] and server.count == len(prompts)


def test_batches_of_one_round_warm_a_head_once(server: FakeOpenAI) -> None:
    question = outlines.string("question")
    llm = models.openai("m", base_url=server.base_url, api_key=KEY, max_batch=4, max_tokens=4)
    llm(HEAD + question).eval({question: [f"q{i}" for i in range(12)]}, cache=False)  # 3 batches of 4
    assert server.count == 12 and server.cached_tokens == 11 * cached_head(1201)


def test_a_failed_leader_releases_its_followers_at_once(server: FakeOpenAI) -> None:
    server.script(Status(400, body={"error": {"message": "bad request"}}))
    report = BatchReport()
    start = time.perf_counter()
    draws = [Draw(HEAD + f"q{i}", SAMPLING, 0) for i in range(4)]
    with pytest.raises(Exception, match="400"):
        run(OpenAIChatBackend("m", base_url=server.base_url, api_key=KEY), draws, report)
    assert sorted(report.results) == [1, 2, 3] and list(report.failures) == [0]
    assert time.perf_counter() - start < 5.0  # not the 30 s bound


def test_completions_send_the_leader_alone_then_the_rest_in_one_list(server: FakeOpenAI) -> None:
    prompts = [HEAD + f"question {i}" for i in range(5)] + ["unrelated"]
    report = BatchReport()
    texts = run(OpenAICompletionBackend("m", base_url=server.base_url, api_key=KEY),
                [Draw(p, SAMPLING, 0) for p in prompts], report)
    assert texts == [p + "#0" for p in prompts]
    sent = sorted(server.requests, key=lambda r: r.time)
    assert [r.body["prompt"] for r in sent[:1]] == [[prompts[0], "unrelated"]]  # the leader and the loner go first
    assert sent[1].body["prompt"] == prompts[1:5] and sent[1].time - sent[0].time >= LATENCY * 0.9
    assert report.cached_tokens == 4 * cached_head(1202)


def test_prefix_warmup_is_checked() -> None:
    with pytest.raises(ValueError, match="prefix_warmup must be True, False or a positive number of seconds"):
        OpenAIChatBackend("m", api_key=KEY, prefix_warmup=-1)
    assert OpenAIChatBackend("m", api_key=KEY, prefix_warmup=2).prefix_warmup == 2.0
    assert OpenAIChatBackend("m", api_key=KEY, prefix_warmup=False).prefix_min_head is None
    assert OpenAIChatBackend("m", api_key=KEY).prefix_min_head == 1024
