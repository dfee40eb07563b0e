"""``Program.stream`` and ``outlines.as_completed``: results in the order they finish.

The model is a batched ``from_function`` whose latency grows with the number in
its prompts ("q3" takes 3 steps), so the order of completion is set by design;
it records every batch it receives (started) and every batch it finished.
"""
from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.cache import Cache

pytestmark = [
    pytest.mark.filterwarnings("error::ResourceWarning"),
    pytest.mark.filterwarnings("error::RuntimeWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]

STEP = 0.05  # seconds per unit of latency: wide enough that the order survives a loaded machine
STARTED: list[list[str]] = []
FINISHED: list[list[str]] = []


def _latency(prompt: str) -> int:
    return int(re.findall(r"\d+", prompt)[0])  # the first number: "q3/7!" takes 3 steps


async def slow(prompts: list[str]) -> list[str]:
    STARTED.append(list(prompts))
    await asyncio.sleep(STEP * max(_latency(p) for p in prompts))
    if any("bad" in p for p in prompts):
        raise RuntimeError("refused a bad prompt")
    FINISHED.append(list(prompts))
    return [p.upper() for p in prompts]


@pytest.fixture(autouse=True)
def _fresh_records() -> None:
    STARTED.clear()
    FINISHED.clear()


def model(**options: Any) -> Any:
    # version pins the identity (and cache keys) whatever STARTED holds.
    return models.from_function(slow, batched=True, name="slow", version="1", temperature=0.7, **options)


def program(**options: Any) -> outlines.Program:
    llm = model(**options)
    return outlines.compile(lambda q: llm(q + "!"))


ORDER = ["q5", "q1", "q3", "q0", "q2", "q4"]  # index 3 finishes first, index 0 last


# -- Program.stream ---------------------------------------------------------------------


async def ranked(prompts: list[str]) -> list[str]:
    """``slow`` for ``ORDER`` in chunks of one, its order of completion set by rank, not by the machine's speed:
    the batch of latency L returns ``STEP`` after the L batches of lower latency returned (a loaded machine may
    start the chunks far apart), or after 10 s."""
    STARTED.append(list(prompts))
    deadline = time.monotonic() + 10.0
    while len(FINISHED) < _latency(prompts[0]) and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    await asyncio.sleep(STEP)
    FINISHED.append(list(prompts))
    return [p.upper() for p in prompts]


def test_elements_are_yielded_in_the_order_they_finish() -> None:
    llm = models.from_function(ranked, batched=True, name="ranked", version="1", temperature=0.7)
    prog = outlines.compile(lambda q: llm(q + "!"))
    results = list(prog.with_options(cache=False).stream(ORDER, chunk_size=1))
    assert [i for i, _ in results] == [3, 1, 4, 2, 5, 0]
    assert all(value == ORDER[i].upper() + "!" for i, value in results)
    assert sorted(len(b) for b in STARTED) == [1] * 6  # one batch per chunk of one element


def test_chunks_batch_their_elements_and_come_out_whole() -> None:
    # Chunks (q5, q1), (q3, q0), (q2, q4) take 5, 3 and 4 steps: one batch each.
    results = list(program().with_options(cache=False).stream(ORDER, chunk_size=2))
    assert [i for i, _ in results] == [2, 3, 4, 5, 0, 1]
    assert sorted(map(sorted, STARTED)) == [["q0!", "q3!"], ["q1!", "q5!"], ["q2!", "q4!"]]


def test_the_default_chunk_is_the_smallest_max_batch() -> None:
    stream = program(max_batch=4).with_options(cache=False).stream(ORDER)
    assert "chunks of 4" in repr(stream)
    assert sorted(i for i, _ in stream) == list(range(6))
    assert sorted(len(b) for b in STARTED) == [2, 4]


def test_samples_of_an_element_are_its_row() -> None:
    llm = model()
    prog = outlines.compile(lambda q: (llm(q + "!", num_samples=3), q + "?"))
    results = dict(prog.with_options(cache=False).stream(["q2", "q1"], chunk_size=1))
    assert [results[0][1], results[1][1]] == ["q2?", "q1?"]  # several outputs: a tuple per element
    assert isinstance(results[0][0], np.ndarray) and results[0][0].tolist() == ["Q2!"] * 3
    assert len(STARTED) == 2 and all(len(b) == 3 for b in STARTED)  # a prompt's 3 samples in one batch


def streaming_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "outlines-stream"]


def test_breaking_early_cancels_the_rest_and_sends_nothing_more() -> None:
    threads = streaming_threads()  # counted by name: an idle cache writer may end meanwhile
    prompts = ["q1"] + ["q4"] * 3 + [f"q{4 + i}" for i in range(16)]
    stream = program(max_concurrency=2).with_options(cache=False).stream(prompts, chunk_size=1)
    for index, value in stream:
        assert (index, value) == (0, "Q1!")
        break
    sent = len(STARTED)
    assert sent <= 4 and not FINISHED[1:]  # two in flight at most, cancelled before they finished
    assert streaming_threads() == threads  # the helper thread is gone: closing waited for it
    outlines.eval(outlines.constant("x") + "y")  # anything still queued would run now; nothing does
    assert len(STARTED) == sent


def test_a_stream_runs_once() -> None:
    stream = program().with_options(cache=False).stream(["q0"])
    assert list(stream) == [(0, "Q0!")]
    with pytest.raises(RuntimeError, match="runs once"):
        list(stream)


def test_errors_return_yields_the_failure_of_the_failed_element() -> None:
    results = dict(program().with_options(cache=False, errors="return").stream(["q1", "bad/q2", "q3"], chunk_size=1))
    assert results[0] == "Q1!" and results[2] == "Q3!"
    assert isinstance(results[1], outlines.Failure) and "refused a bad prompt" in str(results[1])


def test_errors_raise_after_what_finished_first(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    seen = []
    with pytest.raises(outlines.NodeError, match="refused a bad prompt"):
        for index, _ in program().with_options(cache=cache).stream(["q1", "bad/q3", "q2", "q8"], chunk_size=1):
            seen.append(index)
    assert seen == [0, 2]  # finished before the failure; q8 was cancelled
    cache.flush()
    rerun = program().with_options(cache=cache, errors="return").stream(["q1", "bad/q3", "q2", "q8"], chunk_size=1)
    STARTED.clear()
    assert sorted(i for i, _ in rerun) == [0, 1, 2, 3]
    assert sorted(map(sorted, STARTED)) == [["bad/q3!"], ["q8!"]]  # only what had not finished


def test_a_rerun_after_a_partial_stream_sends_only_what_did_not_finish(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    prompts = [f"q{i % 4 + 1}" + "/" + str(i) for i in range(12)]
    prog = program(max_concurrency=3).with_options(cache=cache)
    got = []
    for index, value in prog.stream(prompts, chunk_size=1):
        got.append(index)
        if len(got) == 3:
            break
    finished = {p for batch in FINISHED for p in batch}
    assert len(finished) >= 3 and len(finished) < len(prompts)
    cache.flush()
    STARTED.clear()
    values = prog(prompts)
    assert {p for batch in STARTED for p in batch} == {p + "!" for p in prompts} - finished
    assert [values[i] for i in got] == [prompts[i].upper() + "!" for i in got]


def test_sync_stream_inside_a_running_loop() -> None:
    async def notebook_cell() -> list[int]:
        out = []
        for index, _ in program().with_options(cache=False).stream(ORDER, chunk_size=1):  # sync, like Jupyter
            out.append(index)
            if len(out) == 2:
                break
        return out

    assert asyncio.run(notebook_cell()) == [3, 1]


def test_async_for_on_the_callers_loop() -> None:
    async def main() -> list[int]:
        out = []
        stream = program().with_options(cache=False).stream(ORDER, chunk_size=1)
        async with contextlib.aclosing(stream.__aiter__()) as results:  # type: ignore[type-var]
            async for index, _ in results:
                out.append(index)
                if len(out) == 3:
                    break
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []  # all cancelled
        return out

    assert asyncio.run(main()) == [3, 1, 4]


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("q1", "x"), {}, "at least one array input"),
        ((["q1", "q2"], ["a", "b", "c"]), {}, "must share their leading axis, got q: 2, r: 3"),
        ((["q1"], "x"), {"chunk_size": 0}, "chunk_size must be a positive integer"),
    ],
)
def test_what_cannot_stream_fails_at_the_call(args: tuple[Any, ...], kwargs: dict[str, Any], message: str) -> None:
    llm = model()
    prog = outlines.compile(lambda q, r: (llm(q + "!"), r + "?"))  # q and r never meet: any lengths build
    with pytest.raises(ValueError, match=message):
        prog.stream(*args, **kwargs)
    assert STARTED == []


def test_an_output_without_the_leading_axis_is_named() -> None:
    llm = model()
    prog = outlines.compile(lambda q: (llm(q + "!"), outlines.constant("fixed")))
    with pytest.raises(ValueError, match=r"output .* has shape \(\) for 1 input element"):
        list(prog.with_options(cache=False).stream(["q1"]))


# -- as_completed ------------------------------------------------------------------------


def test_as_completed_yields_each_variable_as_its_node_finishes() -> None:
    fast, slower = model(), models.from_function(slow, batched=True, name="other", version="1", temperature=0.7)
    q = outlines.string("q")
    late = slower(q + "3")
    early = fast(q + "1")
    both = early + late
    order = list(outlines.as_completed(both, late, q, early, givens={"q": "q"}, cache=False))
    assert order == [(2, "q"), (3, "Q1"), (1, "Q3"), (0, "Q1Q3")]
    assert len(STARTED) == 2  # one schedule: ``late`` and ``early`` run once for both uses


def test_as_completed_errors_raise_after_the_finished_values() -> None:
    q = outlines.string("q")
    good, bad = model()(q + "1"), models.from_function(slow, batched=True, name="b", temperature=0.7)(q + "bad/3")
    seen = []
    with pytest.raises(outlines.NodeError, match="refused a bad prompt"):
        for position, value in outlines.as_completed(bad, good, givens={"q": "q"}, cache=False):
            seen.append((position, value))
    assert seen == [(1, "Q1")]
    returned = dict(outlines.as_completed(bad, good, givens={"q": "q"}, cache=False, errors="return"))
    assert isinstance(returned[0], outlines.Failure) and returned[1] == "Q1"


def test_as_completed_checks_its_inputs_at_the_call() -> None:
    with pytest.raises(outlines.UnboundInputError):
        outlines.as_completed(outlines.string("missing") + "!")
    with pytest.raises(TypeError, match="at least one Variable"):
        outlines.as_completed()


# -- over HTTP ---------------------------------------------------------------------------


def test_an_http_stream_stopped_early_closes_its_sessions_and_sends_nothing_more(fake_openai: Any) -> None:
    """Completions, 2 requests in flight at most, one prompt per chunk: break after the first answer."""
    import gc

    fake_openai.latency = 0.05
    llm = models.openai_completion(
        "fake-model", base_url=fake_openai.base_url, api_key="sk-test", temperature=0.7, max_concurrency=2
    )
    prog = outlines.compile(lambda q: llm(q, num_samples=2)).with_options(cache=False)
    for index, samples in prog.stream([f"p{i}" for i in range(30)], chunk_size=1):
        assert samples.tolist() == [f"p{index}#0", f"p{index}#1"]
        break
    # A request written before the break may reach the server a little later:
    # count once the server has seen nothing new for several latencies.
    sent, quiet_since = len(fake_openai.requests), time.monotonic()
    while time.monotonic() - quiet_since < 0.3:
        time.sleep(0.02)
        if len(fake_openai.requests) != sent:
            sent, quiet_since = len(fake_openai.requests), time.monotonic()
    assert sent <= 4 and all(r.body["n"] == 2 for r in fake_openai.requests)
    gc.collect()  # an unclosed aiohttp session would warn here (an error in this module)
    assert prog(["x"]).shape == (1, 2)  # the backend still works on another loop
    assert len(fake_openai.requests) == sent + 1


def test_a_traced_stream_is_one_evaluation_with_every_chunks_batches() -> None:
    with outlines.trace() as trace:
        assert len(list(program().with_options(cache=False).stream(ORDER, chunk_size=2))) == 6
    assert len(trace.evals) == 1
    assert sorted(b.size for b in trace.batches) == [2, 2, 2] and len({b.id for b in trace.batches}) == 3


def test_as_completed_over_a_loop_reports_the_loop_once_it_is_done() -> None:
    @outlines.fn
    def short(text: str) -> bool:
        return len(text) < 6

    q = outlines.string("q")
    final = outlines.while_loop(short, lambda text: text + "x", init=q, max_iter=10)
    results = list(outlines.as_completed(final, q + "!", givens={"q": "ab"}, cache=False))
    assert sorted(results) == [(0, "abxxxx"), (1, "ab!")]  # the body's nested nodes are not reported
