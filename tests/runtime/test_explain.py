"""``outlines.explain``: the predicted requests equal the real ones, and nothing is sent."""
from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from typing import Any

import pytest

import outlines
from outlines import models
from outlines.cache import Cache
from tests.fixtures.recording import RecordingBackend


def answer(prompt: str) -> str:
    return f"{prompt}|{len(prompt) % 3}"


@outlines.fn(signature="(n)->()", name="majority")
def majority(xs):  # type: ignore[no-untyped-def]
    return Counter(xs).most_common(1)[0][0]


@outlines.fn(signature="(n)->()", name="join")
def join(xs):  # type: ignore[no-untyped-def]
    return " / ".join(xs)


def independent_chains(llm: models.Model, n: int = 10):  # type: ignore[no-untyped-def]
    q = outlines.string("q")
    outs = []
    for i in range(n):
        x = q + f" #{i}"
        for _ in range(3):
            x = llm(x)
        outs.append(x)
    return outs, {"q": "start"}


def vectorized_chain(llm: models.Model, n: int = 10):  # type: ignore[no-untyped-def]
    q = outlines.string("q")
    return [llm(llm(llm(q)))], {"q": [f"q{i}" for i in range(n)]}


def map_reduce(llm: models.Model, n: int = 9):  # type: ignore[no-untyped-def]
    docs = outlines.string("docs")
    summaries = llm("Summarize: " + docs)
    return [llm("Combine: " + join(summaries))], {"docs": [f"doc {i}" for i in range(n)]}


def self_consistency(llm: models.Model, n: int = 6):  # type: ignore[no-untyped-def]
    q = outlines.string("q")
    answers = llm("Q: " + q, num_samples=5)
    return [llm("Check: " + majority(answers))], {"q": [f"question {i}" for i in range(n)]}


def fn_steps(llm: models.Model, n: int = 8):  # type: ignore[no-untyped-def]
    q = outlines.string("q")
    tidy = outlines.fn(str.strip, name="tidy", blocking=False)
    return [llm(tidy(llm(q)))], {"q": [f" q{i} " for i in range(n)]}


def chains_with_python_steps(llm: models.Model, n: int = 12):  # type: ignore[no-untyped-def]
    q = outlines.string("q")
    tidy = outlines.fn(str.strip, name="tidy", blocking=True)  # thread pool between model calls
    outs = []
    for i in range(n):
        x = q + f" {i} "
        for _ in range(3):
            x = llm(tidy(x))
        outs.append(x)
    return outs, {"q": "start"}


SHAPES = [independent_chains, vectorized_chain, map_reduce, self_consistency, fn_steps]


def _real(outs, givens, **options):  # type: ignore[no-untyped-def]
    with outlines.trace() as trace:
        outlines.eval(*outs, givens=givens, **options)
    return trace


@pytest.mark.parametrize("shape", SHAPES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("max_batch", [None, 4])
def test_predicted_requests_equal_real_ones(shape, max_batch) -> None:  # type: ignore[no-untyped-def]
    recording = RecordingBackend(answer, delay=0.005, max_batch=max_batch)
    llm = recording.model()
    outs, givens = shape(llm)
    plan = outlines.explain(*outs, givens=givens, cache=False)
    assert recording.batches == []  # a dry run sends nothing
    trace = _real(outs, givens, cache=False)
    assert len(plan.batches) == len(recording.batches) == len(trace.batches)
    assert plan.requests == len(plan.batches)  # a recording backend receives each batch as one request
    assert sorted(b.size for b in plan.batches) == sorted(len(b) for b in recording.batches)
    assert plan.draws == trace.cache_misses
    assert plan.nodes_by_kind["generate"] == sum(1 for n in trace.nodes.values() if n.kind == "generate")


def test_python_steps_in_the_thread_pool_keep_the_predicted_count() -> None:
    recording = RecordingBackend(answer, delay=0.005, max_batch=4)
    llm = recording.model()
    outs, givens = chains_with_python_steps(llm)
    plan = outlines.explain(*outs, givens=givens, cache=False)
    # Each model call waits on its own thread-pool step: the prediction says timing matters ...
    assert not plan.batching_exact and len(plan.timing_dependent) == 36
    for _ in range(5):
        before = len(recording.batches)
        # ... and holds while the steps return within the gathering window (wide on a loaded machine).
        outlines.eval(*outs, givens=givens, cache=False, batch_window=0.25)
        assert len(recording.batches) - before == len(plan.batches) == 9


def test_known_prompts_are_exact_and_unknown_ones_are_counted_by_shape() -> None:
    llm = RecordingBackend(answer, delay=0.005).model()
    outs, givens = vectorized_chain(llm, n=7)
    plan = outlines.explain(*outs, givens=givens, cache=False)
    assert (plan.draws, plan.unknown_draws, plan.cache_hits) == (21, 14, 0)
    assert not plan.exact
    assert [b.unknown for b in plan.batches] == [0, 7, 7]
    assert "cache status unknown" in plan.summary()


def test_cache_hits_known_in_advance(tmp_path) -> None:
    recording = RecordingBackend(answer, delay=0.005, max_batch=3)
    llm = recording.model()
    cache = Cache(tmp_path)
    outs, givens = vectorized_chain(llm, n=5)
    outlines.eval(*outs, givens=givens, cache=cache)
    sent = len(recording.batches)
    again = outlines.explain(*outs, givens=givens, cache=cache)
    assert again.batches == [] and again.cache_hits == 15 and again.exact
    more = {"q": [f"q{i}" for i in range(7)]}
    plan = outlines.explain(*outs, givens=more, cache=cache)
    # cached answers make the later prompts of q0..q4 known: only q5, q6 are unknown there
    assert (plan.cache_hits, len(plan.batches), plan.unknown_draws) == (15, 3, 4)
    outlines.eval(*outs, givens=more, cache=cache)
    assert len(recording.batches) - sent == len(plan.batches)
    assert sorted(b.size for b in plan.batches) == sorted(len(b) for b in recording.batches[sent:])


def test_greedy_duplicates_collapse() -> None:
    recording = RecordingBackend(answer, delay=0.005)
    llm = recording.model(temperature=0)
    q = outlines.string("q")
    outs = [llm(q, num_samples=3), llm(q), llm(q + "!")]
    givens = {"q": ["a", "b", "a"]}
    plan = outlines.explain(*outs, givens=givens, cache=False)
    _real(outs, givens, cache=False)
    assert len(plan.batches) == len(recording.batches) == 1
    assert plan.batches[0].size == len(recording.batches[0]) == 4  # a, b, a!, b!
    assert plan.deduplicated == 11  # 15 draws, 4 sent


def test_unbound_inputs_make_sizes_unknown() -> None:
    llm = RecordingBackend(answer, delay=0.005).model()
    q = outlines.string("q")
    plan = outlines.explain(llm(outlines.fn(str.upper)(llm(q))), cache=False)
    assert plan.nodes_by_kind == {"input": 1, "inline": 0, "python": 1, "generate": 2}
    assert len(plan.unknown_nodes) == 2 and not plan.exact
    assert "unknown size" in str(plan)
    data = plan.to_dict()
    assert data["requests"] == 0 and data["batches"] == [] and data["exact"] is False


def test_explain_rejects_unknown_options() -> None:
    q = outlines.string("q")
    with pytest.raises(TypeError, match="unknown evaluation option"):
        outlines.explain(q, givens={"q": "x"}, bogus=1)
    with pytest.raises(TypeError):
        outlines.explain()


def test_a_python_step_on_one_branch_is_a_caveat_not_an_exact_prediction() -> None:
    recording = RecordingBackend(answer)
    llm = recording.model()

    @outlines.fn(blocking=True, name="slow")
    def slow(x: str) -> str:
        time.sleep(0.2)
        return x

    q = outlines.string("q")
    fast_branch, slow_branch = llm(q + "a"), llm(slow(q))
    plan = outlines.explain(fast_branch, slow_branch, givens={"q": "x"}, cache=False)
    assert len(plan.batches) == 1 and not plan.batching_exact and not plan.exact
    assert plan.timing_dependent == [fast_branch.owner.label, slow_branch.owner.label]
    assert "caveat" in plan.summary() and "prediction: an estimate" in plan.summary()
    assert plan.to_dict()["timing_dependent"] == plan.timing_dependent
    # ... and the run does split the predicted batch: the slow step outlasts the window.
    outlines.eval(fast_branch, slow_branch, givens={"q": "x"}, cache=False)
    assert recording.sizes == [1, 1]


@pytest.mark.parametrize("chains", [3, "STACK_MIN"])
def test_calls_after_an_impure_step_are_a_caveat_unless_eval_stacks_them(chains: Any) -> None:
    """Flat, a slow use splits the calls' batch; stacked over the uses gathered, they go out together."""
    n = outlines.common.config.Tuning.stack_min if chains == "STACK_MIN" else chains
    recording = RecordingBackend(answer)
    llm = recording.model()

    @outlines.fn(blocking=True, name="step")  # not declared pure: each use its own node
    def step(x: str) -> str:
        if x.startswith("q0"):
            time.sleep(0.2)
        return x

    outs = [llm(step(llm(outlines.constant(f"q{i}")))) for i in range(n)]
    explained = outlines.explain(*outs, cache=False)
    stacked = n >= outlines.common.config.Tuning.stack_min
    assert len(explained.batches) == 2 and explained.batching_exact == stacked
    assert len(explained.timing_dependent) == (0 if stacked else n)
    outlines.eval(*outs, cache=False)
    assert recording.sizes == ([n, n] if stacked else [1, n - 1, n])  # the run does what was said


def test_branches_waiting_on_the_same_step_stay_exact() -> None:
    llm = RecordingBackend(answer).model()
    q = outlines.string("q")
    shared = outlines.fn(str.strip, name="strip", blocking=True)(q)
    plan = outlines.explain(llm(shared + "a"), llm(shared + "b"), givens={"q": " x "}, cache=False)
    assert len(plan.batches) == 1 and plan.batching_exact and plan.timing_dependent == []
    assert "caveat" not in plan.summary()


def test_known_prompts_without_python_steps_are_exact() -> None:
    llm = RecordingBackend(answer).model()
    q = outlines.string("q")
    plan = outlines.explain(llm(q + "a"), llm(q + "b"), givens={"q": "x"}, cache=False)
    assert len(plan.batches) == 1 and plan.exact and "prediction: exact" in plan.summary()


def test_predicted_batches_keep_each_prompts_samples_together() -> None:
    """5 prompts x 3 samples at max_batch 4: one prompt per batch, predicted and real (issue 15)."""
    numbers = itertools.count()
    recording = RecordingBackend(lambda prompt: f"{prompt}|{next(numbers)}", delay=0.005, max_batch=4)
    llm = recording.model(temperature=0.7)  # every sample a distinct text, so a distinct prompt next
    q = outlines.string("q")
    first = llm(q, num_samples=3)
    second = llm(first + "?", num_samples=2)  # unknown prompts: counted by shape, packed the same way
    givens = {"q": [f"q{i}" for i in range(5)]}
    plan = outlines.explain(second, givens=givens, cache=False)
    outlines.eval(second, givens=givens, cache=False)
    assert sorted(b.size for b in plan.batches) == recording.sizes == [2] + [3] * 5 + [4] * 7
    for batch in recording.batches:  # every prompt of a batch with all its samples
        assert all(batch.count(p) == (2 if p.endswith("?") else 3) for p in batch)


def test_explain_shows_draw_numbers_that_depend_on_what_is_evaluated_together() -> None:
    llm = RecordingBackend(name="numbers").model()
    q = outlines.string("q")
    a = llm("Q: " + q)
    b = llm("Q: " + q, num_samples=2)  # the same prompt again: the draws after a's
    together = outlines.explain(a, b, givens={q: "x"}, cache=False)
    alone = outlines.explain(b, givens={q: "x"}, cache=False)
    assert together.draw_numbers == {a.owner.label: (0, 0), b.owner.label: (1, 2)}
    assert alone.draw_numbers == {b.owner.label: (0, 1)}
    assert f"draw numbers: {b.owner.label} 1-2 (after earlier calls" in together.summary()
    assert "draw numbers" not in alone.summary()
    assert outlines.explain(llm(q, temperature=0), givens={q: "x"}).draw_numbers == {}  # greedy: one draw


def test_explain_names_two_models_of_one_backend_class_apart() -> None:
    small = RecordingBackend(name="meta-llama/Llama-3.1-8B-Instruct-with-a-long-suffix").model()
    large = RecordingBackend(name="meta-llama/Llama-3.1-70B-Instruct-with-a-long-suffix").model()
    q = outlines.string("q")
    text = outlines.explain(small(q), large(q), givens={q: "hi"}, cache=False).summary()
    assert "recording: meta-llama/Llama-3.1-8B-Instruct-with-a-long-suffix: 1 request(s)" in text
    assert "recording: meta-llama/Llama-3.1-70B-Instruct-with-a-long-suffix: 1 request(s)" in text
    assert "..." not in text


