"""Variables, Constants, Apply and Op: identity, equality, symbolic guards."""
from __future__ import annotations

import numpy as np
import pytest

import outlines
from outlines.graph import Apply, Constant, Op, SymbolicValueError, Variable
from outlines.graph.ops import Concat, Stack


class Scale(Op):
    __props__ = ("factor",)

    def __init__(self, factor):
        self.factor = factor

    def perform(self, x):
        return x * self.factor


def test_op_equality_and_hash_come_from_params():
    assert Scale(2) == Scale(2) and hash(Scale(2)) == hash(Scale(2))
    assert Scale(2) != Scale(3)
    assert Concat() == Concat() and Stack(2) != Stack(3)


def test_apply_links_outputs_to_owner_in_creation_order():
    x = outlines.string("x")
    y = Scale(2)(x)
    z = Scale(3)(y)
    assert isinstance(y.owner, Apply) and y.owner.inputs == (x,)
    assert y.owner.outputs[0] is y and y.index == 0
    assert y.owner.order < z.owner.order


def test_non_variables_become_constants():
    y = Scale(2)(5)
    (c,) = y.owner.inputs
    assert isinstance(c, Constant) and c.value == 5


@pytest.mark.parametrize(
    "action, words",
    [
        (bool, "truth value"),
        (iter, "Iterating"),
        (len, "len()"),
        (lambda v: [0, 1][v], "index"),
    ],
)
def test_symbolic_values_refuse_concrete_use(action, words):
    x = outlines.string("question")
    with pytest.raises(SymbolicValueError) as info:
        action(x)
    assert words in str(info.value) and "symbolic" in str(info.value) and "eval" in str(info.value)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize(
    "build",
    [
        lambda q: f"Answer this: {q}",
        lambda q: f"Answer this: {q!s}",
        lambda q: f"{q:>20}",
        lambda q: format(q),
        lambda q: "Answer this: {}".format(q),
        lambda q: "Answer this: %s" % q,
        lambda q: "Answer this: %s" % (q,),
        lambda q: "Answer this: %(q)s" % {"q": q},
    ],
    ids=["f-string", "f-string !s", "f-string spec", "format()", "str.format", "% one", "% tuple", "% mapping"],
)
def test_formatting_a_variable_into_text_raises_and_says_what_to_write(build):
    q = outlines.string("q")
    with pytest.raises(SymbolicValueError) as info:
        build(q)
    message = str(info.value)
    assert "Variable('q')" in message and "@outlines.prompt" in message and "+" in message
    assert '"Answer this: " + q' in message and "{{ q }}" in message


def test_percent_assignment_raises_too():
    q = outlines.string("q")
    text = "Answer this: %s"
    with pytest.raises(SymbolicValueError):
        text %= q


def test_repr_print_and_logging_still_show_a_variable(capsys, caplog):
    import logging

    q = outlines.string("q")
    print(q, [q])
    assert capsys.readouterr().out == "Variable('q') [Variable('q')]\n"
    assert repr(q) == str(q) == "Variable('q')" and f"{q!r}" == "Variable('q')"
    with caplog.at_level(logging.INFO):
        logging.getLogger("user").info("built %s", q)
    assert caplog.records[-1].getMessage() == "built Variable('q')"


def test_if_on_a_variable_is_a_type_error():
    x = outlines.string("x")
    with pytest.raises(TypeError):
        if x:  # noqa: SIM108
            pass


def test_string_concatenation_builds_nodes():
    q = outlines.string("q")
    s = "Q: " + q + "?"
    assert isinstance(s, Variable)
    assert s.eval({"q": "why"}) == "Q: why?"
    assert (q + q).eval({q: "ab"}) == "abab"


def _shape_of_node(variable):
    node = variable.owner
    return (node.op, [type(v) for v in node.inputs], [getattr(v, "value", v) for v in node.inputs],
            variable.shape, variable.ragged)


def test_adding_text_builds_the_node_the_general_path_builds():
    # ``v + "a"`` skips conversion and checks (the common case); Concat()(v, "a") takes the general path
    q = outlines.string("q")
    for fast, general in [(q + "a", Concat()(q, "a")), ("a" + q, Concat()("a", q))]:
        before = general.owner.order
        assert _shape_of_node(fast)[0] == Concat()
        assert _shape_of_node(fast)[1:] == (
            [type(v) for v in general.owner.inputs],
            [getattr(v, "value", v) for v in general.owner.inputs],
            general.shape, general.ragged,
        )
        assert fast.owner.order < before  # built first, numbered first
    rows = outlines.constant(np.array(["x", "y"], dtype=object)) + outlines.constant("-")
    assert (rows + "!").shape == (2,)  # a Variable of shape (2,) keeps it through the fast path
    assert list((rows + "!").eval()) == ["x-!", "y-!"]
    with pytest.raises(outlines.GraphBuildError, match="Concat.*must be a string.*int"):
        outlines.constant(3) + "a"  # noqa: B018 - a Constant operand still takes the checked path


def test_concatenating_a_non_string_constant_is_rejected_at_build_time():
    q = outlines.string("q")
    with pytest.raises(outlines.GraphBuildError, match="Concat.*must be a string.*int"):
        q + 3  # noqa: B018


def test_labels_and_reprs_are_short():
    q = outlines.string("question")
    assert "question" in repr(q)
    y = q + "!"
    assert "Concat" in y.label and "Concat" in repr(y)
    assert len(Constant("x" * 100).label) <= 24


def test_as_object_array_keeps_each_value_and_nested_shapes() -> None:
    from outlines.graph.basic import as_object_array

    texts = as_object_array(["a", "b", "c"])
    assert texts.dtype == object and texts.shape == (3,) and texts.tolist() == ["a", "b", "c"]
    mixed = as_object_array(("a", 1, None))
    assert mixed.tolist() == ["a", 1, None] and mixed.shape == (3,)
    nested = as_object_array([["a", "b"], ["c", "d"]])
    assert nested.shape == (2, 2) and nested[1, 0] == "c"
    assert as_object_array([]).shape == (0,)


def test_a_node_reading_the_one_output_of_another_shares_its_outputs_tuple_as_inputs() -> None:
    """One container less per node of a chain for the garbage collector; the inputs are the same Variables."""
    first = outlines.fn(str.upper, name="up")(outlines.string("q"))
    second = outlines.fn(str.lower, name="down")(first)
    assert second.owner.inputs is first.owner.outputs and second.owner.inputs == (first,)
    both = outlines.fn(lambda a, b: a + b, name="both")(first, first)
    assert both.owner.inputs == (first, first) and both.owner.inputs is not first.owner.outputs
    assert outlines.eval(second, givens={"q": "Hi"}, cache=False) == "hi"
