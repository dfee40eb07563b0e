"""Building control-flow nodes: tracing once, captured outer Variables, build-time errors."""
from __future__ import annotations

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.common.errors import GraphBuildError
from outlines.graph.control import Cond, WhileLoop
from outlines.graph.traversal import graph_inputs

grow = outlines.fn(lambda s: s + "a", name="grow")
short = outlines.fn(lambda s: len(s) < 3, name="short")


def test_while_loop_traces_cond_and_body_once() -> None:
    calls = {"cond": 0, "body": 0}

    def cond(s):  # noqa: ANN001, ANN202
        calls["cond"] += 1
        return short(s)

    def body(s):  # noqa: ANN001, ANN202
        calls["body"] += 1
        return grow(s)

    out = outlines.while_loop(cond, body, init="", max_iter=4)
    assert calls == {"cond": 1, "body": 1}
    assert isinstance(out.owner.op, WhileLoop)
    assert out.owner.label.startswith("while_loop#")


def test_outer_variables_become_inputs_of_the_loop_node() -> None:
    question = outlines.string("question")
    hint = question + "?"  # an earlier result, computed once outside the loop
    llm = models.from_function(lambda p: p, name="echo")
    out = outlines.while_loop(short, lambda s: s + llm(hint + s), init="", max_iter=2)
    node = out.owner
    assert node.inputs[1] is hint  # state first, then what the body captures
    assert [v.name for v in graph_inputs([out])] == ["question"]
    body = node.op.body
    assert len(body.stand_ins) == 1 and all(v.owner is None for v in body.stand_ins)
    assert hint.owner not in body.nodes  # the body's private graph stops at the slot


def test_tuple_state_keeps_its_structure() -> None:
    step = outlines.fn(lambda n: n + 1, name="step")
    below = outlines.fn(lambda n: n < 3, name="below")
    text, count = outlines.while_loop(lambda s, n: below(n), lambda s, n: (grow(s), step(n)), init=("", 0), max_iter=9)
    assert text.owner is count.owner and len(text.owner.outputs) == 2
    assert outlines.eval(text, count) == ("aaa", 3)


@pytest.mark.parametrize("max_iter", [0, -1, 2.5, True, None])
def test_max_iter_must_be_a_positive_integer(max_iter: object) -> None:
    with pytest.raises(GraphBuildError, match=r"while_loop\(cond=short, body=grow\): max_iter"):
        outlines.while_loop(short, grow, init="", max_iter=max_iter)  # type: ignore[arg-type]


@pytest.mark.parametrize("on_max_iter", ["raise", "Keep", None])
def test_on_max_iter_is_keep_or_fail(on_max_iter: object) -> None:
    with pytest.raises(GraphBuildError, match=r"while_loop\(cond=short, body=grow\): on_max_iter must be 'keep' or "
                                              r"'fail'"):
        outlines.while_loop(short, grow, init="", max_iter=2, on_max_iter=on_max_iter)  # type: ignore[arg-type]


def test_max_iter_is_required() -> None:
    with pytest.raises(TypeError, match="max_iter"):
        outlines.while_loop(short, grow, init="")  # type: ignore[call-arg]


def test_body_of_the_wrong_structure_is_named() -> None:
    with pytest.raises(GraphBuildError, match=r"while_loop\(.*body returned 2 value\(s\); it must return 1"):
        outlines.while_loop(short, lambda s: (grow(s), grow(s)), init="", max_iter=2)
    with pytest.raises(GraphBuildError, match="body returned 1 value"):
        outlines.while_loop(lambda s, n: short(s), lambda s, n: grow(s), init=("", ""), max_iter=2)
    with pytest.raises(GraphBuildError, match="cond returned 2 value"):
        outlines.while_loop(lambda s: (short(s), short(s)), grow, init="", max_iter=2)


def test_body_or_cond_that_ignore_the_state_are_errors() -> None:
    q = outlines.string("q")
    with pytest.raises(GraphBuildError, match="body does not depend on the state"):
        outlines.while_loop(short, lambda s: grow(q), init="", max_iter=2)
    with pytest.raises(GraphBuildError, match="cond does not depend on the state"):
        outlines.while_loop(lambda s: short(q), grow, init="", max_iter=2)
    with pytest.raises(GraphBuildError, match="cond does not depend on the state"):
        outlines.while_loop(lambda s: True, grow, init="", max_iter=2)


def test_python_branching_on_the_state_is_explained() -> None:
    def body(s):  # noqa: ANN001, ANN202
        return s + "a" if s else s

    with pytest.raises(GraphBuildError, match="traced once over symbolic values.*outlines.cond"):
        outlines.while_loop(short, body, init="", max_iter=2)


def test_cond_branches_must_agree_and_where_builds_one_node() -> None:
    q = outlines.string("q")
    with pytest.raises(GraphBuildError, match="both branches must return the same structure"):
        outlines.cond(short(q), lambda s: s, lambda s: (s, s), q)
    out = outlines.cond(short(q), lambda s: s + "!", lambda s: s + "?", q)
    assert isinstance(out.owner.op, Cond)
    picked = outlines.where(short(q), q, "long")
    assert picked.owner.op.name == "Where"


def test_a_non_boolean_condition_fails_naming_the_loop() -> None:
    label = outlines.fn(lambda s: "yes", name="label")
    out = outlines.while_loop(label, grow, init="", max_iter=2)
    with pytest.raises(outlines.NodeError, match=r"while_loop#\d+: cond: the condition must be a boolean per element, got str"):
        out.eval()
    with pytest.raises(outlines.NodeError, match="where: the condition must be a boolean"):
        outlines.where(label(outlines.constant("x")), "a", "b").eval()


def test_pictures_draw_the_body_as_a_cluster() -> None:
    question = outlines.string("question")
    llm = models.from_function(lambda p: p, name="echo")
    out = outlines.while_loop(short, lambda s: s + llm(question + s), init="", max_iter=3)
    label = out.owner.label
    text = outlines.visualize(out, format="ascii")
    assert f"op       while_loop  max_iter=3  => output" in text
    assert f"model    function: echo {{A}}  (in {label} body)" in text
    assert "input    s  (in " in text  # the state parameter, inside the cluster
    mermaid = outlines.visualize(out, format="mermaid")
    assert f'subgraph body0 ["{label.replace("#", "&num;")} body"]' in mermaid
    assert '-->|"cond"|' in mermaid and '-->|"body"|' in mermaid
    assert "input    question  input" in text  # captured: drawn once, outside, feeding the body


def test_conditions_that_are_text_by_construction_are_build_errors() -> None:
    llm = models.from_function(lambda p: p, name="echo")
    with pytest.raises(GraphBuildError, match=r"while_loop\(.*cond must be a boolean per element, but it is text from "
                                              r"Generate\[function:echo\]"):
        outlines.while_loop(lambda s: llm(s), grow, init="", max_iter=2)
    with pytest.raises(GraphBuildError, match="cond must be a boolean per element, but it is text from Concat"):
        outlines.while_loop(lambda s: s + "?", grow, init="", max_iter=2)
    q = outlines.string("q")
    with pytest.raises(GraphBuildError, match=r"cond: pred must be a boolean per element, but it is the constant 'yes'"):
        outlines.cond("yes", lambda s: s, lambda s: s, q)


def test_a_body_that_adds_a_samples_axis_is_a_build_error() -> None:
    llm = models.from_function(lambda p: p, name="echo")
    with pytest.raises(GraphBuildError, match=r"body output 0 adds an axis \(num_samples=3\)"):
        outlines.while_loop(short, lambda s: llm(s, num_samples=3), init="", max_iter=2)


# -- kin: loops and conds traced from the same code stack ------------------------------------------

_pure_grow = outlines.fn(lambda s: s + "a", name="pure_grow", pure=True)
_pure_short = outlines.fn(lambda s: len(s) < 3, name="pure_short", pure=True)


def _loop(init: object, body: object = None, max_iter: int = 4) -> object:
    return outlines.while_loop(_pure_short, body or _pure_grow, init=init, max_iter=max_iter)


def test_loops_traced_from_the_same_code_share_their_kin_and_stack() -> None:
    a, b = _loop(outlines.constant("x")), _loop(outlines.constant("y"))
    assert a.owner.op != b.owner.op  # each while_loop call is its own op
    assert a.owner.op.kin == b.owner.op.kin and hash(a.owner.op.kin) == hash(b.owner.op.kin)
    assert a.owner.op.stacked() is a.owner.op


@pytest.mark.parametrize("other", ["max_iter", "body", "constant"])
def test_loops_of_another_structure_have_another_kin(other: str) -> None:
    base = _loop(outlines.constant("x")).owner.op
    if other == "max_iter":
        changed = _loop(outlines.constant("x"), max_iter=5)
    elif other == "body":
        changed = _loop(outlines.constant("x"), body=lambda s: _pure_grow(_pure_grow(s)))
    else:
        changed = _loop(outlines.constant("x"), body=lambda s: s + "b")
    assert changed.owner.op.kin != base.kin


def test_loops_that_cannot_stack_are_their_own_kin() -> None:
    llm = models.from_function(lambda p: p + ".", name="kin")
    impure = outlines.fn(lambda s: s + "a", name="impure")
    nested = lambda s: _loop(s, max_iter=2)  # noqa: E731
    constant_prompt = lambda s: _pure_grow(s) + llm(outlines.constant("always the same"))  # noqa: E731
    for body in (impure, nested, constant_prompt, lambda s: llm(s, num_samples=2)[0]):
        op = _loop(outlines.constant("x"), body=body).owner.op
        assert op.kin is op and op.stacked() is None
    assert _loop(outlines.constant("x"), body=lambda s: llm(s)).owner.op.stacked() is not None


def test_conds_traced_from_the_same_code_share_their_kin() -> None:
    def branch(x: object) -> object:
        return outlines.cond(_pure_short(x), lambda s: s + "!", lambda s: s + "?", x)

    a, b = branch(outlines.constant("x")), branch(outlines.constant("yyyy"))
    assert a.owner.op.kin == b.owner.op.kin and a.owner.op.stacked() is not None
    other = outlines.cond(_pure_short(outlines.constant("x")), lambda s: s + "?", lambda s: s + "!", "x")
    assert other.owner.op.kin != a.owner.op.kin


def test_control_nodes_over_scalars_give_scalars() -> None:
    assert _loop(outlines.constant("x")).shape == ()
    assert _loop(outlines.string("q")).shape is None  # unknown until bound
    assert outlines.cond(_pure_short(outlines.constant("x")), lambda s: s + "!", lambda s: s + "?", "x").shape == ()
    kept = outlines.cond(_pure_short(outlines.constant("x")), lambda s: s + "!", lambda s: outlines.stack([s, s]), "x")
    assert kept.shape is None  # a branch adds an axis: not a scalar


def test_control_nodes_join_build_time_families_by_their_structure() -> None:
    loops = [_loop(outlines.constant(f"x{i}")).owner for i in range(3)]  # one op each, one structure
    assert len({id(node.op) for node in loops}) == 3 and loops[0].family is not None
    assert all(node.family is loops[0].family for node in loops)
    assert [node.rank - loops[0].rank for node in loops] == [0, 1, 2]  # (a root family lives on while its graphs do)
    assert _loop(outlines.constant(np.array(["a", "b"], dtype=object))).owner.family is None  # over one element each
