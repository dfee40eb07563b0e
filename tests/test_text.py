"""Prompt templates, string inputs and text.function."""
from __future__ import annotations

import numpy as np
import pytest

import outlines
from outlines import models


@outlines.prompt
def qa(question, style="short"):
    """Answer in a {{ style }} way.
        Q: {{ question }}
    A:"""


def test_prompt_cleans_indentation_and_renders():
    out = qa("2+2?").eval(cache=False)
    assert out == "Answer in a short way.\n    Q: 2+2?\nA:"
    assert qa.render("x", style="long").startswith("Answer in a long way.")


def test_prompt_is_lazy_and_symbolic():
    q = outlines.string("q")
    rendered = qa(q)
    assert isinstance(rendered, outlines.Variable)
    assert rendered.eval({"q": "why"}).endswith("Q: why\nA:")


def test_prompt_broadcasts_over_arrays():
    q = outlines.string("q")
    out = qa(q, style=outlines.string("s")).eval({"q": ["a", "b"], "s": "terse"})
    assert isinstance(out, np.ndarray) and out.shape == (2,)
    assert out[1].startswith("Answer in a terse way.") and "Q: b" in out[1]


def test_list_arguments_stay_lists_inside_templates():
    @outlines.prompt
    def few_shot(examples, question):
        """{% for e in examples %}- {{ e }}
        {% endfor %}Q: {{ question }}"""

    out = few_shot(["one", "two"], outlines.string("q")).eval({"q": "three"})
    assert out == "- one\n- two\nQ: three"


def test_unknown_template_variable_is_rejected_at_decoration():
    with pytest.raises(outlines.GraphBuildError, match="bad_prompt.*answer.*not parameter"):

        @outlines.prompt
        def bad_prompt(question):
            """{{ question }} {{ answer }}"""


def test_template_syntax_error_names_the_prompt():
    with pytest.raises(outlines.GraphBuildError, match="broken.*syntax"):

        @outlines.prompt
        def broken(x):
            """{{ x """


def test_empty_docstring_is_rejected():
    with pytest.raises(outlines.GraphBuildError, match="empty"):

        @outlines.prompt
        def nothing(x):
            pass


def test_prompt_arity_errors_name_the_prompt():
    with pytest.raises(outlines.GraphBuildError, match="qa"):
        qa()
    with pytest.raises(outlines.GraphBuildError, match="qa"):
        qa("a", "b", "c")


def test_text_function_chains_prompt_model_parser_on_arrays():
    upper = models.from_function(lambda p: p.upper(), name="upper")

    @outlines.prompt
    def say(word):
        """say {{ word }}"""

    shout = outlines.text.function(say, upper, parser=lambda s: s.split()[-1])
    assert shout("hi").eval(cache=False) == "HI"
    out = shout(outlines.string("w")).eval({"w": ["a", "b", "c"]}, cache=False)
    assert list(out) == ["A", "B", "C"]


def test_constant_holds_any_value():
    assert outlines.constant(3).eval() == 3


def test_an_array_list_argument_arrives_as_a_list_per_row():
    @outlines.prompt
    def judge(task, candidates):
        """{{ task }}:{% for c in candidates %} [{{ c }}]{% endfor %} n={{ candidates | length }}"""

    task, candidates = outlines.string("task"), outlines.string("candidates")
    out = judge(task, candidates).eval({task: ["t0", "t1"], candidates: [["a", "bc"], ["d", "ef"]]})
    assert out.tolist() == ["t0: [a] [bc] n=2", "t1: [d] [ef] n=2"]  # never the characters of "bc"
    assert outlines.text.list_arguments(judge.source) == {"candidates"}


def test_a_list_argument_pairs_its_rows_with_leading_axes_of_other_arguments():
    @outlines.prompt
    def listing(items, prefix):
        """{{ prefix }}{{ items | join("+") }}"""

    items = outlines.constant(np.array([["a", "b"], ["c", "d"], ["e", "f"]], dtype=object))
    assert listing(items, "p").shape == (3,)
    out = listing(items, outlines.string("p")).eval({"p": ["x", "y", "z"]})
    assert out.tolist() == ["xa+b", "yc+d", "ze+f"]


def test_a_template_may_end_with_a_newline():
    @outlines.prompt
    def line(x):
        """{{ x }}

        """

    @outlines.prompt
    def plain(x):
        """{{ x }}
        """

    assert line("a").eval() == "a\n" and plain("a").eval() == "a"


def test_comparing_a_variable_in_python_code_is_an_error_not_false():
    best = outlines.string("best")
    with pytest.raises(TypeError, match="symbolic"):
        if best == "12":
            pass


def test_a_failed_candidate_fails_only_its_own_row_with_errors_return():
    def flaky(p):
        if "t1" in p:
            raise ValueError("boom")
        return "ok " + p

    llm = models.from_function(flaky, name="flaky")

    @outlines.prompt
    def judge(task, candidates):
        """{{ task }}: {{ candidates | join(",") }}"""

    t = outlines.string("t")
    out = judge(t, llm(t, num_samples=2)).eval({t: ["t0", "t1"]}, errors="return", cache=False)
    assert out[0] == "t0: ok t0,ok t0"
    assert isinstance(out[1], outlines.Failure) and "boom" in out[1].message
