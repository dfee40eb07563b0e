"""eval/aeval: laziness, batching, concurrency, draws, givens and errors."""
from __future__ import annotations

import asyncio
import random
import threading
import time

import numpy as np
import pytest

import outlines
from outlines import models
from tests.fixtures.subprocesses import python_env
from tests.fixtures.recording import RecordingBackend


def test_building_calls_nothing_and_eval_calls_each_node_once():
    calls = []

    @outlines.fn
    def record(x):
        calls.append(x)
        return x + "."

    q = outlines.string("q")
    shared = record(q)
    a, b = shared + "a", shared + "b"
    assert calls == []
    assert outlines.eval(a, b, givens={q: "x"}) == ("x.a", "x.b")
    assert calls == ["x"]


def test_sibling_calls_to_a_batched_backend_arrive_as_one_call():
    rec = RecordingBackend(str.upper)
    llm = rec.model()
    outs = [llm(f"p{i}") for i in range(10)]
    assert outlines.eval(*outs, cache=False) == tuple(f"P{i}" for i in range(10))
    assert len(rec.batches) == 1 and len(rec.batches[0]) == 10


def test_batches_are_split_by_max_batch():
    rec = RecordingBackend(str.upper, max_batch=4)
    llm = rec.model()
    outlines.eval(*[llm(f"p{i}") for i in range(10)], cache=False)
    assert sorted(len(b) for b in rec.batches) == [2, 4, 4]


def test_two_backends_get_two_calls():
    one, two = RecordingBackend(str.upper, name="one"), RecordingBackend(str.upper, name="two")
    a, b = one.model(), two.model()
    outlines.eval(a("x"), a("y"), b("x"), b("y"), cache=False)
    assert len(one.batches) == 1 and len(two.batches) == 1


def test_different_params_are_different_batches():
    rec = RecordingBackend(str.upper)
    llm = rec.model()
    outlines.eval(llm("x", max_tokens=5), llm("y", max_tokens=5), llm("z", max_tokens=9), cache=False)
    assert sorted(len(b) for b in rec.batches) == [1, 2]


def test_independent_branches_run_concurrently():
    async def slow(prompt):
        await asyncio.sleep(0.3)
        return prompt

    def blocking(prompt):
        time.sleep(0.3)
        return prompt

    for fn in (slow, blocking):
        llm = models.from_function(fn)
        start = time.perf_counter()
        outlines.eval(llm("a") + "x", llm("b") + "y", cache=False)
        assert time.perf_counter() - start < 0.5, fn.__name__


def test_identical_calls_to_a_random_callable_are_independent_draws():
    rng = random.Random(1)
    llm = models.from_function(lambda p: f"{p}{rng.random()}")
    values = outlines.eval(*[llm("same") for _ in range(4)], cache=False)
    assert len(set(values)) == 4
    samples = llm("same", num_samples=4).eval(cache=False)
    assert len(set(samples)) == 4


def test_output_shape_is_prompt_shape_plus_samples():
    llm = models.from_function(lambda p: p)
    q = outlines.string("q")
    assert isinstance(llm(q).eval({q: "a"}), str)
    assert llm(q, num_samples=3).eval({q: "a"}, cache=False).shape == (3,)
    grid = [["a", "b"], ["c", "d"], ["e", "f"]]
    assert llm(q).eval({q: grid}, cache=False).shape == (3, 2)
    assert llm(q, num_samples=4).eval({q: grid}, cache=False).shape == (3, 2, 4)


def test_greedy_draws_collapse_to_one_request():
    rec = RecordingBackend(str.upper)
    llm = rec.model(temperature=0)
    out = llm("x", num_samples=5).eval(cache=False)
    assert list(out) == ["X"] * 5 and rec.batches == [["x"]]


def test_num_samples_must_be_positive_integer():
    llm = models.from_function(lambda p: p)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(outlines.GraphBuildError, match=r"num_samples must be an integer >= 1"):
            llm("x", num_samples=bad)


def test_non_string_prompt_constant_is_rejected_at_build_time():
    llm = models.from_function(lambda p: p, name="echo")
    with pytest.raises(outlines.GraphBuildError, match=r"Generate\[function:echo\].*prompt must be a string.*int"):
        llm(42)
    with pytest.raises(outlines.GraphBuildError, match="prompt must be"):
        llm(["ok", 3])


def test_bad_generation_params_name_the_op():
    llm = models.from_function(lambda p: p, name="echo")
    with pytest.raises(outlines.GraphBuildError, match="echo.*max_tokens"):
        llm("x", max_tokens=0)


def test_unbound_inputs_are_all_listed():
    a, b, c = outlines.string("alpha"), outlines.string("beta"), outlines.string("gamma")
    with pytest.raises(outlines.UnboundInputError) as info:
        (a + b + c).eval({"beta": "x"})
    assert "'alpha'" in str(info.value) and "'gamma'" in str(info.value) and "beta" not in str(info.value)
    assert info.value.names == ["alpha", "gamma"]


def test_givens_by_variable_or_name_and_bad_keys():
    q = outlines.string("q")
    assert (q + "!").eval({q: "a"}) == (q + "!").eval({"q": "a"}) == "a!"
    with pytest.raises(TypeError, match="givens keys"):
        (q + "!").eval({1: "a"})


def test_unknown_eval_option_is_rejected():
    with pytest.raises(TypeError, match="unknown evaluation option"):
        outlines.constant("x").eval(cahce=False)


def test_model_failure_names_node_and_chains_cause():
    def broken(prompt):
        raise ConnectionError("down")

    llm = models.from_function(broken, name="broken")
    node = llm("x")
    with pytest.raises(outlines.NodeError, match=r"Generate\[function:broken\].*ConnectionError: down") as info:
        node.eval(cache=False)
    assert isinstance(info.value.__cause__, ConnectionError)


def test_errors_return_keeps_other_branches():
    @outlines.fn
    def picky(x):
        if x == "bad":
            raise ValueError("no")
        return x + "!"

    llm = models.from_function(lambda p: p + "?")
    q = outlines.string("q")
    out = llm(picky(q)).eval({q: ["a", "bad", "c"]}, errors="return", cache=False)
    assert out[0] == "a!?" and out[2] == "c!?"
    assert isinstance(out[1], outlines.Failure)
    assert out[1].error_type == "UpstreamFailure" and "no" in out[1].message
    assert out[1].root.error_type == "ValueError"


def test_eval_inside_a_running_event_loop():
    q = outlines.string("q")

    async def main():
        sync_value = (q + "!").eval({q: "a"})  # helper thread, private loop
        async_value = await (q + "?").aeval({q: "b"})
        return sync_value, async_value

    assert asyncio.run(main()) == ("a!", "b?")


def test_eval_from_a_thread():
    q = outlines.string("q")
    llm = models.from_function(lambda p: p * 2)
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(llm(q).eval({q: str(i)}, cache=False))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["00", "11", "22", "33"]


def test_outlines_eval_returns_tuple_for_several_and_value_for_one():
    q = outlines.string("q")
    assert outlines.eval(q + "1", givens={q: "x"}) == "x1"
    assert outlines.eval(q + "1", q + "2", givens={q: "x"}) == ("x1", "x2")
    assert isinstance(outlines.eval(q + "1", givens={q: np.array(["a"], dtype=object)}), np.ndarray)


def test_a_constant_list_of_prompts_is_an_array():
    llm = models.from_function(lambda p: p + "!")
    out = llm(outlines.constant(["a", "b"])).eval(cache=False)
    assert list(out) == ["a!", "b!"]


def test_several_failures_leave_no_unretrieved_task_exception(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "two_failures.py"
    script.write_text(
        "import gc, outlines\n"
        "from outlines import models\n"
        "def broken(ps): raise ValueError('x')\n"
        "a = models.from_function(broken, batched=True, name='a')\n"
        "b = models.from_function(broken, batched=True, name='b')\n"
        "try:\n"
        "    outlines.eval(a('1'), b('2'), cache=False)\n"
        "except outlines.NodeError:\n"
        "    pass\n"
        "gc.collect()\n"
    )
    done = subprocess.run([sys.executable, "-X", "dev", "-W", "error", str(script)], capture_output=True, text=True,
                          env=python_env())
    assert done.returncode == 0, done.stderr
    assert "never retrieved" not in done.stderr and "destroyed" not in done.stderr


def test_eval_checks_every_pairing_before_sending_anything():
    backend = RecordingBackend(name="shapes-early")
    m = backend.model()
    q, d = outlines.string("q"), outlines.string("d")
    pairing = m(q, num_samples=3) + d
    givens = {"q": ["a", "b"], "d": ["x", "y", "z"]}
    with pytest.raises(outlines.GraphBuildError, match=r"cannot pair shapes \(2, 3\) and \(3,\)"):
        outlines.eval(pairing, givens=givens, cache=False)
    with pytest.raises(outlines.GraphBuildError, match=r"cannot pair shapes \(2, 3\) and \(3,\)"):
        asyncio.run(outlines.aeval(pairing, givens=givens, cache=False))
    with pytest.raises(outlines.GraphBuildError, match=r"cannot pair shapes \(2, 3\) and \(3,\)"):
        list(outlines.as_completed(pairing, givens=givens, cache=False))
    assert backend.batches == []  # nothing was sent
    assert outlines.eval(pairing, givens={"q": ["a", "b"], "d": ["x", "y"]}, cache=False).shape == (2, 3)


def test_eval_says_in_its_signature_one_variable_gives_a_bare_value_several_a_tuple():
    import inspect
    import typing

    from outlines.runtime import evaluate

    for function in (evaluate.eval, evaluate.aeval):
        returns = [str(inspect.signature(o).return_annotation) for o in typing.get_overloads(function)]
        assert returns == ["Any", "tuple[Any, ...]"], function
        assert "bare value" in (function.__doc__ or "")
    q = outlines.string("q")
    assert outlines.eval(q + "!", givens={"q": "hi"}) == "hi!"
    assert outlines.eval(q + "!", q + "?", givens={"q": "hi"}) == ("hi!", "hi?")
