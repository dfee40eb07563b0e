"""``outlines.trace()``: the Trace agrees with what a recording fake backend saw."""
from __future__ import annotations

import asyncio
import json
import sys
import types

import pytest

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.runtime.plan import Plan
from outlines.runtime.events import NULL as NULL_RECORDER
from outlines.runtime.tracing import Trace, active_recorder
from tests.fixtures.recording import RecordingBackend


def test_totals_match_the_backend_records() -> None:
    recording = RecordingBackend(usage=True, max_batch=4)
    llm = recording.model()
    q = outlines.string("q")
    out = outlines.fn(str.upper, name="upper")(llm(llm(q)))
    with outlines.trace() as trace:
        out.eval({"q": [f"q{i}" for i in range(10)]}, cache=False)
    assert len(trace.batches) == len(recording.batches) == 6
    assert sorted(b.size for b in trace.batches) == sorted(len(b) for b in recording.batches)
    assert sum(trace.requests_per_backend.values()) == len(recording.batches)
    assert trace.cache_misses == sum(len(b) for b in recording.batches) == 20
    assert trace.cache_hits == 0
    assert trace.tokens == (60, 20)
    assert [b.id for b in trace.batches] == list(range(1, 7))
    kinds = sorted(n.kind for n in trace.nodes.values())
    assert kinds == ["generate", "generate", "input", "python"]
    for batch in trace.batches:
        assert batch.end is not None and batch.end >= batch.start
        assert batch.error is None
        for label in batch.nodes:
            assert batch.id in trace.nodes[label].batch_ids
    generate = [n for n in trace.nodes.values() if n.kind == "generate"]
    assert sum(len(n.batch_ids) for n in generate) == 6
    assert all(n.backend and "rec" in n.backend for n in generate)


def test_cache_hits_are_recorded(tmp_path) -> None:
    recording = RecordingBackend(usage=True)
    llm = recording.model()
    q = outlines.string("q")
    cache = Cache(tmp_path)
    with outlines.trace() as trace:
        llm(q).eval({"q": ["a", "b", "c"]}, cache=cache)
        llm(q).eval({"q": ["a", "b", "c", "d"]}, cache=cache)
    assert [len(b) for b in recording.batches] == [3, 1]
    assert (trace.cache_hits, trace.cache_misses) == (3, 4)
    assert len(trace.evals) == 2


def test_critical_path_follows_the_dependent_chain() -> None:
    recording = RecordingBackend(usage=True, delay=0.03)
    llm = recording.model()
    q = outlines.string("q")
    first = llm(q)
    side = outlines.fn(str.lower, name="side")(q)
    out = llm(first + side)
    with outlines.trace() as trace:
        out.eval({"q": "x"}, cache=False)
    labels = trace.critical_path_nodes
    assert labels[0] == first.owner.label and labels[-1] == out.owner.label
    assert side.owner.label not in labels
    assert 0.06 <= trace.critical_path <= trace.wall + 1e-6
    assert "critical path" in trace.summary()


def test_trace_sees_aeval_and_sync_eval_inside_a_running_loop() -> None:
    llm = RecordingBackend(usage=True).model()
    q = outlines.string("q")

    async def main() -> None:
        await llm(q).aeval({"q": "a"}, cache=False)
        llm(q).eval({"q": "b"}, cache=False)  # runs on a helper thread

    with outlines.trace() as trace:
        asyncio.run(main())
    assert len(trace.evals) == 2 and len(trace.batches) == 2


def test_concurrent_evals_keep_their_batches_apart() -> None:
    recording = RecordingBackend(usage=True, delay=0.02)
    llm = recording.model()
    q = outlines.string("q")

    async def main() -> None:
        await asyncio.gather(*(llm(q).aeval({"q": f"p{i}"}, cache=False) for i in range(3)))

    with outlines.trace() as trace:
        asyncio.run(main())
    assert sorted(b.id for b in trace.batches) == [1, 2, 3]
    assert all(b.end is not None for b in trace.batches)
    assert trace.wall < 3 * 0.02 + 0.05  # one overlapping span, not a sum
    assert len(trace.critical_path_nodes) == 1  # the longest of the overlapping evals


def test_no_recording_outside_the_block() -> None:
    assert active_recorder() is NULL_RECORDER
    with outlines.trace() as trace:
        assert active_recorder().trace is trace  # type: ignore[attr-defined]
    assert active_recorder() is NULL_RECORDER
    assert trace.wall == 0.0 and trace.critical_path == 0.0


def test_errors_are_first_lines() -> None:
    llm = RecordingBackend(usage=True, fail_on="bad").model()
    q = outlines.string("q")
    with outlines.trace() as trace:
        with pytest.raises(outlines.NodeError):
            llm(q).eval({"q": ["ok", "bad"]}, cache=False)
    (batch,) = trace.batches
    assert batch.error == "RuntimeError: refused bad"
    assert any("refused bad" in e for e in trace.errors)
    assert trace.evals[0].error is not None
    assert "errors (" in trace.summary()


def test_json_has_the_documented_fields_and_no_secret(tmp_path) -> None:
    secret = "sk-TRACE-SECRET-123"
    llm = models.openai("gpt-test", api_key=secret, base_url="http://127.0.0.1:9/v1")
    q = outlines.string("q")
    node = llm(q).owner
    trace = Trace()
    recorder = trace.for_eval()
    recorder.eval_started(Plan([node.out]), trace.origin)
    recorder.node_started(node, trace.origin + 0.1)
    recorder.batch_started(7, node.op.backend, [node.label], 1, trace.origin + 0.1)
    recorder.batch_finished(7, trace.origin + 0.3, None, (5, 2), None)
    recorder.node_cache(node, 0, 1)
    recorder.node_finished(node, trace.origin + 0.3)
    recorder.eval_finished(trace.origin + 0.3, None)
    path = tmp_path / "trace.json"
    trace.to_json(path)
    text = path.read_text()
    assert secret not in text and secret not in trace.summary() and secret not in repr(trace)
    data = json.loads(text)
    assert {"wall", "critical_path", "critical_path_nodes", "requests_per_backend", "nodes", "batches"} <= set(data)
    assert set(data["nodes"][1]) == {
        "label", "op", "kind", "backend", "start", "end", "batch_ids", "cache_hits", "cache_misses", "error",
        "failures", "skipped", "computing", "queued", "structure", "spans",
    }
    assert set(data["batches"][0]) == {
        "id", "backend", "size", "start", "end", "nodes", "worker", "prompt_tokens", "completion_tokens", "cached_tokens",
        "cache_write_tokens", "error", "requests", "answered_by", "jobs",
    }
    assert data["batches"][0]["id"] == 1 and data["nodes"][1]["batch_ids"] == [1]
    assert trace.critical_path == pytest.approx(0.2)
    assert trace.wall == pytest.approx(0.3)


def test_cached_tokens_are_recorded_per_batch_shown_in_the_summary_and_priced_as_cached_input(fake_openai) -> None:
    from outlines.backends.usage import Price

    head = " ".join(f"w{i}" for i in range(1100)) + " "  # past the fake's 1,024-token cache minimum
    price = Price(2.0, 8.0, cached_input=0.5)
    llm = models.openai("gpt-test", base_url=fake_openai.base_url, api_key="sk-test", max_tokens=2, max_batch=2,
                        price=price)
    q = outlines.string("q")
    with outlines.trace() as trace:
        llm(head + q).eval({q: ["a", "b", "c", "d"]}, cache=False)
    cached = [batch.cached_tokens for batch in trace.batches]
    assert sum(cached) == fake_openai.cached_tokens >= 3 * 1024 and len(cached) == 2  # one leader missed
    assert all(batch.cache_write_tokens == 0 for batch in trace.batches)  # OpenAI reports no writes
    prompt, completion = trace.tokens
    assert trace.cached_tokens == (fake_openai.cached_tokens, 0)
    assert trace.cost() == pytest.approx(price.cost(prompt, completion, cached_tokens=fake_openai.cached_tokens))
    assert trace.cost() < Price(2.0, 8.0).cost(prompt, completion)
    summary = trace.summary()
    assert f"tokens: {prompt} prompt ({fake_openai.cached_tokens} cached), {completion} completion" in summary
    assert f"{fake_openai.cached_tokens} of them cached" in summary
    assert json.loads(json.dumps(trace.to_dict()))["cached_tokens"] == fake_openai.cached_tokens


def test_timeline_delegates(monkeypatch, tmp_path) -> None:
    calls = []
    fake = types.ModuleType("outlines.graph.viz.timeline")
    fake.write_timeline = lambda trace, path: calls.append((trace, path)) or path  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "outlines.graph.viz.timeline", fake)
    trace = Trace()
    assert trace.timeline(tmp_path / "t.html") == tmp_path / "t.html"
    assert calls == [(trace, tmp_path / "t.html")]


def test_timeline_writes_html(tmp_path) -> None:
    pytest.importorskip("outlines.graph.viz.timeline")
    llm = RecordingBackend(usage=True, delay=0.01, max_batch=2).model()
    q = outlines.string("q")
    with outlines.trace() as trace:
        llm(llm(q)).eval({"q": ["a", "b", "c"]}, cache=False)
    path = tmp_path / "timeline.html"
    trace.timeline(path)
    assert path.read_text().lstrip().lower().startswith("<!doctype html")


def test_errors_return_records_failed_batches() -> None:
    llm = RecordingBackend(usage=True, fail_on="bad", max_batch=2).model()
    q = outlines.string("q")
    with outlines.trace() as trace:
        values = llm(q).eval({"q": ["ok", "fine", "bad", "x"]}, cache=False, errors="return")
    assert [isinstance(v, outlines.Failure) for v in values] == [False, False, True, True]
    assert [b.error for b in trace.batches] == [None, "RuntimeError: refused bad"]
    assert trace.evals[0].error is None
    node_line, batch_line = trace.errors
    assert "2 failed element(s)" in node_line and "refused bad" in node_line
    assert batch_line.startswith("batch 2 ")
    assert trace.failures == 2


def test_failures_are_shown_like_exceptions() -> None:
    trace = Trace()
    recorder = trace.for_eval()
    q = outlines.string("q")
    node = outlines.fn(str.upper, name="up")(q).owner
    recorder.eval_started(Plan([node.out]), trace.origin)
    recorder.node_started(node, trace.origin)
    failure = outlines.Failure("up#1", "up", "ValueError", "bad input\nmore")
    recorder.node_finished(node, trace.origin + 0.1, failure)  # type: ignore[arg-type]
    assert trace.nodes[node.label].error == "ValueError: bad input"


def test_http_requests_are_counted_apart_from_backend_calls(fake_openai) -> None:
    """One chat call of 3 prompts is 1 backend call and 3 wire requests."""
    llm = outlines.models.openai("fake-model", base_url=fake_openai.base_url, api_key="sk-test", temperature=0.5)
    with outlines.trace() as trace:
        outlines.eval(*[llm(p) for p in ("a", "b", "c")], cache=False)
    (name,) = trace.requests_per_backend
    assert trace.requests_per_backend[name] == 1
    assert trace.http_requests_per_backend[name] == len(fake_openai.requests) == 3
    header = next(line for line in trace.summary().splitlines() if line.strip().startswith("backend"))
    assert header.split()[1:4] == ["batches", "requests", "draws"]  # one word per meaning
    row = next(line for line in trace.summary().splitlines() if line.strip().startswith(trace.backend_names()[name]))
    assert row.split()[-4:-1] == ["1", "3", "3"]  # 1 batch, 3 wire requests, 3 draws


def test_returned_failures_count_as_errors() -> None:
    """errors="return": Failure elements show in errors(), failures and the summary."""

    @outlines.fn
    def parse(text: str) -> int:
        return int(text)

    @outlines.fn
    def double(n: int) -> int:
        return 2 * n

    q = outlines.string("q")
    with outlines.trace() as trace:
        values = double(parse(q)).eval({"q": ["1", "x", "3", "y", "z"]}, cache=False, errors="return")
    assert [isinstance(v, outlines.Failure) for v in values] == [False, True, False, True, True]
    assert trace.failures == 3
    (line,) = trace.errors()  # a method, like summary() ...
    assert trace.errors == [line]  # ... that still reads as a list
    assert "3 failed element(s)" in line and "ValueError" in line
    records = {r.op: r for r in trace.nodes.values()}
    assert (records["parse"].failures, records["parse"].skipped) == (3, 0)
    assert (records["double"].failures, records["double"].skipped) == (0, 3)
    summary = trace.summary()
    assert "errors (3 failed element(s) in 1 place(s), 3 element(s) skipped downstream)" in summary
    python_row = next(row for row in summary.splitlines() if row.strip().startswith("python"))
    assert python_row.split()[-2] == "3"  # errors, then runs


def _synthetic(trace: Trace, spans: list[tuple[float, float]]) -> list:
    """Python nodes run over the given spans (seconds from the trace origin)."""
    q = outlines.string("q")
    nodes = [outlines.fn(str.upper, name=f"f{i}")(q).owner for i in range(len(spans))]
    recorder = trace.for_eval()
    recorder.eval_started(Plan([n.out for n in nodes]), trace.origin)
    for node, (start, end) in zip(nodes, spans):
        recorder.node_started(node, trace.origin + start)
        recorder.node_finished(node, trace.origin + end)
    recorder.eval_finished(trace.origin + max(end for _, end in spans), None)
    return nodes


def test_busy_time_is_the_union_of_overlapping_intervals() -> None:
    trace = Trace()
    _synthetic(trace, [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])  # 6 s summed, 4 s covered
    row = next(r for r in trace.summary().splitlines() if r.strip().startswith("python"))
    count, busy = row.split()[1:3]
    assert (count, float(busy)) == ("3", 4.0)


def test_model_node_time_separates_queueing_from_computing() -> None:
    llm = RecordingBackend().model()
    q = outlines.string("q")
    node = llm(q).owner
    trace = Trace()
    recorder = trace.for_eval()
    recorder.eval_started(Plan([node.out]), trace.origin)
    recorder.node_started(node, trace.origin)  # ready at 0 s ...
    recorder.batch_started(1, node.op.backend, [node.label], 2, trace.origin + 6.0)  # ... a slot at 6 s
    recorder.batch_finished(1, trace.origin + 7.0, None, (0, 0), None)
    recorder.batch_started(2, node.op.backend, [node.label], 2, trace.origin + 6.5)
    recorder.batch_finished(2, trace.origin + 8.0, None, (0, 0), None)
    recorder.node_finished(node, trace.origin + 8.0)
    recorder.eval_finished(trace.origin + 8.0, None)
    record = trace.nodes[node.label]
    assert record.duration == pytest.approx(8.0)
    assert record.compute == pytest.approx(2.0)  # 6..8, the two batches overlapping
    assert record.queued == pytest.approx(6.0)
    row = next(r for r in trace.summary().splitlines() if r.strip().startswith("generate"))
    assert [float(x) for x in row.split()[2:5]] == pytest.approx([8.0, 2.0, 6.0])


def test_requests_and_model_loads_are_stored_with_their_times() -> None:
    llm = RecordingBackend().model()
    q = outlines.string("q")
    node = llm(q).owner
    trace = Trace()
    recorder = trace.for_eval()
    recorder.eval_started(Plan([node.out]), trace.origin)
    recorder.model_loaded(node.op.backend, trace.origin + 0.0, trace.origin + 3.0)
    recorder.node_started(node, trace.origin + 3.0)
    recorder.batch_started(4, node.op.backend, [node.label], 2, trace.origin + 3.0)
    recorder.request_finished(4, trace.origin + 3.0, trace.origin + 3.5, None)
    recorder.request_finished(4, trace.origin + 3.5, trace.origin + 4.0, RuntimeError("HTTP 500\nbody"))
    recorder.batch_finished(4, trace.origin + 4.0, None, (0, 0), None)
    recorder.node_finished(node, trace.origin + 4.0)
    recorder.eval_finished(trace.origin + 4.0, None)
    assert [(r.batch, r.start, r.end, r.error) for r in trace.requests] == [
        (1, pytest.approx(3.0), pytest.approx(3.5), None),
        (1, pytest.approx(3.5), pytest.approx(4.0), "RuntimeError: HTTP 500"),
    ]
    (load,) = trace.model_loads
    assert (load.start, load.end) == (pytest.approx(0.0), pytest.approx(3.0)) and "rec" in load.backend
    assert list(trace.http_requests_per_backend.values()) == [2]
    assert "model load" in trace.summary()
    data = trace.to_dict()
    assert len(data["requests"]) == 2 and len(data["model_loads"]) == 1


def test_a_loop_body_counts_every_iteration() -> None:
    backend = RecordingBackend(lambda prompt: "x", name="slow-loop", delay=0.2)
    llm = backend.model()
    question = outlines.string("question")
    three = outlines.fn(lambda rolls: rolls.count(";") < 3, name="three")
    final = outlines.while_loop(three, lambda rolls: rolls + llm(question + rolls) + ";", init="", max_iter=9)
    with outlines.trace() as t:
        final.eval({question: ["a", "b"]}, cache=False)
    assert len(backend.batches) == 3
    (call,) = [r for r in t.nodes.values() if r.kind == "generate"]
    assert call.runs == 3 and len(call.batch_ids) == 3
    assert call.duration >= 3 * 0.2 and call.compute >= 3 * 0.2  # every iteration, not the last one
    assert call.cache_misses == 6
    row = next(r for r in t.summary().splitlines() if r.strip().startswith("generate"))
    count, busy, compute, runs = [row.split()[i] for i in (1, 2, 3, 6)]
    assert (count, runs) == ("1", "3") and float(busy) >= 0.6 and float(compute) >= 0.6
    checks = [r.runs for r in t.nodes.values() if r.op == "three"]
    assert sorted(checks) == [1, 3]  # on the initial state, then in each iteration's body


def test_a_failing_loop_body_counts_the_failures_of_every_iteration() -> None:
    llm = RecordingBackend(lambda prompt: "x", name="fail-loop", fail_on="#x;", max_batch=1).model()
    question = outlines.string("question")
    three = outlines.fn(lambda rolls: rolls.count(";") < 3, name="three")
    final = outlines.while_loop(three, lambda rolls: rolls + llm(question + rolls) + ";", init="", max_iter=9)
    with outlines.trace() as t:  # "p#" fails at its second iteration (prompt "p#x;"), "q" runs three
        final.eval({question: ["p#", "q"]}, cache=False, errors="return")
    (call,) = [r for r in t.nodes.values() if r.kind == "generate"]
    assert call.runs == 3 and call.failures == 1
    assert any("1 failed element(s)" in line for line in t.errors)


def test_two_models_of_one_backend_class_print_apart_in_the_summary() -> None:
    small = RecordingBackend(name="meta-llama/Llama-3.1-8B-Instruct-with-a-long-suffix").model()
    large = RecordingBackend(name="meta-llama/Llama-3.1-70B-Instruct-with-a-long-suffix").model()
    q = outlines.string("q")
    with outlines.trace() as t:
        outlines.eval(small(q), large(q), givens={q: "hi"}, cache=False)
    lines = [line for line in t.summary().splitlines() if "Llama" in line]
    assert not any("..." in line for line in lines)
    rows = [line.split()[:2] for line in lines if not line.strip().startswith("cost")]  # the backend table
    assert rows == [["recording:", "meta-llama/Llama-3.1-70B-Instruct-with-a-long-suffix"],
                    ["recording:", "meta-llama/Llama-3.1-8B-Instruct-with-a-long-suffix"]]
    costs = [line.split(":")[1] for line in lines if line.strip().startswith("cost")]
    assert len(set(costs)) == 2


def test_iteration_records_count_the_calls_of_a_cond_in_the_loop_body() -> None:
    backend = RecordingBackend(lambda prompt: "x", name="cond-loop")
    llm = backend.model()
    question = outlines.string("question")
    short = outlines.fn(lambda rolls: rolls.count(";") < 2, name="short")
    odd = outlines.fn(lambda rolls: rolls.count(";") % 2 == 1, name="odd")

    def body(rolls: outlines.Variable) -> outlines.Variable:
        # the model is called only inside the branches: the loop body itself sends nothing
        step = outlines.cond(odd(rolls), lambda r: llm(question + r + "?"), lambda r: llm(question + r), rolls)
        return rolls + step + ";"

    final = outlines.while_loop(short, body, init="", max_iter=5)
    with outlines.trace() as t:
        final.eval({question: ["a"]}, cache=False)
    assert len(backend.batches) == len(t.batches) == 2
    assert [i.batches for i in t.iterations] == [1, 1]
    assert sum(i.batches for i in t.iterations) == len(t.batches)
