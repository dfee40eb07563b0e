"""Names in ``givens`` that the graph does not have are said, not ignored silently."""
from __future__ import annotations

import warnings

import pytest

import outlines


def test_an_unknown_name_warns_naming_it_and_the_inputs() -> None:
    question, context = outlines.string("question"), outlines.string("context")
    with pytest.warns(UserWarning, match=r"does not have, ignored: 'temperture' \(its inputs: 'context', 'question'\)"):
        value = (question + context).eval({"question": "a", "context": "b", "temperture": 0.3}, cache=False)
    assert value == "ab"


def test_a_misspelt_name_warns_and_the_missing_input_raises() -> None:
    question = outlines.string("question")
    with pytest.warns(UserWarning, match="'qestion'"), pytest.raises(outlines.UnboundInputError, match="question"):
        (question + "?").eval({"qestion": "a"}, cache=False)


def test_known_names_and_variable_keys_are_quiet() -> None:
    question, other = outlines.string("question"), outlines.string("other")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (question + "?").eval({question: "a", other: "unused"}, cache=False) == "a?"
        assert (question + "?").eval({"question": "a"}, cache=False) == "a?"


def test_explain_warns_on_an_unknown_name_but_not_on_inputs_left_unknown() -> None:
    question, context = outlines.string("question"), outlines.string("context")
    llm = outlines.models.from_function(lambda p: p, name="echo", temperature=0)
    call = llm(question + context)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a partial binding is what explain is for
        assert outlines.explain(call, givens={"question": "a"}, cache=False).unknown_nodes
    with pytest.warns(UserWarning, match=r"ignored: 'contxt' \(its inputs: 'context', 'question'\)"):
        outlines.explain(call, givens={"question": "a", "contxt": "b"}, cache=False)
