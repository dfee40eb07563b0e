"""Scheduler behaviour seen from a recording fake backend.

Batch counts for each benchmark shape at small N; batched results
equal unbatched ones for random DAGs (hypothesis); ``errors="return"`` keeps
every branch that can finish; cancellation and Ctrl-C leave nothing pending
(checked in a subprocess under ``python -X dev -W error``).
"""
from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.cache import Cache
from tests.fixtures.recording import RecordingBackend
from tests.fixtures.subprocesses import ROOT, python_env, sigint_default



def reply(prompt: str, tag: str = "") -> str:
    """The fake model's answer: short, and a function of the prompt only."""
    return f"<{tag}{prompt[-8:]}:{len(prompt)}>"


def chains(llm: models.Model, n: int, depth: int = 3) -> list[outlines.Variable]:
    q = outlines.string("q")
    outs = []
    for i in range(n):
        x = q + f"/{i}"
        for _ in range(depth):
            x = llm(x)
        outs.append(x)
    return outs


# -- counts per benchmark shape ----------------------------------------------------
@pytest.mark.parametrize("max_batch", [None, 5])
def test_independent_chains_send_depth_times_ceil_n_over_max_batch(max_batch: int | None) -> None:
    recording = RecordingBackend(reply, delay=0.005, max_batch=max_batch)
    llm = recording.model()
    n = 12
    with outlines.trace() as trace:
        values = outlines.eval(*chains(llm, n), givens={"q": "s"}, cache=False)
    per_level = math.ceil(n / (max_batch or n))
    assert len(recording.batches) == 3 * per_level == len(trace.batches)
    assert recording.sizes == sorted([min(max_batch or n, n - i) for i in range(0, n, max_batch or n)] * 3)
    assert values[4] == reply(reply(reply("s/4")))


def test_program_over_an_array_is_one_node_per_op() -> None:
    recording = RecordingBackend(reply, delay=0.005, max_batch=8)
    llm = recording.model()
    program = outlines.compile(lambda q: llm(llm(llm(q))), cache=False)
    inputs = [f"q{i}" for i in range(20)]
    out = program(inputs)
    assert len(program.plan.nodes) == 3
    assert recording.sizes == sorted([8, 8, 4] * 3)
    assert list(out) == [reply(reply(reply(x))) for x in inputs]


def test_trivial_fn_chains_run_every_node_once() -> None:
    calls = []

    @outlines.fn
    def step(x: str) -> str:
        calls.append(x)
        return x + "+"

    q = outlines.string("q")
    outs = []
    for i in range(40):
        x = q + str(i)
        for _ in range(5):
            x = step(x)
        outs.append(x)
    with outlines.trace() as trace:
        values = outlines.eval(*outs, givens={"q": "v"}, cache=False)
    assert len(calls) == 200 and values[7] == "v7+++++"
    assert sum(1 for n in trace.nodes.values() if n.kind == "python") == 200


def test_chains_of_different_latencies_batch_per_level() -> None:
    """Batches that come back at different times keep the ideal request count."""
    recording = RecordingBackend(
        reply, delay=lambda prompts: 0.004 * (1 + int(prompts[0].split("/")[1][:1]) % 3), max_batch=4
    )
    llm = recording.model()
    n = 12
    outlines.eval(*chains(llm, n), givens={"q": "s"}, cache=False)
    assert len(recording.batches) == 3 * math.ceil(n / 4)


def test_gathering_window_merges_siblings_ready_at_slightly_different_times() -> None:
    """Prompts ready 0/10/20 ms apart (after async tools) go out together within a window."""

    @outlines.fn
    async def tool(x: str) -> str:
        await asyncio.sleep(0.01 * (int(x.split("/")[1]) % 3))
        return x

    def build(recording: RecordingBackend) -> list[outlines.Variable]:
        llm = recording.model()
        slow = RecordingBackend(lambda p: reply(p, "slow"), delay=0.15, name="slow").model()
        q = outlines.string("q")
        outs = [llm(tool(q + f"/{i}")) for i in range(9)]
        return outs + [slow(q)]  # keeps a batch in flight, so the window applies

    merged, split = RecordingBackend(reply, delay=0.005), RecordingBackend(reply, delay=0.005)
    outlines.eval(*build(merged), givens={"q": "s"}, cache=False, batch_window=0.1)
    outlines.eval(*build(split), givens={"q": "s"}, cache=False, batch_window=0)
    assert merged.sizes == [9]
    assert len(split.batches) >= 2 and sum(split.sizes) == 9


def test_global_max_concurrency_bounds_batches_in_flight() -> None:
    in_flight = [0, 0]

    async def gate(prompts: list[str]) -> list[str]:
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        await asyncio.sleep(0.005)
        in_flight[0] -= 1
        return prompts

    llm = models.from_function(gate, batched=True, max_batch=1)
    q = outlines.string("q")
    llm(q).eval({"q": [str(i) for i in range(9)]}, cache=False, max_concurrency=2)
    assert in_flight[1] == 2


# -- batched == unbatched for random DAGs --------------------------------------------
OPS = ("model_a", "model_b", "concat", "upper")


@st.composite
def dags(draw):  # type: ignore[no-untyped-def]
    size = draw(st.integers(1, 8))
    nodes = []
    for i in range(size):
        op = draw(st.sampled_from(OPS))
        arity = 2 if op == "concat" else 1
        nodes.append((op, [draw(st.integers(-1, i - 1)) for _ in range(arity)]))
    outputs = draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=3, unique=True))
    return nodes, outputs


def build_dag(spec, model_a, model_b, q):  # type: ignore[no-untyped-def]
    upper = outlines.fn(str.upper, name="upper", blocking=False)
    variables = []
    for op, args in spec:
        inputs = [q if a < 0 else variables[a] for a in args]
        if op == "model_a":
            variables.append(model_a(inputs[0]))
        elif op == "model_b":
            variables.append(model_b(inputs[0]))
        elif op == "concat":
            variables.append(inputs[0] + inputs[1])
        else:
            variables.append(upper(inputs[0]))
    return variables


def reference(spec, outputs, inputs):  # type: ignore[no-untyped-def]
    values = []
    for op, args in spec:
        xs = [inputs if a < 0 else values[a] for a in args]
        if op == "model_a":
            values.append([reply(x, "a") for x in xs[0]])
        elif op == "model_b":
            values.append([reply(x, "b") for x in xs[0]])
        elif op == "concat":
            values.append([x + y for x, y in zip(*xs)])
        else:
            values.append([x.upper() for x in xs[0]])
    return [values[o] for o in outputs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dag=dags(), width=st.integers(1, 5), max_batch=st.one_of(st.none(), st.integers(1, 6)))
def test_batched_equals_unbatched_element_by_element(dag, width, max_batch) -> None:  # type: ignore[no-untyped-def]
    spec, outputs = dag
    inputs = [f"x{i}" for i in range(width)]

    def evaluate(batched: bool) -> list[list[str]]:
        if batched:
            a = RecordingBackend(lambda p: reply(p, "a"), name="a", max_batch=max_batch).model()
            b = RecordingBackend(lambda p: reply(p, "b"), name="b", max_batch=max_batch).model()
        else:
            a = models.from_function(lambda p: reply(p, "a"), name="a")
            b = models.from_function(lambda p: reply(p, "b"), name="b")
        q = outlines.string("q")
        variables = build_dag(spec, a, b, q)
        values = outlines.eval(*(variables[o] for o in outputs), givens={"q": inputs}, cache=False)
        values = values if len(outputs) > 1 else (values,)
        return [list(v) for v in values]

    assert evaluate(True) == evaluate(False) == reference(spec, outputs, inputs)


# -- errors="return" -------------------------------------------------------------------
def test_five_of_a_hundred_failing_elements(tmp_path: Path) -> None:
    recording = RecordingBackend(reply, delay=0.005, max_batch=32)
    llm = recording.model()
    broken = {7, 21, 42, 63, 99}
    attempts: dict[str, int] = {}

    @outlines.fn
    def check(x: str) -> str:
        attempts[x] = attempts.get(x, 0) + 1
        if int(x[1:]) in broken and attempts[x] == 1:  # fails the first time only
            raise ValueError(f"bad input {x}")
        return x

    finish = outlines.fn(lambda s: s + "#", name="finish")
    q = outlines.string("q")
    out = finish(llm(check(q)))
    givens = {"q": [f"q{i}" for i in range(100)]}
    cache = Cache(tmp_path)
    values = out.eval(givens, cache=cache, errors="return")
    failures = [i for i, v in enumerate(values) if isinstance(v, outlines.Failure)]
    assert failures == sorted(broken)
    assert all(isinstance(values[i], str) for i in range(100) if i not in broken)
    failure = values[42]
    assert failure.error_type == "UpstreamFailure" and failure.node == out.owner.label
    assert failure.root.error_type == "ValueError" and "bad input q42" in failure.root.message
    sent = [p for batch in recording.batches for p in batch]
    assert len(sent) == 95 and not any(p in sent for p in (f"q{i}" for i in broken))
    # A re-run redoes only what failed: the five elements reach the model now.
    before = len(recording.batches)
    again = out.eval(givens, cache=cache, errors="return")
    assert [p for batch in recording.batches[before:] for p in batch] == [f"q{i}" for i in sorted(broken)]
    assert list(again) == [reply(f"q{i}") + "#" for i in range(100)]


def test_a_failing_batch_fails_only_its_elements() -> None:
    async def picky(prompts: list[str]) -> list[str]:
        if "q13" in prompts:
            raise RuntimeError("rate limited")
        return [reply(p) for p in prompts]

    llm = models.from_function(picky, batched=True, max_batch=10)
    q = outlines.string("q")
    values = llm(q).eval({"q": [f"q{i}" for i in range(100)]}, cache=False, errors="return")
    failed = [i for i, v in enumerate(values) if isinstance(v, outlines.Failure)]
    assert failed == list(range(10, 20))
    assert values[15].error_type == "RuntimeError" and "rate limited" in values[15].message


def test_errors_raise_names_the_node() -> None:
    @outlines.fn
    def explode(x: str) -> str:
        raise KeyError(x)

    q = outlines.string("q")
    out = explode(q)
    with pytest.raises(outlines.NodeError, match=out.owner.label):
        out.eval({"q": "x"}, cache=False)


# -- cancellation (subprocess, python -X dev -W error) ------------------------------------
@pytest.mark.parametrize("mode", ["cancel", "sigint", "raise"])
def test_cancellation_leaves_nothing_pending(mode: str, tmp_path: Path) -> None:
    script = ROOT / "tests" / "fixtures" / "cancel_script.py"
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "default"))
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", str(script), mode, str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, preexec_fn=sigint_default,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"OK {mode} hits=20"), result.stdout
    for bad in ("Task was destroyed", "never awaited", "Unclosed", "Exception ignored", "Warning"):
        assert bad not in result.stderr, result.stderr[-3000:]


def test_values_are_arrays_of_the_prompt_shape() -> None:
    llm = RecordingBackend(reply, delay=0.005).model()
    q = outlines.string("q")
    value = llm(q, num_samples=3).eval({"q": [["a", "b"], ["c", "d"]]}, cache=False)
    assert isinstance(value, np.ndarray) and value.shape == (2, 2, 3)


# -- the collector during an evaluation (issue 15) ------------------------------------------------
def test_the_collector_is_off_in_the_schedulers_bursts_and_back_on_after_an_error() -> None:
    import gc

    from outlines.runtime.scheduler import quiet_collector

    seen: list[bool] = []

    @outlines.fn(name="probe", blocking=False)  # runs inline, inside a scheduler round
    def probe(x: str) -> str:
        seen.append(gc.isenabled())
        if x == "boom":
            raise ValueError("boom")
        return x

    assert outlines.eval(probe(outlines.constant("a")), cache=False) == "a"
    with pytest.raises(outlines.NodeError):
        outlines.eval(probe(outlines.constant("boom")), cache=False)
    assert seen == [False, False] and gc.isenabled()
    with pytest.raises(KeyError):
        with quiet_collector():
            raise KeyError("x")
    assert gc.isenabled()
    gc.disable()  # a caller's choice is left as it is
    try:
        with quiet_collector():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_backends_receive_one_draw_batch_of_unique_draws_per_batch() -> None:
    from outlines.draws import DrawColumns

    received: list[Any] = []
    backend = RecordingBackend()
    original = backend.generate

    async def generate(draws: Any, report: Any) -> list[str]:
        received.append(draws)
        return await original(draws, report)

    backend.generate = generate  # type: ignore[method-assign]
    llm = backend.model(temperature=0.5)
    prompts = outlines.constant(["a", "b", "a", "c"])
    first, second = llm(prompts), llm(prompts)  # two draws of each prompt: numbers 0 and 1
    a, b = outlines.eval(first, second, cache=False)
    assert list(a) == ["a.", "b.", "a.", "c."] and list(b) == list(a)
    assert len(received) == 1 and isinstance(received[0], DrawColumns)
    assert list(zip(received[0].prompts, received[0].numbers)) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0), ("c", 1)]  # each prompt's draws together


def test_a_blocking_step_in_the_pool_keeps_the_cache_writer_waiting() -> None:
    import threading
    import time

    from outlines.common.threads import FOREGROUND

    seen: list[tuple[bool, bool]] = []

    def step(text: str) -> str:
        time.sleep(0.05)  # the loop is waiting in its selector by now
        seen.append((threading.current_thread() is threading.main_thread(), FOREGROUND.idle.is_set()))
        return text + "!"

    program = outlines.compile(lambda q: outlines.fn(step, blocking=True)(q), cache=False, progress=False)
    assert program(["a", "b"]).tolist() == ["a!", "b!"]
    assert seen == [(False, False), (False, False)]  # off the loop, and counted as foreground
    assert FOREGROUND.idle.is_set()  # left idle once the evaluation is over
