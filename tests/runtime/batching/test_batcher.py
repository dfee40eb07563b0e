"""The batcher's cache step (``cached_values``): one lookup per identity, before a batch is packed."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outlines.draws import Draw, DrawColumns, GenerationParams
from outlines.cache import Cache
from outlines.runtime.batching.batcher import cached_values
from tests.fixtures.recording import RecordingBackend

PARAMS = GenerationParams.create(temperature=0.5)


def test_cached_values_answer_the_stored_draws_and_miss_the_rest(tmp_path: Path) -> None:
    backend = RecordingBackend()
    cache = Cache(tmp_path)
    hit, miss = Draw("cached", PARAMS, 0), Draw("fresh", PARAMS, 0)
    cache.put_draws(backend.identity, DrawColumns.of([hit]), ["stored"])
    cache.flush()
    draws = DrawColumns.of([hit, miss])
    assert cached_values(Cache(tmp_path, timeout=3.0), backend, draws) == ["stored", None]  # from the file
    assert cached_values(None, backend, draws) == [None, None] and cached_values(cache, backend, draws[0:0]) == []
    assert cached_values(cache, RecordingBackend(name="other"), draws) == [None, None]  # keys hold the identity
    before = cache.stats()["hits"]
    assert cached_values(cache, backend, draws, record=False) == ["stored", None]
    assert cache.stats()["hits"] == before  # a dry run counts nothing


def test_a_fallback_chain_looks_under_each_members_identity_in_turn(tmp_path: Path) -> None:
    from outlines.backends.fallback import FallbackBackend

    primary, second = RecordingBackend(name="primary"), RecordingBackend(name="second")
    chain = FallbackBackend([primary, second])
    cache = Cache(tmp_path)
    cache.put_draws(primary.identity, DrawColumns.of([Draw("a", PARAMS, 0)]), ["from primary"])
    cache.put_draws(second.identity, DrawColumns.of([Draw("a", PARAMS, 0), Draw("b", PARAMS, 0)]), ["x", "from second"])
    draws = DrawColumns.of([Draw("a", PARAMS, 0), Draw("b", PARAMS, 0), Draw("c", PARAMS, 0)])
    assert cached_values(cache, chain, draws) == ["from primary", "from second", None]


# -- prefix groups, end to end --------------------------------------------------------

#: Two few-shot headers, long enough to share (the transformers backend keeps 64+ characters together).
FEW_SHOT = ["Add the numbers. Q: 12 + 30 A: 42. Q: 7 + 8 A: 15. Q: 20 + 21 A: 41.\n",
            "Multiply the numbers. Q: 3 * 4 A: 12. Q: 6 * 7 A: 42. Q: 5 * 5 A: 25.\n"]


def test_a_rounds_prefix_groups_share_batches_and_each_head_is_prefilled_once_per_batch(tiny_model_path: str) -> None:
    import outlines
    from outlines.backends.transformers import TransformersBackend
    from tests.fixtures.recording import RecordingBackend

    prompt = outlines.string("prompt")
    prompts = [FEW_SHOT[i % 2] + f"Q: {i} ? {i + 1} A:" for i in range(8)]  # interleaved: A B A B ...
    runs = {}
    for grouped in (True, False):
        backend = RecordingBackend(inner=TransformersBackend(tiny_model_path, device="cpu", max_batch=4))
        if not grouped:
            backend.prefix_min_head = None  # the batcher keeps arrival order, as before prefix groups
        with outlines.trace() as trace:
            texts = backend.model(max_tokens=2, temperature=0)(prompt).eval({prompt: prompts}, cache=False)
        runs[grouped] = (list(texts), backend.batches, trace.tokens[0], trace.cached_tokens[0])
    (texts, batches, prompt_tokens, cached), (plain_texts, plain_batches, plain_tokens, plain_cached) = runs[True], runs[False]
    assert texts == plain_texts and prompt_tokens == plain_tokens  # the same texts, the same prompt tokens
    assert sorted(map(sorted, batches)) == [sorted(prompts[0::2]), sorted(prompts[1::2])]  # one header per batch
    assert all({p[:20] for p in batch} == {FEW_SHOT[0][:20], FEW_SHOT[1][:20]} for batch in plain_batches)
    loaded = TransformersBackend(tiny_model_path, device="cpu").load()
    head = min(len(loaded.tokenizer(h)["input_ids"]) for h in FEW_SHOT) - 2  # less what a boundary may merge
    # Grouped, each header runs once (3 of its 4 rows share it); mixed, once per batch (1 of 2 rows).
    assert cached - plain_cached >= 2 * head


@pytest.fixture
def caching_server() -> Any:
    from tests.fixtures.fake_openai import FakeOpenAI

    with FakeOpenAI(latency=0.05) as fake:
        yield fake


#: 2,000 tokens of the fake server (words) and of the client's estimate (4 characters each).
HEAD = "".join(f"w{i % 10}x " for i in range(2000))


@pytest.mark.parametrize("warm", [True, False])
def test_200_prompts_sharing_a_long_head_are_billed_it_cached_through_eval(caching_server: Any, warm: bool) -> None:
    import outlines
    from outlines import models

    question = outlines.string("question")
    llm = models.openai("m", base_url=caching_server.base_url, api_key="sk-test", max_tokens=4, temperature=0,
                        max_concurrency=200, prefix_warmup=warm)
    if not warm:  # long enough for all 200 to arrive before the first answer, even on a busy machine
        caching_server.latency = 2.0
    with outlines.trace() as trace:
        texts = llm(HEAD + question).eval({question: [f"q{i}" for i in range(200)]}, cache=False)
    assert list(texts) == [HEAD + f"q{i}#0" for i in range(200)] and caching_server.count == 200
    share = caching_server.cached_tokens / (200 * 2000)
    if warm:
        assert share >= 0.95
    else:  # all 200 at once: each misses the cache the others are about to fill
        assert share < 0.05
    assert trace.cached_tokens[0] == caching_server.cached_tokens  # the trace records what the server billed
    assert trace.tokens[0] == caching_server.prompt_tokens


def test_prompts_that_share_nothing_all_go_at_once_with_the_warm_up_on(caching_server: Any) -> None:
    import outlines
    from outlines import models

    question = outlines.string("question")
    llm = models.openai("m", base_url=caching_server.base_url, api_key="sk-test", max_tokens=4, temperature=0,
                        max_concurrency=50)
    prompts = [" ".join(f"u{i}v{j}" for j in range(1100)) for i in range(50)]  # long, each its own
    caching_server.latency = 2.0  # all 50 are in flight together unless one is held back
    llm(question).eval({question: prompts}, cache=False)
    assert caching_server.count == 50 and caching_server.max_in_flight == 50  # nobody waited for a leader
    assert caching_server.cached_tokens == 0


# -- bad elements fail alone ---------------------------------------------------------------


def test_a_prompt_element_that_is_not_text_fails_alone_and_the_others_are_sent(fake_openai: Any) -> None:
    import numpy as np

    import outlines
    from outlines import models
    from outlines.common.errors import Failure, NodeError

    m = models.openai("m", base_url=fake_openai.base_url, api_key="sk-test", max_tokens=3)
    q = outlines.string("q")
    answer = m(q)
    out = answer.eval({q: ["ok", None, "fine"]}, errors="return", cache=False)
    assert out[0] == "ok#0" and out[2] == "fine#0" and fake_openai.count == 2
    failure = out[1]
    assert isinstance(failure, Failure) and failure.error_type == "TypeError"
    assert "index 1" in failure.message and "NoneType" in failure.message and failure.node == answer.owner.label
    # Samples of a bad element all carry its Failure; a table names the element's row and column.
    grid = np.array([["a", b"bytes"], [3.5, "d"]], dtype=object)
    sampled = m(q, num_samples=2, temperature=0.5).eval({q: grid}, errors="return", cache=False)
    assert sampled.shape == (2, 2, 2) and fake_openai.count == 2 + 2  # one request (n=2) per good element
    assert [s.startswith("a#") for s in sampled[0, 0]] == [True, True]
    assert all(isinstance(f, Failure) and "index (0, 1)" in f.message and "bytes" in f.message for f in sampled[0, 1])
    assert all(isinstance(f, Failure) and "index (1, 0)" in f.message and "float" in f.message for f in sampled[1, 0])
    with pytest.raises(NodeError, match="the prompt must be text, got NoneType"):  # errors="raise": no request
        m(q).eval({q: ["ok", None]}, cache=False)
    assert fake_openai.count == 4
