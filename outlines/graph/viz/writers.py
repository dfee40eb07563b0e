"""Pictures of graphs: ``visualize`` as graphviz, mermaid or plain text.

The writers here only format a ``Drawing`` (see ``outlines.graph.viz.drawing``):
graphviz through the optional ``graphviz`` package (rendered by the ``dot``
program), mermaid and ASCII with no dependency and no web service. A text
picture is a ``TextPicture``: a ``str`` that Jupyter shows as its lines
(``text_mimebundle``, which ``explain``'s report uses too).
"""
from __future__ import annotations

import html
import os
import shutil
from typing import Any, Mapping

from outlines.common.errors import install_hint
from outlines.graph.basic import Variable
from outlines.graph.viz.drawing import FAILED_FILL, FAILED_LINE, PALETTE, Drawing, DrawnNode, describe

__all__ = ["PALETTE", "TextPicture", "describe", "render", "text_mimebundle", "to_ascii", "to_graphviz", "to_mermaid", "visualize"]

KIND_STYLE = {  # graphviz shape, fill
    "input": ("ellipse", "#eeeeee"),
    "constant": ("box", "#ffffff"),
    "prompt": ("note", "#fff8dc"),
    "model": ("box", "#dddddd"),
    "python": ("box", "#e8eefc"),
    "op": ("box", "#ffffff"),
}
FORMATS = ("dot", "svg", "png", "pdf", "mermaid", "ascii")
EXTENSIONS = {".dot": "dot", ".gv": "dot", ".svg": "svg", ".png": "png", ".pdf": "pdf",
              ".mmd": "mermaid", ".mermaid": "mermaid", ".md": "mermaid", ".txt": "ascii"}
GRAPHVIZ_MISSING = f"outlines.visualize needs the graphviz Python package for this format: {install_hint('viz')}"
DOT_MISSING = (
    "rendering {fmt} needs the `dot` program from Graphviz, which is not installed: "
    "apt-get install graphviz (Debian/Ubuntu), conda install graphviz, or brew install graphviz. "
    "format='dot', 'mermaid' or 'ascii' need no program."
)


def to_graphviz(drawing: Drawing, name: str = "outlines") -> Any:
    """A ``graphviz.Digraph`` of ``drawing`` (needs the ``graphviz`` package)."""
    try:
        import graphviz
    except ImportError:
        raise ImportError(GRAPHVIZ_MISSING) from None
    graph = graphviz.Digraph(name, graph_attr={"rankdir": "TB", "fontname": "Helvetica"},
                             node_attr={"fontname": "Helvetica", "fontsize": "11", "style": "filled"},
                             edge_attr={"fontname": "Helvetica", "fontsize": "9", "color": "#555555"})
    clusters: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for node in drawing.nodes:
        shape, fill = KIND_STYLE[node.kind]
        if node.backend is not None:
            fill = drawing.colour(node.backend)
        attrs = {"shape": shape, "fillcolor": FAILED_FILL if node.failed else fill, "label": _html_label(node),
                 "color": FAILED_LINE if node.failed else "#333333", "tooltip": node.label}
        if node.kind == "python":
            attrs["style"] = "filled,rounded"
        if node.output or node.failed:
            attrs["penwidth"] = "2"
        if node.cluster is not None:  # a loop's body: drawn below, inside its cluster
            clusters.setdefault(node.cluster, []).append((node.key, attrs))
            continue
        graph.node(node.key, **attrs)
    for number, (title, members) in enumerate(clusters.items()):
        with graph.subgraph(name=f"cluster_body{number}") as body:
            body.attr(label=_plain(title), style="rounded", color="#7f7f7f", fontname="Helvetica", fontsize="10")
            for key, attrs in members:
                body.node(key, **attrs)
    for source, target, _, label in drawing.edges:
        graph.edge(source, target, label=_plain(label)) if label else graph.edge(source, target)
    if drawing.backends:
        with graph.subgraph(name="cluster_legend") as legend:
            legend.attr(label="backends", style="dashed", color="#999999", fontname="Helvetica", fontsize="10")
            for i, backend in enumerate(drawing.backends):
                legend.node(f"legend{i}", label=_plain(backend), shape="box", fillcolor=drawing.colour(backend))
    return graph


def _html_label(node: DrawnNode) -> str:
    rows = [f"<b>{_escape(node.title)}</b>"] + [_escape(line) for line in node.lines]
    for line in node.status:
        colour = FAILED_LINE if line.startswith("FAILED") else "#1f4e79"
        rows.append(f'<font color="{colour}" point-size="9">{_escape(line)}</font>')
    if node.output:
        rows.append('<font point-size="8" color="#666666">output</font>')
    return "<" + "<br/>".join(rows) + ">"


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _plain(text: str) -> str:  # graphviz's own escapes start with a backslash
    return text.replace("\\", "\\\\")


def to_mermaid(drawing: Drawing) -> str:
    """Mermaid ``flowchart`` text of ``drawing`` (GitHub and Jupyter render it)."""
    shapes = {"input": ('(["', '"])'), "prompt": ('[/"', '"/]'), "python": ('("', '")')}
    out = ["flowchart TD"]
    clusters: dict[str, list[str]] = {}
    for node in drawing.nodes:
        opening, closing = shapes.get(node.kind, ('["', '"]'))
        text = "<br/>".join([f"<b>{_mermaid_text(node.title)}</b>"] + [_mermaid_text(x) for x in node.lines + node.status])
        line = f"{node.key}{opening}{text}{closing}"
        if node.cluster is not None:  # a loop's body
            clusters.setdefault(node.cluster, []).append(line)
        else:
            out.append(f"    {line}")
    for number, (title, lines) in enumerate(clusters.items()):
        out.append(f'    subgraph body{number} ["{_mermaid_text(title)}"]')
        out.extend(f"        {line}" for line in lines)
        out.append("    end")
    for source, target, _, label in drawing.edges:
        out.append(f'    {source} -->|"{_mermaid_text(label)}"| {target}' if label else f"    {source} --> {target}")
    for i, backend in enumerate(drawing.backends):
        out.append(f"    classDef backend{i} fill:{drawing.colour(backend)},stroke:#333")
    out.append(f"    classDef failed fill:{FAILED_FILL},stroke:{FAILED_LINE},stroke-width:2px")
    for node in drawing.nodes:
        if node.failed:
            out.append(f"    class {node.key} failed")
        elif node.backend is not None:
            out.append(f"    class {node.key} backend{drawing.backends.index(node.backend)}")
    if drawing.backends:
        out.append('    subgraph legend ["backends"]')
        for i, backend in enumerate(drawing.backends):
            out.append(f'        legend{i}["{_mermaid_text(backend)}"]:::backend{i}')
        out.append("    end")
    return "\n".join(out) + "\n"


def _mermaid_text(text: str) -> str:
    # HTML entities (labels are HTML): no '"' to end the label, and no '#', which
    # mermaid would take for the start of one of its own '#name;' codes.
    return text.translate(_MERMAID_ESCAPES)


_MERMAID_ESCAPES = str.maketrans({"&": "&amp;", '"': "&quot;", "<": "&lt;", ">": "&gt;", "#": "&num;"})


def to_ascii(drawing: Drawing) -> str:
    """Plain ASCII text of ``drawing``: one numbered line per node with its inputs."""
    number = {node.key: i + 1 for i, node in enumerate(drawing.nodes)}
    letters = {b: chr(ord("A") + i) if i < 26 else str(i) for i, b in enumerate(drawing.backends)}
    inputs: dict[str, list[str]] = {}
    for source, target, _, label in drawing.edges:
        inputs.setdefault(target, []).append(f"{label}=[{number[source]}]" if label else f"[{number[source]}]")
    out = [f"outlines graph: {len(drawing.nodes)} nodes, {len(drawing.edges)} edges"]
    for node in drawing.nodes:
        mark = f" {{{letters[node.backend]}}}" if node.backend is not None else ""
        title = node.title.removeprefix(f"{node.kind} ")
        head = f"[{number[node.key]}] {node.kind:<8} {title}{mark}"
        head += f"  (in {node.cluster})" if node.cluster is not None else ""
        details = "  ".join(node.lines)
        out.append(_ascii(f"{head}  {details}".rstrip() + ("  => output" if node.output else "")))
        if node.key in inputs:
            out.append("      <- " + ", ".join(_ascii(x) for x in inputs[node.key]))
        facts = [line for line in node.status if not line.startswith("FAILED")]
        if facts:
            out.append("      " + _ascii(" | ".join(facts)))
        out.extend("      !! " + _ascii(line) for line in node.status if line.startswith("FAILED"))
    if drawing.backends:
        out.append("backends: " + ", ".join(f"{{{letters[b]}}} {_ascii(b)}" for b in drawing.backends))
    return "\n".join(out) + "\n"


def _ascii(text: str) -> str:
    return text.replace("…", "...").encode("ascii", "replace").decode("ascii")


def visualize(
    *variables: Variable, filename: str | None = None, format: str | None = None, trace: Any = None,
    draws: Mapping[int, tuple[int, int]] | None = None,
) -> Any:
    """``outlines.visualize``: documented there (the public name), implemented here; ``draws`` as for ``describe``."""
    fmt = _format(filename, format)
    drawing = describe(*variables, trace=trace, draws=draws)
    if fmt in ("mermaid", "ascii"):
        text = to_mermaid(drawing) if fmt == "mermaid" else to_ascii(drawing)
        if filename is not None and filename.endswith(".md"):
            text = f"```mermaid\n{text}```\n"
        if filename is not None:
            with open(filename, "w", encoding="utf-8") as handle:
                handle.write(text)
        return TextPicture(text, "markdown" if text.startswith("```") else fmt)
    graph = to_graphviz(drawing)
    graph.format = "svg" if fmt == "dot" else fmt
    if filename is not None:
        data = graph.source.encode() if fmt == "dot" else render(graph, fmt)
        with open(filename, "wb") as handle:
            handle.write(data)
    return graph


def _format(filename: str | None, format: str | None) -> str:
    if format is None and filename is not None:
        extension = os.path.splitext(filename)[1].lower()
        if extension not in EXTENSIONS:
            raise ValueError(f"cannot tell the format from {filename!r}; pass format= one of {', '.join(FORMATS)}")
        format = EXTENSIONS[extension]
    format = (format or "svg").lower()
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}")
    return format


def render(graph: Any, fmt: str) -> bytes:
    """``graph`` rendered by the ``dot`` program, with a clear error when it is missing."""
    if shutil.which("dot") is None:
        raise RuntimeError(DOT_MISSING.format(fmt=fmt))
    import graphviz

    try:
        picture: bytes = graph.pipe(format=fmt)
        return picture
    except graphviz.ExecutableNotFound:
        raise RuntimeError(DOT_MISSING.format(fmt=fmt)) from None


def text_mimebundle(text: str, css_class: str = "outlines-text") -> dict[str, str]:
    """A text report as Jupyter shows it: the text itself and a ``<pre>`` block.

    Parameters
    ----------
    text
        The report (``Explanation.summary()``, an ASCII drawing).
    css_class
        Class of the ``<pre>`` element.

    Returns
    -------
    dict
        ``text/plain`` and ``text/html``.
    """
    return {"text/plain": text, "text/html": f'<pre class="{css_class}">{html.escape(text)}</pre>'}


class TextPicture(str):
    """A picture as text (``visualize(format="ascii")`` or ``"mermaid"``): a ``str`` that Jupyter shows as text.

    A plain ``str`` result shows in Jupyter as its quoted, escaped repr; this one
    shows its lines (and mermaid renders where the front end supports it).
    """

    #: ``"ascii"``, ``"mermaid"`` or ``"markdown"`` (a mermaid block).
    kind: str = "ascii"

    def __new__(cls, text: str, kind: str = "ascii") -> TextPicture:
        picture = super().__new__(cls, text)
        picture.kind = kind
        return picture

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        bundle = text_mimebundle(str(self), f"outlines-{self.kind}")
        if self.kind == "mermaid":
            bundle["text/markdown"] = f"```mermaid\n{self}```\n"
        return bundle

    def _repr_html_(self) -> str:
        return text_mimebundle(str(self), f"outlines-{self.kind}")["text/html"]

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))
