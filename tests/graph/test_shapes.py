"""outlines.graph.shapes and the array ops: leading-axis pairing, static shapes, indexing."""
from __future__ import annotations

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.graph.shapes import align
from tests.fixtures.recording import RecordingBackend


@outlines.fn
def join(a, b):
    return f"{a}-{b}"


def test_lower_rank_shapes_align_on_leading_axes():
    assert align("f", [(3,), (3, 2)]) == (3, 2)
    assert align("f", [(), (3, 2)]) == (3, 2)
    assert align("f", [(3, 1), (1, 4)]) == (3, 4)
    assert align("f", [(3,), (3, None)]) == (3, None)
    assert align("f", [(3,), None]) is None
    with pytest.raises(outlines.GraphBuildError, match=r"f: cannot pair shapes \(2,\) and \(3, 2\).*LEADING"):
        align("f", [(2,), (3, 2)])


def test_samples_pair_with_their_own_row_even_when_t_equals_k():
    model = models.from_function(lambda p: "ans(" + p + ")", name="answers")
    task = outlines.string("task")
    candidates = model(task, num_samples=3)
    paired = join(task, candidates).eval({task: ["t0", "t1", "t2"]}, cache=False)
    assert paired.shape == (3, 3)
    for i in range(3):
        assert all(x == f"t{i}-ans(t{i})" for x in paired[i]), paired[i]


def test_shapes_are_known_when_the_inputs_are():
    model = models.from_function(lambda p: p, name="echo")
    tasks = outlines.constant(np.array(["a", "b"], dtype=object))
    samples = model(tasks, num_samples=4)
    assert samples.shape == (2, 4) and samples.ndim == 2 and len(samples) == 2
    assert join(tasks, samples).shape == (2, 4)
    assert outlines.string("free").shape is None and outlines.string("free").ndim is None
    with pytest.raises(outlines.GraphBuildError, match=r"cannot pair shapes \(3,\) and \(2, 4\)"):
        join(outlines.constant(np.array(["x", "y", "z"], dtype=object)), samples)


def test_a_mismatch_in_a_program_is_a_build_error_before_any_call():
    log = RecordingBackend(lambda p: p, name="log")
    model = log.model()

    @outlines.compile
    def pair(task, other):
        return join(model(task, num_samples=2), other)

    assert pair(["a", "b"], ["x", "y"]).shape == (2, 2)
    log.batches.clear()
    with pytest.raises(outlines.GraphBuildError, match=r"cannot pair shapes \(2, 2\) and \(3,\)"):
        pair(["a", "b"], ["x", "y", "z"])
    assert log.batches == []  # refused before anything was sent


def test_indexing_reshaping_and_new_axes():
    grid = outlines.constant(np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object))
    assert grid[1].shape == (3,) and grid[1].eval().tolist() == ["d", "e", "f"]
    assert grid[:, 0].shape == (2,) and grid[:, 0].eval().tolist() == ["a", "d"]
    assert grid[0, -1].shape == () and grid[0, -1].eval() == "c"
    assert grid[..., None].shape == (2, 3, 1) and grid[..., None].eval().shape == (2, 3, 1)
    assert grid.expand_dims(0).shape == (1, 2, 3) and outlines.expand_dims(grid, -1).shape == (2, 3, 1)
    assert grid.reshape(3, -1).shape == (3, 2) and grid.reshape(-1).eval().tolist() == list("abcdef")
    with pytest.raises(outlines.GraphBuildError, match="out of bounds"):
        grid[5]
    with pytest.raises(outlines.GraphBuildError, match=r"cannot reshape \(2, 3\)"):
        grid.reshape(4, 2)
    with pytest.raises(outlines.GraphBuildError, match="too many indices"):
        grid[0, 0, 0]


def test_indexing_a_free_input_works_once_bound():
    x = outlines.string("x")
    assert x[1].eval({x: ["a", "b"]}) == "b"
    assert x[:, 0].eval({x: [["a", "b"], ["c", "d"]]}).tolist() == ["a", "c"]


def test_stack_and_concatenate_variables():
    a, b = outlines.string("a"), outlines.string("b")
    stacked = outlines.stack([a, b])
    assert stacked.eval({a: ["1", "2"], b: ["3", "4"]}).tolist() == [["1", "2"], ["3", "4"]]
    last = outlines.stack([a, b], axis=-1)
    assert last.eval({a: ["1", "2"], b: "x"}).tolist() == [["1", "x"], ["2", "x"]]
    joined = outlines.concatenate([a, b])
    assert joined.eval({a: ["1"], b: ["2", "3"]}).tolist() == ["1", "2", "3"]
    known = outlines.constant(np.array(["p", "q"], dtype=object))
    assert outlines.concatenate([known, known]).shape == (4,)
    assert outlines.stack([known, known]).shape == (2, 2)
    with pytest.raises(outlines.GraphBuildError, match="one rank"):
        outlines.concatenate([known, known[None]])


@pytest.mark.parametrize(
    "action, words",
    [
        (lambda v: v == "12", "=="),
        (lambda v: v != "12", "!="),
        (lambda v: v < "12", "<"),
        (lambda v: "1" in v, "`in`"),
    ],
)
def test_comparisons_on_variables_refuse_like_bool(action, words):
    x = outlines.string("x")
    with pytest.raises(outlines.graph.SymbolicValueError, match="symbolic") as info:
        action(x)
    assert words in str(info.value)


def test_variables_stay_usable_as_keys_and_in_lists():
    a, b = outlines.string("a"), outlines.string("b")
    table = {a: 1, b: 2}
    assert table[b] == 2 and a in table and b in {a, b}
    assert [a, b].index(a) == 0 and a in [a, b]  # identity is found first
    assert (a + b).owner.inputs[0] is a


def test_array_ops_present_themselves_in_pictures():
    from outlines.graph.viz.drawing import describe

    grid = outlines.string("grid")
    joined = outlines.concatenate([grid[:, 0], grid.reshape(-1)[1:3], grid[..., None][0, :, 0]], axis=0)
    drawing = describe(outlines.stack([joined, joined], axis=0))
    shown = {(node.title, tuple(node.lines)) for node in drawing.nodes if node.kind == "op"}
    assert shown == {
        # a reshape to (-1,) knows its rank (not its size), and so does a slice of it
        ("index [:, 0]", ()), ("reshape (-1,)", ("shape (?,)",)), ("index [1:3]", ("shape (?,)",)), ("index [..., None]", ()),
        ("index [0, :, 0]", ()), ("concatenate", ("axis=0",)), ("stack 2", ("axis=0",)),
    }


def test_plan_folds_array_ops_on_constants_and_merges_equal_ones():
    from outlines.runtime.plan import Plan

    grid = outlines.constant(np.array([["a", "b"], ["c", "d"]], dtype=object))
    plan = Plan([outlines.stack([grid[:, 1], grid.reshape(-1)[2:]], axis=0)])
    assert plan.nodes == [] and plan.outputs[0].value.tolist() == [["b", "d"], ["c", "d"]]
    free = outlines.string("free")
    plan = Plan([join(free[0], free[0]), outlines.concatenate([free[1:], free[1:]])])
    assert sorted(node.op.name for node in plan.nodes) == ["Concatenate", "Index[0]", "Index[1:]", "join"]
