"""Pictures' data: a trace overlays on a structurally identical graph, shapes, repeated constants."""
from __future__ import annotations

import uuid

import pytest

import outlines
from outlines import models
from outlines.graph.basic import Variable
from outlines.graph.viz.drawing import describe, structure_keys
from outlines.graph.traversal import toposort


def _build(llm, q):
    @outlines.prompt
    def solve(question):
        """Q: {{ question }}"""

    @outlines.fn
    def pick(xs):
        return xs[0]

    return pick(llm(solve(q) + " Answer:", num_samples=3))


def _llm():
    return models.from_function(lambda p: p.upper(), name="up")


def test_a_trace_of_a_program_overlays_on_a_separately_built_identical_graph():
    llm = _llm()
    program = outlines.compile(lambda q: _build(llm, q))
    with outlines.trace() as trace:
        program(uuid.uuid4().hex)  # a fresh question: no cache hits
    best = _build(llm, outlines.string("q"))  # new nodes: every label differs from the trace's
    assert not {n.label for n in describe(best).nodes if n.kind not in ("input", "constant")} & set(trace.nodes)
    drawing = describe(best, trace=trace)
    ran = [n for n in drawing.nodes if n.kind not in ("input", "constant")]
    assert len(ran) == 4 and all(n.status and n.status != ["not run"] for n in ran)
    model = next(n for n in ran if n.kind == "model")
    assert any(line.startswith("batch 1 (size 3)") for line in model.status)
    assert "not run" not in outlines.visualize(best, trace=trace, format="ascii")


def test_a_different_graph_is_not_matched():
    llm = _llm()
    q = outlines.string("q")
    with outlines.trace() as trace:
        _build(llm, q).eval({q: "hi"}, cache=False)
    other = _build(llm, q + "?")  # one more step before the prompt: everything downstream differs
    drawing = describe(other, trace=trace)
    assert [n.status for n in drawing.nodes if n.kind == "model"] == [["not run"]]


def test_structure_keys_tell_independent_draws_apart():
    llm = _llm()
    q = outlines.string("q")
    a, b = llm(q), llm(q)  # same prompt, two independent draws
    keys = structure_keys(toposort((a, b)))
    assert keys[id(a.owner)] != keys[id(b.owner)]
    again = structure_keys(toposort((llm(outlines.string("q")),)))
    assert list(again.values())[0] == keys[id(a.owner)]


def test_repeated_constants_are_written_inside_their_consumers():
    q = outlines.string("q")
    parts = [outlines.constant("You are terse.") + (q + str(i)) for i in range(5)]
    drawing = describe(*parts)
    titles = [n.title for n in drawing.nodes if n.kind == "constant"]
    assert "'You are terse.'" not in titles  # five copies: not one box each
    assert sorted(titles) == [repr(str(i)) for i in range(5)]  # the distinct ones keep their boxes
    concats = [n for n in drawing.nodes if n.title == "+ (concat)" and any("You are terse" in x for x in n.lines)]
    assert len(concats) == 5 and concats[0].lines == ["0 = 'You are terse.'"]
    text = outlines.visualize(*parts, format="ascii")
    assert text.count("You are terse.") == 5 and "constant 'You are terse.'" not in text
    single = describe(outlines.constant("once") + q)
    assert [n.title for n in single.nodes if n.kind == "constant"] == ["'once'"]


def test_shapes_show_where_variables_know_them():
    questions = Variable(None, 0, "q", (3,))  # an input whose shape is known, as a Program binds it
    out = _llm()(questions, num_samples=5)
    drawing = describe(out)
    (model,) = [n for n in drawing.nodes if n.kind == "model"]
    assert "shape (3, 5)" in model.lines
    assert "shape (3, 5)" in outlines.visualize(out, format="ascii")


def test_no_shape_line_where_the_shape_is_unknown():
    out = _llm()(outlines.string("q"))  # a free input: its rank is unknown until eval
    assert out.shape is None
    assert not any(line.startswith("shape") for n in describe(out).nodes for line in n.lines)


def test_a_loop_with_a_tuple_state_draws_every_state_part_as_loop_state():
    more = outlines.fn(lambda text, steps: steps < 2, name="more")
    step = outlines.fn(lambda steps: steps + 1, name="step")
    text, steps = outlines.while_loop(more, lambda text, steps: (text + "a", step(steps)), init=("", 0), max_iter=3)
    drawing = describe(text, steps)  # the second parameter was once compared with ==, which is symbolic
    states = [box for box in drawing.nodes if box.lines == ["loop state"]]
    assert len(states) == 2 and all(box.cluster for box in states)


def test_a_call_numbered_after_another_on_the_same_prompt_shows_its_draws() -> None:
    import outlines
    from tests.fixtures.recording import RecordingBackend

    llm = RecordingBackend(name="drawn-numbers").model()
    q = outlines.string("q")
    a, b = llm("Q: " + q), llm("Q: " + q, num_samples=2)
    together = str(outlines.visualize(a, b, format="ascii"))
    assert together.count("draws 1-2") == 1 and "draws 0" not in together
    assert "draws" not in str(outlines.visualize(b, format="ascii"))  # alone, b draws 0 and 1
