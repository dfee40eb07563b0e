"""Rich reprs in Jupyter: explain's result and text pictures show as text, not as escaped strings."""
from __future__ import annotations

import html

import outlines
from outlines import models
from outlines.graph.viz.jupyter import TextPicture


def test_explain_has_a_rich_repr():
    llm = models.from_function(lambda p: p.upper(), name="up")
    q = outlines.string("q")
    plan = outlines.explain(llm(q + "<b>"), givens={q: ["a", "b"]})
    bundle = plan._repr_mimebundle_()
    assert bundle["text/plain"] == str(plan) == plan.summary()
    assert bundle["text/html"].startswith('<pre class="outlines-explain">outlines explain (dry run')
    assert "<b>" not in bundle["text/html"]  # escaped
    assert plan._repr_html_() == bundle["text/html"]


def test_ascii_pictures_show_their_lines():
    out = outlines.string("q") + "?"
    text = outlines.visualize(out, format="ascii")
    assert isinstance(text, str) and isinstance(text, TextPicture)
    assert text == str(text) and text.startswith("outlines graph: 3 nodes")
    bundle = text._repr_mimebundle_()
    assert bundle["text/plain"] == text and "\\n" not in bundle["text/plain"]
    assert bundle["text/html"] == f'<pre class="outlines-ascii">{html.escape(text)}</pre>'
    printed = []

    class Printer:
        def text(self, value):
            printed.append(value)

    text._repr_pretty_(Printer(), False)
    assert printed == [str(text)]


def test_mermaid_pictures_render_as_mermaid():
    text = outlines.visualize(outlines.string("q") + "?", format="mermaid")
    assert text._repr_mimebundle_()["text/markdown"] == f"```mermaid\n{text}```\n"


def test_text_pictures_stay_ordinary_strings():
    picture = TextPicture("{} nodes", "ascii")
    assert picture.format(3) == "3 nodes" and picture.kind == "ascii"
    assert picture + "!" == "{} nodes!" and picture.upper() == "{} NODES"
