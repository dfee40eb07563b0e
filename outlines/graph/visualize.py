"""Pictures of graphs: ``visualize`` as graphviz, mermaid or plain text.

``describe`` turns the graph of some Variables into a ``Drawing``: one node per
input, constant and Apply (shared nodes once), edges in argument order, one
colour per backend. The writers below only format a Drawing; with a ``Trace``
each node also carries what happened when it ran. Every walk is iterative, and
every piece of text passes ``redact`` so no API key reaches a picture.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from outlines.graph.basic import Apply, Constant, Variable
from outlines.graph.traversal import ancestors, toposort

__all__ = ["Drawing", "DrawnNode", "describe", "to_ascii", "to_graphviz", "to_mermaid", "visualize"]

#: Light colours for backends (ColorBrewer Set3 without its red: red means failure).
PALETTE = ("#8dd3c7", "#fdb462", "#bebada", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3", "#bc80bd", "#ccebc5", "#ffed6f")
FAILED_FILL, FAILED_LINE = "#ffd6d6", "#d62728"
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
_KEY_PATTERN = re.compile(r"\b(sk-[A-Za-z0-9_\-]{3,}|Bearer\s+\S+)")
GRAPHVIZ_MISSING = "outlines.visualize needs the graphviz Python package for this format: pip install outlines[viz]"
DOT_MISSING = (
    "rendering {fmt} needs the `dot` program from Graphviz, which is not installed: "
    "apt-get install graphviz (Debian/Ubuntu), conda install graphviz, or brew install graphviz. "
    "format='dot', 'mermaid' or 'ascii' need no program."
)


@dataclass
class DrawnNode:
    """One box of a picture; ``key`` is unique, ``label`` is the trace's name for it."""

    key: str
    label: str
    kind: str
    title: str
    lines: list[str] = field(default_factory=list)
    op: str | None = None
    backend: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    num_samples: int | None = None
    output: bool = False
    status: list[str] = field(default_factory=list)
    failed: bool = False


@dataclass
class Drawing:
    """Nodes in dependency order, edges ``(source, target, position, label)``, backends."""

    nodes: list[DrawnNode]
    edges: list[tuple[str, str, int, str]]
    backends: list[str]

    def colour(self, backend: str) -> str:
        return PALETTE[self.backends.index(backend) % len(PALETTE)]


def _redactor(nodes: Sequence[Apply]) -> Callable[[str], str]:
    hooks = []
    for node in nodes:
        client = getattr(getattr(node.op, "backend", None), "client", None)
        if callable(getattr(client, "redact", None)):
            hooks.append(client.redact)

    def redact(text: str) -> str:
        for hook in hooks:
            text = hook(text)
        return _KEY_PATTERN.sub(lambda m: m.group(0)[:3] + "***", text)

    return redact


def shorten(text: str, limit: int = 40) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def backend_name(backend: Any) -> str:
    """``kind: model`` of a Backend (or of a trace's backend string / identity)."""
    if isinstance(backend, str):
        return backend
    if isinstance(backend, (tuple, list)):
        return ": ".join(str(part) for part in backend[:2])
    return f"{getattr(backend, 'kind', 'backend')}: {getattr(backend, 'model_name', '?')}"


def _constant_title(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None and getattr(value, "ndim", 0) > 0:
        items = ", ".join(shorten(repr(v), 12) for v in value.reshape(-1)[:3])
        return shorten(f"array{tuple(shape)} [{items}{', …' if value.size > 3 else ''}]", 40)
    return shorten(repr(value), 32)


def _describe_apply(node: Apply, key: str) -> DrawnNode:
    op = node.op
    drawn = DrawnNode(key, node.label, "op", op.name, op=type(op).__name__)
    if type(op).__name__ == "Render":
        drawn.kind, drawn.title = "prompt", f"prompt {op.template_name}"  # type: ignore[attr-defined]
        drawn.lines = ['"' + shorten(op.source, 40) + '"']  # type: ignore[attr-defined]
    elif op.mode == "generate":
        backend, params = op.backend, op.params.to_dict()  # type: ignore[attr-defined]
        drawn.kind, drawn.title, drawn.backend = "model", backend_name(backend), backend_name(backend)
        drawn.params, drawn.num_samples = params, op.num_samples  # type: ignore[attr-defined]
        drawn.lines = [shorten(", ".join(f"{k}={json.dumps(v)}" for k, v in params.items()), 60)] if params else []
        if drawn.num_samples and drawn.num_samples > 1:
            drawn.lines.append(f"num_samples={drawn.num_samples}")
    elif op.mode == "python":
        function = op.function  # type: ignore[attr-defined]
        drawn.kind, drawn.title = "python", function.__name__
        drawn.lines = [function.signature] if function.signature else []
    elif type(op).__name__ == "Concat":
        drawn.title = "+ (concat)"
    elif type(op).__name__ == "Stack":
        drawn.title = f"stack {op.n}"  # type: ignore[attr-defined]
    return drawn


def _argument_name(node: Apply, position: int) -> str:
    op = node.op
    if type(op).__name__ == "Render":
        return str(op.names[position])  # type: ignore[attr-defined]
    if op.mode == "python":
        kwnames = op.kwnames  # type: ignore[attr-defined]
        npositional = len(node.inputs) - len(kwnames)
        if position >= npositional:
            return str(kwnames[position - npositional])
        signature = op.function.python_signature  # type: ignore[attr-defined]
        names = [p.name for p in signature.parameters.values() if p.kind <= p.POSITIONAL_OR_KEYWORD] if signature else []
        return names[position] if position < len(names) else str(position)
    return str(position) if len(node.inputs) > 1 else ""


def describe(*variables: Variable, trace: Any = None) -> Drawing:
    """The picture of the graph computing ``variables``, as plain data.

    Parameters
    ----------
    *variables
        The outputs to draw; everything they depend on is drawn once.
    trace
        Optional ``Trace`` of an evaluation: nodes then carry their time, batch,
        cache hits and errors.

    Returns
    -------
    Drawing
    """
    variables = tuple(_as_variable(v) for v in variables)
    nodes = toposort(variables)
    redact = _redactor(nodes)
    drawn: list[DrawnNode] = []
    keys: dict[int, str] = {}
    labels: dict[str, int] = {}
    for leaf in (v for v in ancestors(variables) if v.owner is None):
        keys[id(leaf)] = _add(drawn, labels, _describe_leaf(leaf, f"n{len(drawn)}"))
    for node in nodes:
        keys[id(node)] = _add(drawn, labels, _describe_apply(node, f"n{len(drawn)}"))
    edges = []
    for node in nodes:
        for position, variable in enumerate(node.inputs):
            source = keys[id(variable.owner) if variable.owner is not None else id(variable)]
            label = _argument_name(node, position)
            if variable.owner is not None and len(variable.owner.outputs) > 1:
                label = f"{label} (output {variable.index})".strip()
            edges.append((source, keys[id(node)], position, redact(label)))
    index = {d.key: d for d in drawn}
    for variable in variables:
        index[keys[id(variable.owner) if variable.owner is not None else id(variable)]].output = True
    backends: list[str] = []
    for node in drawn:
        node.title, node.lines = redact(node.title), [redact(line) for line in node.lines]
        if node.backend is not None and node.backend not in backends:
            backends.append(node.backend)
    if trace is not None:
        _overlay(drawn, trace, redact)
    return Drawing(drawn, edges, backends)


def _as_variable(value: Any) -> Variable:
    if isinstance(value, Variable):
        return value
    outputs = getattr(value, "outputs", None)  # a Program
    if isinstance(outputs, Variable):
        return outputs
    raise TypeError(f"visualize draws Variables; got {type(value).__name__}")


def _add(drawn: list[DrawnNode], labels: dict[str, int], node: DrawnNode) -> str:
    seen = labels.get(node.label, 0)
    labels[node.label] = seen + 1
    if seen:  # two inputs or constants may share a label; keys must not
        node.label = f"{node.label}~{seen + 1}"
    drawn.append(node)
    return node.key


def _describe_leaf(variable: Variable, key: str) -> DrawnNode:
    if isinstance(variable, Constant):
        title = variable.name or _constant_title(variable.value)
        return DrawnNode(key, variable.label, "constant", title, op="Constant")
    return DrawnNode(key, variable.label, "input", variable.label, ["input"])


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"


def first_line(error: Any) -> str:
    """The first line of an error (``Type: message``), for pictures."""
    if isinstance(error, BaseException):
        text = str(error).strip()
        lines = text.splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "error"


def _overlay(drawn: list[DrawnNode], trace: Any, redact: Callable[[str], str]) -> None:
    records = getattr(trace, "nodes", {}) or {}
    batches = {b.id: b for b in getattr(trace, "batches", []) or []}
    for node in drawn:
        record = records.get(node.label)
        if node.kind in ("input", "constant"):
            continue
        if record is None:
            node.status = ["not run"]
            continue
        status = []
        if record.start is not None and record.end is not None:
            status.append(_duration(record.end - record.start))
        ids = list(record.batch_ids or ())
        if ids:
            sizes = ", ".join(str(getattr(batches.get(i), "size", "?")) for i in ids[:4])
            more = ", …" if len(ids) > 4 else ""
            status.append(f"batch{'es' if len(ids) > 1 else ''} {', '.join(map(str, ids[:4]))}{more} (size {sizes}{more})")
        if record.cache_hits or record.cache_misses:
            status.append(f"cache {record.cache_hits or 0} hit / {record.cache_misses or 0} miss")
        failed_batch = next((batches[i] for i in ids if getattr(batches.get(i), "error", None)), None)
        error = record.error or (failed_batch.error if failed_batch is not None else None)
        if error:
            node.failed = True
            status.append("FAILED: " + shorten(redact(first_line(error)), 60))
        node.status = [redact(line) for line in status]


def to_graphviz(drawing: Drawing, name: str = "outlines") -> Any:
    """A ``graphviz.Digraph`` of ``drawing`` (needs the ``graphviz`` package)."""
    try:
        import graphviz
    except ImportError:
        raise ImportError(GRAPHVIZ_MISSING) from None
    graph = graphviz.Digraph(name, graph_attr={"rankdir": "TB", "fontname": "Helvetica"},
                             node_attr={"fontname": "Helvetica", "fontsize": "11", "style": "filled"},
                             edge_attr={"fontname": "Helvetica", "fontsize": "9", "color": "#555555"})
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
        graph.node(node.key, **attrs)
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
    for node in drawing.nodes:
        opening, closing = shapes.get(node.kind, ('["', '"]'))
        text = "<br/>".join([f"<b>{_mermaid_text(node.title)}</b>"] + [_mermaid_text(x) for x in node.lines + node.status])
        out.append(f"    {node.key}{opening}{text}{closing}")
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
    for raw, code in (("#", "#35;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;")):
        text = text.replace(raw, code)
    return text


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


def visualize(*variables: Variable, filename: str | None = None, format: str | None = None, trace: Any = None) -> Any:  # noqa: A002
    """Draw the graph computing ``variables``.

    Parameters
    ----------
    *variables
        Variables (or a ``Program``) to draw, with everything they depend on.
    filename
        Where to write the picture; its extension picks the format when
        ``format`` is not given (``.svg .png .pdf .dot .gv .mmd .md .txt``).
    format
        One of ``dot``, ``svg``, ``png``, ``pdf`` (graphviz; all but ``dot``
        need the ``dot`` program), ``mermaid`` or ``ascii`` (no dependency).
    trace
        A ``Trace`` of an evaluation: nodes show time, batch, cache and errors.

    Returns
    -------
    graphviz.Digraph or str
        A Digraph for the graphviz formats (it renders itself in Jupyter), the
        text for ``mermaid`` and ``ascii``.

    Raises
    ------
    ImportError
        A graphviz format without the ``graphviz`` package (``pip install outlines[viz]``).
    RuntimeError
        Rendering svg/png/pdf to a file without the ``dot`` program.

    Examples
    --------
    >>> import outlines
    >>> print(visualize(outlines.string("q") + "?", format="ascii"))  # doctest: +ELLIPSIS
    outlines graph: 3 nodes, 2 edges
    ...
    """
    fmt = _format(filename, format)
    drawing = describe(*variables, trace=trace)
    if fmt in ("mermaid", "ascii"):
        text = to_mermaid(drawing) if fmt == "mermaid" else to_ascii(drawing)
        if filename is not None and filename.endswith(".md"):
            text = f"```mermaid\n{text}```\n"
        if filename is not None:
            with open(filename, "w", encoding="utf-8") as handle:
                handle.write(text)
        return text
    graph = to_graphviz(drawing)
    graph.format = "svg" if fmt == "dot" else fmt
    if filename is not None:
        data = graph.source.encode() if fmt == "dot" else render(graph, fmt)
        with open(filename, "wb") as handle:
            handle.write(data)
    return graph


def _format(filename: str | None, format: str | None) -> str:  # noqa: A002
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
        return graph.pipe(format=fmt)  # type: ignore[no-any-return]
    except graphviz.ExecutableNotFound:
        raise RuntimeError(DOT_MISSING.format(fmt=fmt)) from None
