"""outlines.runtime.program: tracing once, scalar and array calls, one schedule for arrays."""
from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

import outlines
from outlines import models
from tests.fixtures.recording import RecordingBackend


def answer(prompt: str) -> str:
    return f"answer to {prompt}"


@outlines.prompt
def ask(question):
    """Q: {{ question }}"""


def test_traced_once_called_many_times():
    traced = []

    def program(question):
        traced.append(question)
        return ask(question) + "!"

    prog = outlines.compile(program)
    assert prog("a") == "Q: a!" and prog(question="b") == "Q: b!"
    assert len(traced) == 1
    assert [v.name for v in prog.inputs] == ["question"]
    assert isinstance(prog.outputs, outlines.Variable)


def test_array_call_is_one_backend_call_for_100_elements():
    rec = RecordingBackend(answer)
    llm = rec.model()
    prog = outlines.compile(lambda question: llm(ask(question)), cache=False)
    out = prog([f"q{i}" for i in range(100)])
    assert isinstance(out, np.ndarray) and out.shape == (100,)
    assert out[7] == "answer to Q: q7"
    assert len(rec.batches) == 1 and len(rec.batches[0]) == 100


def test_decorator_and_samples_with_majority_vote():
    llm = models.from_function(lambda p: p[-1], name="last")

    @outlines.fn(signature="(n)->()")
    def majority(xs):
        return Counter(xs).most_common(1)[0][0]

    @outlines.compile
    def vote(question):
        return majority(llm(ask(question), num_samples=3))

    assert vote("abc") == "c"
    assert list(vote(("xy", "zw"))) == ["y", "w"]
    assert isinstance(vote, outlines.Program)


def test_inputs_outputs_form_and_several_outputs():
    a, b = outlines.string("a"), outlines.string("b")
    prog = outlines.compile([a, b], [a + b, b + a])
    assert prog("x", "y") == ("xy", "yx")
    assert prog(b="1", a="2") == ("21", "12")


def test_acall_on_the_running_loop():
    prog = outlines.compile(lambda text: text + "?")
    assert asyncio.run(prog.acall("ok")) == "ok?"


def test_argument_errors():
    prog = outlines.compile(lambda a, b: a + b)
    with pytest.raises(outlines.UnboundInputError, match="'b'"):
        prog("x")
    with pytest.raises(TypeError, match="takes 2 argument"):
        prog("x", "y", "z")
    with pytest.raises(TypeError, match="unexpected argument 'c'"):
        prog("x", "y", c="z")
    with pytest.raises(TypeError, match="multiple values"):
        prog("x", a="y")
    with pytest.raises(outlines.GraphBuildError, match="name each input"):
        outlines.compile(lambda *args: args[0])


def test_with_options_returns_failures():
    @outlines.fn
    def fragile(x):
        if x == "b":
            raise RuntimeError("nope")
        return x

    prog = outlines.compile(lambda x: fragile(x))
    with pytest.raises(outlines.NodeError, match="fragile"):
        prog(["a", "b"])
    out = prog.with_options(errors="return")(["a", "b"])
    assert out[0] == "a" and isinstance(out[1], outlines.Failure)


@outlines.prompt
def judge(task, candidates):
    """Task: {{ task }}
    {% for c in candidates %}- {{ c }}
    {% endfor %}"""


def test_judge_pairs_each_task_with_its_own_samples_when_t_equals_k():
    # NumPy's trailing alignment paired task 2 with task 1's answers here (T = k = 3)
    model = RecordingBackend(answer, name="answers").model()

    @outlines.compile
    def best_of(task):
        return judge(task, model(ask(task), num_samples=3))

    prompts = best_of(["t0", "t1", "t2"])
    assert prompts.shape == (3,)
    for i, text in enumerate(prompts):
        assert text.count(f"answer to Q: t{i}") == 3 and text.startswith(f"Task: t{i}\n"), text


def test_shapes_of_a_program_are_checked_at_call_time():
    model = RecordingBackend(answer, name="answers").model()

    @outlines.fn
    def pair(a, b):
        return a + b

    prog = outlines.compile(lambda task, hint: pair(model(task, num_samples=2), hint))
    assert prog(["a", "b", "c"], ["x", "y", "z"]).shape == (3, 2)
    with pytest.raises(outlines.GraphBuildError, match=r"cannot pair shapes \(3, 2\) and \(2,\)"):
        prog(["a", "b", "c"], ["x", "y"])
