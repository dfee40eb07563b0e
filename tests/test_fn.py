"""outlines.fn: elementwise broadcasting, gufunc signatures, async, keywords, errors."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

import outlines


@outlines.fn
def join(a, b, sep="-"):
    return f"{a}{sep}{b}"


def test_scalars_in_scalar_out():
    assert join("a", "b").eval() == "a-b"


def test_elementwise_pairs_lower_rank_operands_on_leading_axes():
    x, y = outlines.string("x"), outlines.string("y")
    out = join(x, y).eval({"x": ["a", "b"], "y": [["1", "2", "3"], ["4", "5", "6"]]})
    assert out.shape == (2, 3)
    assert out[1, 2] == "b-6" and out[0, 2] == "a-3"  # each x with its own row of y
    # The givens' shapes are checked before anything runs, as a Program checks its inputs'.
    with pytest.raises(outlines.GraphBuildError, match=r"join#\d+: .*cannot pair shapes \(2,\) and \(3, 2\)"):
        join(x, y).eval({"x": ["a", "b"], "y": [["1", "2"]] * 3})


def test_keyword_arguments_are_inputs_too():
    x = outlines.string("x")
    out = join(x, "z", sep=outlines.string("s")).eval({"x": ["a", "b"], "s": "+"})
    assert list(out) == ["a+z", "b+z"]


def test_gufunc_signature_reduces_core_dimension():
    @outlines.fn(signature="(n)->()")
    def count_a(xs):
        assert isinstance(xs, np.ndarray) and xs.ndim == 1
        return sum(x == "a" for x in xs)

    x = outlines.string("x")
    assert count_a(x).eval({"x": ["a", "b", "a"]}) == 2
    out = count_a(x).eval({"x": [["a", "a"], ["b", "a"], ["b", "b"]]})
    assert list(out) == [2, 1, 0]


def test_gufunc_signature_with_core_output():
    @outlines.fn(signature="()->(k)")
    def letters(word):
        return list(word[:2])

    out = letters(outlines.string("w")).eval({"w": ["ab", "cd", "ef"]})
    assert out.shape == (3, 2) and out[2, 1] == "f"


def test_multiple_outputs_from_a_signature():
    @outlines.fn(signature="()->(),()")
    def split(word):
        return word[0], word[1:]

    head, tail = split(outlines.string("w"))
    assert outlines.eval(head, tail, givens={"w": ["abc", "xy"]})[1].tolist() == ["bc", "y"]


def test_async_functions_run_concurrently_per_element():
    @outlines.fn
    async def slow_upper(text):
        await asyncio.sleep(0.2)
        return text.upper()

    start = time.perf_counter()
    out = slow_upper(outlines.string("t")).eval({"t": ["a", "b", "c", "d", "e"]})
    assert list(out) == ["A", "B", "C", "D", "E"]
    assert time.perf_counter() - start < 0.6


def test_python_values_pass_through():
    @outlines.fn
    def length(x):
        return len(x)

    @outlines.fn
    def words(text):
        return text.split()

    assert length(words("a b c")).eval() == 3


def test_wrong_arity_is_a_build_error_naming_the_function():
    with pytest.raises(outlines.GraphBuildError, match="fn join:.*missing"):
        join("a")
    with pytest.raises(outlines.GraphBuildError, match="fn join:.*unexpected keyword"):
        join("a", "b", nope=1)


def test_invalid_signature_is_rejected():
    with pytest.raises(outlines.GraphBuildError, match="invalid gufunc signature"):
        outlines.fn(lambda x: x, signature="n->")


def test_an_exception_names_the_node_and_op_and_is_chained():
    @outlines.fn
    def explode(x):
        raise ValueError(f"bad value {x}")

    node = explode("boom")
    with pytest.raises(outlines.NodeError) as info:
        node.eval()
    message = str(info.value)
    assert node.owner.label in message and "explode" in message and "bad value boom" in message
    assert isinstance(info.value.__cause__, ValueError)


def test_blocking_functions_run_off_the_event_loop():
    @outlines.fn(blocking=True)
    def sleepy(x):
        time.sleep(0.3)
        return x

    a, b = sleepy("a"), sleepy("b")
    start = time.perf_counter()
    assert outlines.eval(a, b) == ("a", "b")
    assert time.perf_counter() - start < 0.5


def test_fast_functions_are_measured_and_then_run_inline(fresh_state):
    threads = []

    @outlines.fn
    def tiny(x):
        threads.append(threading.current_thread().name)
        return x

    node = tiny("a")
    attributes = dict(vars(tiny))
    node.eval()  # not measured yet: in the thread pool
    mean = fresh_state.timings.mean(tiny)
    assert mean is not None and mean < 0.01  # the process state learned it
    node.eval()  # known fast: on the event loop's thread
    assert threads[0].startswith("outlines") and threads[1] == threading.current_thread().name
    assert vars(tiny).keys() == attributes.keys()  # the step itself holds no timing: nothing set on it
    assert all(vars(tiny)[name] is value for name, value in attributes.items())
    with outlines.common.config.using_process_state():  # a new process knows nothing of it: the pool again
        node.eval()
    assert threads[2].startswith("outlines")


def test_a_one_argument_call_builds_the_node_the_general_rule_gives():
    """The common call (one positional argument, op made) pairs shapes and rows as ``align`` and ``any`` do."""
    from outlines.graph.shapes import align

    @outlines.fn
    def mark(x):
        return f"<{x}>"

    @outlines.fn(signature="()->(n)")
    def letters(text):
        return list(text)

    mark("warm")  # the first call makes the op: the rest take the common path
    free, rows = outlines.string("x"), letters(outlines.string("y"))
    for argument in (free, "text", np.array(["a", "b"], dtype=object), ["a", "list"], rows, mark(free)):
        node = mark(argument).owner
        (given,) = node.inputs
        assert given is argument if isinstance(argument, outlines.Variable) else given.value is argument
        assert node.outputs[0].shape == align("mark", [given.shape])
        assert node.outputs[0].ragged is any([given.ragged])
    assert mark(mark("a")).eval() == "<<a>>"
    assert mark(rows).eval({"y": ["ab", "c"]}).tolist() == [["<a>", "<b>"], ["<c>"]]


def test_a_chain_of_scalar_steps_returns_failures_named_by_their_nodes():
    @outlines.fn
    def check(x):
        if x == "bad":
            raise ValueError("bad input")
        return x + "."

    first = check(outlines.string("x"))
    second = check(first)
    assert second.eval({"x": "ok"}, cache=False) == "ok.."
    failure = second.eval({"x": "bad"}, cache=False, errors="return")
    assert isinstance(failure, outlines.Failure)
    assert failure.node == second.owner.label and failure.upstream.node == first.owner.label
    assert failure.upstream.error_type == "ValueError"
