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


# -- issue 27, item 7: values that are not text are an error naming input, index and type ---
@outlines.prompt
def ask(question):
    """Q: {{ question }}"""


NOT_TEXT = [None, float("nan"), np.float32("nan"), b"bytes", bytearray(b"raw")]


@pytest.mark.parametrize("bad", NOT_TEXT, ids=["None", "nan", "float32-nan", "bytes", "bytearray"])
def test_a_template_refuses_a_value_that_is_not_text_naming_the_input_index_and_type(bad) -> None:
    q = outlines.string("question")
    with pytest.raises(outlines.NodeError) as caught:
        ask(q).eval({q: ["ok", "fine", bad]}, cache=False)
    message = str(caught.value)
    assert "'question'" in message and "index 2" in message and type(bad).__name__ in message
    with pytest.raises(outlines.NodeError, match=rf"'question' is {type(bad).__name__}"):
        ask(q).eval({q: bad}, cache=False)  # a scalar: no index to name


def test_with_errors_return_only_the_bad_elements_fail_and_the_others_render_and_run() -> None:
    seen: list[str] = []

    def echo(prompts: list[str]) -> list[str]:
        seen.extend(prompts)
        return [p.upper() for p in prompts]

    llm = models.from_function(echo, batched=True, temperature=0)
    q = outlines.string("question")
    values = llm(ask(q)).eval({q: ["ok", None, float("nan"), b"x", "fine"]}, errors="return", cache=False)
    assert values[0] == "Q: OK" and values[4] == "Q: FINE" and sorted(seen) == ["Q: fine", "Q: ok"]
    for index, kind in ((1, "NoneType"), (2, "float"), (3, "bytes")):
        failure = values[index]
        assert isinstance(failure, outlines.Failure)
        assert f"index {index}" in failure.root.message and kind in failure.root.message
        assert "'question'" in failure.root.message


def test_list_argument_items_that_are_not_text_are_refused_too() -> None:
    @outlines.prompt
    def judge(task, candidates):
        """{{ task }}:{% for c in candidates %} [{{ c }}]{% endfor %}"""

    task, candidates = outlines.string("task"), outlines.string("candidates")
    values = judge(task, candidates).eval(
        {task: ["t0", "t1"], candidates: np.array([["a", "b"], ["c", None]], dtype=object)}, errors="return"
    )
    assert values[0] == "t0: [a] [b]"
    assert isinstance(values[1], outlines.Failure) and "'candidates' at index (1, 1)" in values[1].message


def test_numbers_and_booleans_still_render() -> None:
    @outlines.prompt
    def count(n, flag):
        """{{ n }} items{% if flag %}!{% endif %}"""

    n, flag = outlines.string("n"), outlines.string("flag")
    assert count(n, flag).eval({n: [3, 2.5], flag: True}).tolist() == ["3 items!", "2.5 items!"]


@pytest.mark.parametrize("bad", [None, float("nan"), b"bytes", 3])
def test_plus_refuses_a_value_that_is_not_text_naming_the_operand_index_and_type(bad) -> None:
    q = outlines.string("q")
    with pytest.raises(outlines.NodeError, match=rf"operand 1 of \+ at index 1 is {type(bad).__name__}"):
        (q + "!").eval({q: ["a", bad]}, cache=False)
    values = ("<" + q).eval({q: ["a", bad, "c"]}, errors="return", cache=False)
    assert values[0] == "<a" and values[2] == "<c"
    assert isinstance(values[1], outlines.Failure) and f"operand 2 of + at index 1 is {type(bad).__name__}" in values[1].message


def test_a_failed_input_of_a_template_with_list_arguments_is_never_rendered_into_a_prompt() -> None:
    fails_on_t1 = outlines.fn(lambda s: 1 / 0 if s == "t1" else s)

    @outlines.prompt
    def judge(task, candidates):
        """{{ task }}:{% for c in candidates %} [{{ c }}]{% endfor %}"""

    task, candidates = outlines.string("task"), outlines.string("candidates")
    values = judge(fails_on_t1(task), candidates).eval(
        {task: ["t0", "t1"], candidates: np.array([["a", "b"], ["c", "d"]], dtype=object)}, errors="return"
    )
    assert values[0] == "t0: [a] [b]"  # a Failure is falsy: it used to be rendered as "Failure at ...: [c] [d]"
    assert isinstance(values[1], outlines.Failure) and values[1].root.error_type == "ZeroDivisionError"


# -- templates rendered in bulk ---------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from outlines.text import Render, _compiled, _substitution  # noqa: E402

_TEXT = st.text(st.characters(blacklist_characters="{%#", blacklist_categories=("Cs",)), max_size=8)
_TAGS = st.sampled_from(["{{ %s }}", "{{- %s }}", "{{ %s -}}", "{{-%s-}}", "{{%s}}"])
_COMMENTS = st.sampled_from(["", "{# note #}", "{#- note -#}", "{# {{ x }} #}"])
_VALUES = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10) | st.sampled_from(
    ["{{ a }}", "}}{{", "\n", " \n\t", "{% if %}", "é✓\u2028", "", "\x00", "a\x00"]
)


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.tuples(_TEXT, _TAGS, st.sampled_from(["a", "b"]), _COMMENTS), min_size=1, max_size=4),
    tail=_TEXT,
    rows=st.lists(st.tuples(_VALUES, _VALUES), min_size=1, max_size=6),
)
def test_a_template_rendered_in_bulk_equals_jinja_byte_for_byte(pieces, tail, rows):
    source = "".join(text + tag % name + comment for text, tag, name, comment in pieces) + tail
    render = Render("bulk", source, ("a", "b"))
    assert _substitution(source, ("a", "b")) is not None  # the bulk path is the one tested
    a = np.array([r[0] for r in rows], dtype=object)
    b = np.array([r[1] for r in rows], dtype=object)
    template = _compiled(source)
    expected = [template.render({"a": x, "b": y}) for x, y in rows]
    out = render.perform(a, b)
    assert out.tolist() == expected and {type(x) for x in out.tolist()} <= {str}  # str, never np.str_
    assert render.perform(a[0], b[0]) == expected[0] and type(render.perform(a[0], b[0])) is str
    assert render.perform(a, b[0]).tolist() == [template.render({"a": x, "b": rows[0][1]}) for x, _ in rows]


def test_a_bulk_render_has_the_shape_of_every_input_and_never_aliases_one():
    rows = np.array(["x", "y"], dtype=object)
    unused = Render("unused", "hi {{ a }}", ("a", "b"))  # b only sets the shape, as per element
    assert unused.perform("s", rows).tolist() == ["hi s", "hi s"]
    grid = np.array([["p", "q"], ["r", "s"]], dtype=object)
    paired = Render("paired", "{{ b }}-{{ a }}", ("a", "b")).perform(rows, grid)  # leading axes pair
    assert paired.tolist() == [["p-x", "q-x"], ["r-y", "s-y"]]
    alone = Render("alone", "{{ a }}", ("a",)).perform(rows)
    assert alone.tolist() == ["x", "y"] and not np.shares_memory(alone, rows)
    assert Render("empty", "{# nothing #}", ("a",)).perform(rows).tolist() == ["", ""]
    assert Render("scalar", "{{ a }}{{ b }}", ("a", "b")).perform(np.array("z", dtype=object), "w")[()] == "zw"
    nul = Render("nul", "\x00{{ a }}\x00", ("a",)).perform(np.array(["", "x\x00"], dtype=object))
    assert nul.tolist() == ["\x00\x00", "\x00x\x00\x00"]  # NumPy's own text type would cut trailing NULs
    texts = Render("unicode", "x{{ a }}", ("a",)).perform(np.array(["p", "q"]))  # a NumPy str array
    assert texts.dtype == object and [type(v) for v in texts.tolist()] == [str, str] and texts.tolist() == ["xp", "xq"]


def test_a_bulk_render_in_chunks_equals_one_pass() -> None:
    rows = np.array([f"r{i}" for i in range(4)], dtype=object)
    grid = np.array([[f"g{i}{j}" for j in range(5)] for i in range(4)], dtype=object)
    with outlines.common.config.tuning(render_chunk=3):  # chunks that cut rows of the paired (4, 5) grid
        out = Render("chunks", "<{{ a }}|{{ b }}>", ("a", "b")).perform(rows, grid)
    assert out.shape == (4, 5) and out.tolist() == [[f"<r{i}|g{i}{j}>" for j in range(5)] for i in range(4)]


def test_templates_beyond_substitution_render_through_jinja():
    for source in ("{{ a | upper }}", "{% if a %}x{% endif %}", "{{ a ~ b }}", "{{ 'lit' }}", "{{ c }}"):
        assert _substitution(source, ("a", "b")) is None
    render = Render("numbers", "n={{ a }} {{ b }}", ("a", "b"))
    assert render.perform(np.array([1, 2.5], dtype=object), "x").tolist() == ["n=1 x", "n=2.5 x"]  # not all text
