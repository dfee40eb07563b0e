"""How graphs and traces show themselves in Jupyter (``_repr_mimebundle_``).

A graph is an SVG when graphviz and its ``dot`` program are there, else mermaid
text (JupyterLab and GitHub render ```` ```mermaid ```` blocks) with the ASCII
drawing as plain text. A trace is its timeline SVG inline (hover text in
``<title>``, no script, no URL) above its summary. Text reports (``explain``,
``visualize(format="ascii")``) show as preformatted text through
``writers.TextPicture`` and ``writers.text_mimebundle``. Nothing here may
raise: a failing picture falls back to text.
"""
from __future__ import annotations

import html
import shutil
from typing import Any

from outlines.graph.basic import Variable
from outlines.graph.viz.drawing import describe
from outlines.graph.viz.writers import render, to_ascii, to_graphviz, to_mermaid

__all__ = ["mimebundle", "trace_html", "trace_mimebundle"]

#: Above this many nodes the SVG is skipped: dot gets slow and the picture unreadable.
MAX_SVG_NODES = 2000


def mimebundle(*variables: Variable) -> dict[str, str]:
    """Jupyter's representations of the graph computing ``variables``.

    Returns
    -------
    dict
        ``image/svg+xml`` when graphviz can render, else ``text/markdown``
        (a mermaid block); ``text/plain`` (the ASCII drawing) always.
    """
    drawing = describe(*variables)
    bundle = {"text/plain": to_ascii(drawing)}
    if len(drawing.nodes) <= MAX_SVG_NODES and shutil.which("dot") is not None:
        try:
            bundle["image/svg+xml"] = render(to_graphviz(drawing), "svg").decode("utf-8")
            return bundle
        except Exception:  # noqa: BLE001 - no graphviz package, or dot failed: show text instead
            pass
    bundle["text/markdown"] = f"```mermaid\n{to_mermaid(drawing)}```\n"
    return bundle


def trace_mimebundle(trace: Any) -> dict[str, str]:
    """Jupyter's representations of a ``Trace``: its timeline and its summary.

    For ``Trace._repr_mimebundle_``; ``text/html`` is the inline timeline SVG
    followed by the summary table, ``text/plain`` the summary alone.
    """
    from outlines.graph.viz.timeline import timeline_svg

    summary = trace.summary() if callable(getattr(trace, "summary", None)) else repr(trace)
    bundle = {"text/plain": summary}
    try:
        svg = timeline_svg(trace, standalone=False)
    except Exception:  # noqa: BLE001 - an unusual trace still shows its summary
        return bundle
    bundle["text/html"] = f'<div class="outlines-trace">{svg}<pre>{html.escape(summary)}</pre></div>'
    return bundle


def trace_html(trace: Any) -> str:
    """``Trace._repr_html_``: the same HTML as in ``trace_mimebundle``."""
    bundle = trace_mimebundle(trace)
    return bundle.get("text/html", f"<pre>{html.escape(bundle['text/plain'])}</pre>")
