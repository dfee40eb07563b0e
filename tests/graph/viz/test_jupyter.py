"""Rich reprs in Jupyter: explain's result shows as text, not as an escaped string."""
from __future__ import annotations

import outlines
from outlines import models


def test_explain_has_a_rich_repr():
    llm = models.from_function(lambda p: p.upper(), name="up")
    q = outlines.string("q")
    plan = outlines.explain(llm(q + "<b>"), givens={q: ["a", "b"]})
    bundle = plan._repr_mimebundle_()
    assert bundle["text/plain"] == str(plan) == plan.summary()
    assert bundle["text/html"].startswith('<pre class="outlines-explain">outlines explain (dry run')
    assert "<b>" not in bundle["text/html"]  # escaped
    assert plan._repr_html_() == bundle["text/html"]
