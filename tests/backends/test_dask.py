"""The Dask executor on a real two-process LocalCluster on 127.0.0.1.

Functions and classes used on workers live at module level, so workers import
them by reference (``tests.backends.test_dask``). The cluster tolerates one
worker death per task (``allowed_failures=1``) to keep the poison test short.
"""
from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from typing import Any, Iterator

import numpy as np
import pytest

import outlines
from outlines.common.config import set_executor, using_executor

distributed = pytest.importorskip("distributed")

from outlines.backends.dask import (  # noqa: E402 - needs distributed
    DaskExecutor, WorkerLostError, as_executor, runs_on_workers, worker_stats,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CLUSTER = dict(n_workers=2, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0")


# -- what runs on workers -----------------------------------------------------------
def shout(prompt: str) -> str:
    return prompt.upper() + "!"


def shout_all(prompts: list[str]) -> list[str]:
    return [shout(p) for p in prompts]


def word_count(text: str) -> int:
    return len(text.split())


def majority(samples: Any) -> str:
    return Counter(samples).most_common(1)[0][0]


def poison(text: str) -> str:
    if "poison" in text:
        os._exit(13)
    return text


class StallFirstRun:
    """A batched model that logs each run (pid) to a file and stalls on the first."""

    def __init__(self, log: str, stall: float) -> None:
        self.log = log
        self.stall = stall

    def __call__(self, prompts: list[str]) -> list[str]:
        first = not os.path.exists(self.log)
        with open(self.log, "a") as file:
            file.write(f"{os.getpid()}\n")
        if first:
            time.sleep(self.stall)
        return shout_all(prompts)


# -- fixtures -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with distributed.LocalCluster(**CLUSTER, scheduler_kwargs={"allowed_failures": 1}) as local:
        yield local


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    with distributed.Client(cluster) as dask_client:
        dask_client.wait_for_workers(2, timeout=60)  # a killed worker may still be restarting
        yield dask_client


def workers_of(trace: Any) -> list[str | None]:
    return [batch.worker for batch in trace.batches]


# -- tests ----------------------------------------------------------------------------
def test_placement_rules() -> None:
    from outlines.backends.function import FunctionBackend
    from outlines.backends.openai import OpenAICompletionBackend

    async def echo(prompt: str) -> str:
        return prompt

    http = OpenAICompletionBackend("m", base_url="http://127.0.0.1:9/v1", api_key="sk-secret")
    assert runs_on_workers(FunctionBackend(shout)) and not runs_on_workers(FunctionBackend(echo))
    assert not runs_on_workers(http) and runs_on_workers(http, "workers")
    with pytest.raises(ValueError, match="http must be"):
        DaskExecutor(object(), http="sometimes")


def test_killed_worker_becomes_a_clear_error() -> None:
    from distributed.scheduler import KilledWorker

    class Dead:
        address = "tcp://127.0.0.1:1"

    from outlines.backends.dask import _lost

    error = _lost(KilledWorker("k", Dead(), 1), "a batch")
    assert isinstance(error, WorkerLostError) and "2 Dask workers" in str(error) and "127.0.0.1:1" in str(error)


def test_core_graphs_equal_local_results(client: Any) -> None:
    q = outlines.string("q")
    loud = outlines.models.from_function(shout)
    loud_batched = outlines.models.from_function(shout_all, batched=True, max_batch=2)
    count = outlines.fn(word_count, blocking=True)
    vote = outlines.fn(majority, signature="(n)->()", blocking=True)
    answers = loud(q + " please")
    outputs = (
        answers,
        count(answers + " " + q),
        loud_batched(q, num_samples=3, temperature=0),
        vote(loud_batched(q, num_samples=3, temperature=0)),
    )
    givens = {"q": ["a b", "c", "d e f", "g"]}
    local = outlines.eval(*outputs, givens=givens, cache=False)
    with outlines.trace() as trace:
        remote = outlines.eval(*outputs, givens=givens, cache=False, executor=client)
    for mine, theirs in zip(remote, local):
        np.testing.assert_array_equal(mine, theirs)
    assert all(w is not None and w.startswith("tcp://127.0.0.1") for w in workers_of(trace))
    calls = sum(s.get("calls", 0) for stats in client.run(worker_stats).values() for s in stats.values())
    assert calls >= 1  # the blocking ops ran on workers too


def test_context_manager_and_async_client(client: Any, cluster: Any) -> None:
    q = outlines.string("q")
    graph = outlines.models.from_function(shout)(q)
    with using_executor(client), outlines.trace() as trace:
        assert outlines.eval(graph, givens={"q": "hi"}, cache=False) == "HI!"
    assert workers_of(trace)[0] is not None

    set_executor(client)
    try:
        assert graph.eval({"q": "yo"}, cache=False) == "YO!"
    finally:
        set_executor(None)
    program = outlines.compile([q], graph, cache=False).with_options(executor=client)
    with outlines.trace() as trace:
        assert program("ho") == "HO!"
    assert workers_of(trace)[0] is not None

    async def main() -> Any:
        async with distributed.Client(cluster.scheduler_address, asynchronous=True) as async_client:
            # A sync eval inside the loop that the async client needs would wait forever: it
            # refuses before running anything (RuntimeError; it used to fail the first node).
            with pytest.raises(RuntimeError, match="outlines.aeval"):
                outlines.eval(graph, givens={"q": "x"}, cache=False, executor=async_client)
            return await outlines.aeval(graph, givens={"q": ["x", "y"]}, cache=False, executor=async_client)

    assert list(asyncio.run(main())) == ["X!", "Y!"]


# The lock also keeps the model off the disk cache (a CacheWarning, tested in test_function.py).
@pytest.mark.filterwarnings("ignore::outlines.cache.CacheWarning")
def test_unpicklable_function_fails_at_once(client: Any) -> None:
    lock = threading.Lock()
    held = outlines.models.from_function(lambda p: p if lock else p)
    with pytest.raises(outlines.NodeError, match="cannot send .* to Dask workers"):
        outlines.eval(held(outlines.string("q")), givens={"q": "x"}, cache=False, executor=client)


def test_tiny_model_spreads_over_workers_and_loads_once_each(client: Any, tiny_model_path: str, tmp_path: Any) -> None:
    # No max_concurrency: the executor lifts a local model's one-batch-at-a-time bound.
    tiny = outlines.models.transformers(tiny_model_path, max_tokens=4, temperature=0, max_batch=8)
    q = outlines.string("q")
    prompts = [f"Q: What is {i} + 3? A:" for i in range(64)]
    with outlines.trace() as trace:
        remote = outlines.eval(tiny(q), givens={"q": prompts}, cache=False, executor=client, progress=False)
    workers = workers_of(trace)
    assert len(workers) == 8 and set(workers) == set(client.scheduler_info()["workers"])
    assert trace.tokens[1] > 0  # usage reported on workers reaches the trace
    trace.timeline(tmp_path / "timeline.html")
    page = (tmp_path / "timeline.html").read_text()
    assert all(w.split("://")[-1] in page for w in workers)  # one lane per worker
    spec = repr(tiny.backend.identity)
    stats = client.run(worker_stats)
    assert [stats[w][spec]["loads"] for w in sorted(set(workers))] == [1, 1]
    assert sum(stats[w][spec]["batches"] for w in stats) >= 8
    # A second evaluation reuses the loaded models (no new load anywhere).
    outlines.eval(tiny(q + "?"), givens={"q": prompts[:16]}, cache=False, executor=client, progress=False)
    assert all(s[spec]["loads"] == 1 for s in client.run(worker_stats).values() if spec in s)
    local = outlines.eval(tiny(q), givens={"q": prompts}, cache=False, progress=False)
    np.testing.assert_array_equal(remote, local)


def test_killed_worker_batch_reruns_once_elsewhere(client: Any, tmp_path: Any) -> None:
    log = str(tmp_path / "runs.log")
    model = outlines.models.from_function(StallFirstRun(log, stall=30.0), batched=True)
    q = outlines.string("q")
    killed: list[int] = []

    def first_line() -> str:
        try:
            with open(log) as file:
                line = file.readline()
        except FileNotFoundError:
            return ""
        return line if line.endswith("\n") else ""  # not half-written

    def kill_first_runner() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not first_line():
            time.sleep(0.02)
        pid = int(first_line())
        killed.append(pid)
        os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_first_runner)
    killer.start()
    try:
        with outlines.trace() as trace:
            result = outlines.eval(model(q), givens={"q": ["a", "b", "c"]}, cache=False, executor=client)
    finally:
        killer.join()
    assert list(result) == ["A!", "B!", "C!"]
    runs = [int(pid) for pid in open(log).read().split()]
    assert len(runs) == 2 and runs[0] == killed[0] and runs[1] != killed[0]
    assert len(trace.batches) == 1 and trace.batches[0].error is None  # one batch, as seen by the caller


def test_poison_op_fails_only_its_own_elements(client: Any) -> None:
    q = outlines.string("q")
    count = outlines.fn(word_count, blocking=True)
    crash = outlines.fn(poison, blocking=True)
    loud = outlines.models.from_function(shout)
    text = loud(q)
    ok = count(text)
    # The poison op starts after the other worker branches finished, so only it is on the dying workers.
    bad = crash(text + " poison" + outlines.fn(str, blocking=False)(ok))
    after_bad = count(bad)

    async def wait_locally(prompt: str) -> str:
        await asyncio.sleep(0.2)
        return prompt + "."

    local_branch = outlines.models.from_function(wait_locally)(q)
    values = outlines.eval(
        text, ok, bad, after_bad, local_branch, givens={"q": ["a b", "c"]}, cache=False, errors="return",
        executor=client,
    )
    text_value, ok_value, bad_value, after_value, local_value = values
    assert list(text_value) == ["A B!", "C!"] and list(ok_value) == [2, 1] and list(local_value) == ["a b.", "c."]
    assert isinstance(bad_value, outlines.Failure) and bad_value.error_type == "WorkerLostError"
    assert isinstance(after_value, outlines.Failure) and after_value.root == bad_value


def test_http_branch_runs_locally_while_workers_generate(client: Any, fake_openai: Any, tmp_path: Any) -> None:
    fake_openai.latency = 0.05
    slow = outlines.models.from_function(StallFirstRun(str(tmp_path / "slow.log"), stall=1.5), batched=True)
    api = outlines.models.openai_completion("fake", base_url=fake_openai.base_url, api_key="sk-secret", max_tokens=5)
    q = outlines.string("q")
    chained = api(api(api(q)))  # three sequential round trips
    with outlines.trace() as trace:
        stalled, answered = outlines.eval(slow(q), chained, givens={"q": "x"}, cache=False, executor=client)
    assert stalled == "X!" and answered.startswith("x")
    on_worker = [b for b in trace.batches if b.worker is not None]
    local = [b for b in trace.batches if b.worker is None]
    assert len(on_worker) == 1 and len(local) == 3  # the HTTP backend (and its key) never left this process
    assert all(b.end is not None and b.end < on_worker[0].end for b in local)
    # When asked, HTTP batches go to workers (the key travels in the pickled backend).
    with outlines.trace() as trace:
        answered_remote = outlines.eval(chained, givens={"q": "x"}, cache=False, executor=as_executor(client, http="workers"))
    assert answered_remote == answered and all(b.worker is not None for b in trace.batches)


def test_closing_the_client_leaves_no_processes(client: Any) -> None:
    psutil = pytest.importorskip("psutil")
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    own = distributed.Client(n_workers=1, processes=True, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0")
    graph = outlines.models.from_function(shout)(outlines.string("q"))
    assert outlines.eval(graph, givens={"q": "z"}, cache=False, executor=own) == "Z!"
    started = [p for p in me.children(recursive=True) if p.pid not in before]
    assert started  # its nanny and worker processes
    own.close()
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive


def fail(text: str) -> str:
    raise ValueError(f"no {text}")


def test_a_failure_does_not_wait_for_running_worker_batches(client: Any, tmp_path: Any) -> None:
    stall = outlines.models.from_function(StallFirstRun(str(tmp_path / "stall.log"), stall=5.0), batched=True)
    q = outlines.string("q")
    start = time.perf_counter()
    with pytest.raises(outlines.NodeError, match="no x"):
        outlines.eval(stall(q), outlines.fn(fail, blocking=True)(q), givens={"q": "x"}, cache=False, executor=client)
    assert time.perf_counter() - start < 4.0  # the stalled batch was abandoned, not awaited
