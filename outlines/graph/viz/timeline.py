"""What ran when: a ``Trace`` as a Gantt chart in SVG, and as a self-contained page.

One lane per backend (and per worker when batches name one), with a bar per
backend call and one for each local model load; a lane of wire requests per
backend that reported their start and end times; a lane of cache hits per
backend (a mark when a model node was served from the cache); and one lane for
Python ops. Concurrent bars of a lane stack in rows. Bars on the critical path are outlined; failed ones are red. The SVG
carries its hover text in ``<title>`` elements, so it works as a picture on its
own; the HTML page adds a small inline script for a nicer tooltip. Nothing
refers to any URL: the page works offline and fetches nothing.
"""
from __future__ import annotations

import ast
import html
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from outlines.graph.viz.drawing import FAILED_LINE, PALETTE
from outlines.common.labels import hide_keys, shorten

__all__ = ["timeline_html", "timeline_svg", "write_timeline"]

WIDTH, LABEL_WIDTH, ROW, LANE_GAP, TOP = 1000, 210, 14, 8, 48
PYTHON_COLOUR, CRITICAL_LINE, FAILED_FILL = "#9ecae1", "#111111", "#f28e8e"
LOAD_COLOUR, REQUEST_COLOUR, HIT_COLOUR = "#d9d9d9", "#fdd0a2", "#74c476"


@dataclass
class Bar:
    """One drawn interval: a backend call or a Python op."""

    lane: str
    start: float
    end: float
    title: str
    details: list[str]
    colour: str
    critical: bool = False
    failed: bool = False
    #: Drawn as a narrow mark at ``end`` (an event, such as cache hits), not as an interval.
    mark: bool = False
    row: int = 0


@dataclass
class Lane:
    name: str
    bars: list[Bar] = field(default_factory=list)
    rows: int = 1


def backend_label(backend: str | None, labels: Mapping[str, str] | None = None) -> str:
    """The lane name of a trace's backend: the label the backend gave (``labels``), no URL.

    A trace records each backend's ``repr`` and, beside it, the label the
    backend gives itself (``Trace.labels``, from ``outlines.common.labels.label_of``).
    A repr with no label (a trace built by hand) is shown as its class name
    without ``Backend`` and its first field only, since later fields (a base
    URL) may say where it runs.
    """
    if not backend:
        return "backend"
    if labels and backend in labels:
        return labels[backend]
    match = re.fullmatch(r"(\w+)\((.*)\)", backend, re.DOTALL)
    if match is None:
        return shorten(backend, 40)
    kind = match.group(1).removesuffix("Backend").lower()
    try:
        fields = ast.literal_eval(f"({match.group(2)},)") if match.group(2) else ()
    except (ValueError, SyntaxError):
        fields = ()
    model = str(fields[0]) if fields else ""
    if os.path.isabs(model):
        model = os.path.basename(model.rstrip("/"))
    return f"{kind}: {model}" if model else kind


def _bars(trace: Any) -> list[Lane]:
    labels: Mapping[str, str] = getattr(trace, "labels", None) or {}
    critical = set(getattr(trace, "critical_path_nodes", []) or [])
    gating = _gating_batches(trace.batches, critical)
    lanes: dict[str, Lane] = {}
    colours: dict[str, str] = {}
    now = max([b.end or b.start for b in trace.batches] + [r.end or r.start or 0.0 for r in trace.nodes.values()] + [0.0])
    for batch in trace.batches:
        name = backend_label(batch.backend, labels)
        colour = colours.setdefault(name, PALETTE[len(colours) % len(PALETTE)])
        lane = f"{name} @ {batch.worker.split('://')[-1]}" if batch.worker else name
        end = batch.end if batch.end is not None else now
        details = [f"batch {batch.id}: {batch.size} prompt(s) to {name}", f"{batch.start:.3f} s to {end:.3f} s ({_ms(end - batch.start)})"]
        if batch.worker:
            details.append(f"worker {batch.worker}")
        details.append("nodes: " + shorten(", ".join(batch.nodes), 120))
        if batch.prompt_tokens or batch.completion_tokens:
            details.append(f"tokens: {batch.prompt_tokens} prompt, {batch.completion_tokens} completion")
        on_path = batch.id in gating
        _add(lanes, Bar(lane, batch.start, end, f"batch {batch.id} ({batch.size})", details, colour, on_path), batch.error)
    for load in getattr(trace, "model_loads", []) or []:
        name = backend_label(load.backend, labels)
        colours.setdefault(name, PALETTE[len(colours) % len(PALETTE)])
        details = [f"loading the model of {name}", f"{load.start:.3f} s to {load.end:.3f} s ({_ms(load.end - load.start)})"]
        _add(lanes, Bar(name, load.start, load.end, "load model", details, LOAD_COLOUR), None)
    by_id = {batch.id: batch for batch in trace.batches}
    for number, request in enumerate(getattr(trace, "requests", []) or [], 1):
        batch = by_id.get(request.batch)
        name = backend_label(batch.backend, labels) if batch is not None else "backend"
        size = batch.size if batch is not None else "?"
        details = [f"request {number} of batch {request.batch} (of {size} prompt(s)) to {name}",
                   f"{request.start:.3f} s to {request.end:.3f} s ({_ms(request.end - request.start)})"]
        _add(lanes, Bar(f"{name}: requests", request.start, request.end, f"request {number}", details, REQUEST_COLOUR),
             request.error)
    for record in trace.nodes.values():
        if record.kind == "generate" and record.cache_hits and record.end is not None:
            name = backend_label(record.backend, labels)
            details = [record.label, f"{record.cache_hits} draw(s) from the cache, {record.cache_misses} sent",
                       f"finished at {record.end:.3f} s"]
            _add(lanes, Bar(f"{name}: cache hits", record.end, record.end, f"{record.cache_hits} hit(s)", details, HIT_COLOUR,
                            mark=True), None)
        if record.kind != "python" or record.start is None:
            continue
        spans = record.spans or [(record.start, record.end)]  # a loop body's node: one bar per iteration
        for start, finish in spans:
            end = finish if finish is not None else now
            details = [record.label, f"{start:.3f} s to {end:.3f} s ({_ms(end - start)})"]
            bar = Bar("python", start, end, record.op, details, PYTHON_COLOUR, record.label in critical)
            _add(lanes, bar, record.error)
    ordered = sorted(lanes.values(), key=lambda item: (item.name == "python", item.name.split(": requests")[0].split(": cache hits")[0]))
    for item in ordered:
        item.rows = _pack(item.bars)
    return ordered


def _gating_batches(batches: list[Any], critical: set[str]) -> set[int]:
    """The last-ending batch of each critical node: the one its successors waited for."""
    last: dict[str, Any] = {}
    for batch in batches:
        for label in batch.nodes:
            if label in critical and (label not in last or (batch.end or 0.0) > (last[label].end or 0.0)):
                last[label] = batch
    return {batch.id for batch in last.values()}


def _add(lanes: dict[str, Lane], bar: Bar, error: Any) -> None:
    if bar.critical:
        bar.details.append("on the critical path")
    if error:
        bar.failed = True
        bar.details.append("FAILED: " + shorten(str(error).strip().splitlines()[0], 160))
    bar.details = [hide_keys(line) for line in bar.details]
    lanes.setdefault(bar.lane, Lane(bar.lane)).bars.append(bar)


def _pack(bars: list[Bar]) -> int:
    """Give each bar the first row free at its start; return the number of rows."""
    ends: list[float] = []
    for bar in sorted(bars, key=lambda b: (b.start, b.end)):
        row = next((i for i, end in enumerate(ends) if end <= bar.start), len(ends))
        if row == len(ends):
            ends.append(bar.end)
        ends[row] = bar.end
        bar.row = row
    return max(1, len(ends))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _tick(t: float, span: float) -> str:
    return f"{round(t * 1000, 6):g} ms" if span < 2 else f"{round(t, 6):g} s"


def _ticks(span: float) -> list[float]:
    step = 10 ** math.floor(math.log10(span / 8)) if span > 0 else 1.0
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= 10:
            step *= factor
            break
    return [i * step for i in range(int(span / step) + 1)]


def timeline_svg(trace: Any, *, standalone: bool = True) -> str:
    """The trace as an SVG Gantt chart; hover text in ``<title>`` elements.

    Parameters
    ----------
    trace
        A ``Trace`` (``batches``, ``nodes``, ``critical_path_nodes``, ``wall``).
    standalone
        Include the SVG namespace (for a ``.svg`` file); leave it out when the
        SVG is inlined in HTML, where it is not needed.

    Returns
    -------
    str
    """
    lanes = _bars(trace)
    starts = [b.start for lane in lanes for b in lane.bars]
    t0 = min(starts, default=0.0)
    span = max((b.end for lane in lanes for b in lane.bars), default=t0 + 1.0) - t0 or 1e-3
    plot = WIDTH - LABEL_WIDTH - 40
    heights = [_row_height(lane.rows) * lane.rows + LANE_GAP for lane in lanes]
    height = TOP + sum(heights) + 40

    def x(t: float) -> float:
        return LABEL_WIDTH + (t - t0) / span * plot

    namespace = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
    out = [(f'<svg{namespace} class="outlines-timeline" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="11">'),
           f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
           f'<text x="10" y="18" font-size="13" font-weight="bold">{_escape(_header(trace, lanes))}</text>']
    for t in _ticks(span):
        out.append(f'<line x1="{x(t0 + t):.1f}" y1="{TOP - 14}" x2="{x(t0 + t):.1f}" y2="{height - 36}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x(t0 + t):.1f}" y="{TOP - 18}" text-anchor="middle" fill="#555">{_tick(t, span)}</text>')
    y = TOP
    for index, (lane, lane_height) in enumerate(zip(lanes, heights)):
        fill = "#f7f7f7" if index % 2 == 0 else "#ffffff"
        out.append(f'<rect class="lane" x="0" y="{y - 3}" width="{WIDTH}" height="{lane_height}" fill="{fill}"/>')
        out.append(f'<text class="lane-label" x="10" y="{y + 11}">{_escape(shorten(lane.name, 32))}<title>{_escape(lane.name)}</title></text>')
        row_height = _row_height(lane.rows)
        for bar in lane.bars:
            left, width = (x(bar.end) - 2, 4.0) if bar.mark else (x(bar.start), max(x(bar.end) - x(bar.start), 1.5))
            out.append(_bar_svg(bar, left, width, y + bar.row * row_height, row_height - 2))
        y += lane_height
    out.append(_legend(height - 22))
    out.append("</svg>")
    return "\n".join(out)


def _row_height(rows: int) -> int:
    return ROW if rows <= 8 else max(3, 160 // rows)


def _bar_svg(bar: Bar, x: float, width: float, y: float, height: float) -> str:
    classes = "bar" + (" critical" if bar.critical else "") + (" failed" if bar.failed else "") + (" mark" if bar.mark else "")
    stroke = CRITICAL_LINE if bar.critical else (FAILED_LINE if bar.failed else "#555555")
    fill = FAILED_FILL if bar.failed else bar.colour
    stroke_width = 2 if bar.critical or bar.failed else 0.5
    rect = (f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{max(height, 1):.1f}" rx="2" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{stroke_width}"/>')
    text = ""
    if width > 60 and height >= 10:
        text = f'<text x="{x + 3:.1f}" y="{y + height - 2:.1f}" font-size="9">{_escape(shorten(bar.title, int(width / 6)))}</text>'
    return f'<g class="{classes}">{rect}{text}<title>{_escape(chr(10).join(bar.details))}</title></g>'


def _header(trace: Any, lanes: list[Lane]) -> str:
    bars = sum(len(lane.bars) for lane in lanes if not lane.name.endswith(": cache hits"))
    wall, path = getattr(trace, "wall", 0.0), getattr(trace, "critical_path", 0.0)
    hits = getattr(trace, "cache_hits", 0)
    cached = f", {hits} draw(s) from the cache" if hits else ""
    return (f"outlines timeline: {len(trace.batches)} backend call(s){cached}, {bars} bar(s), "
            f"wall {_ms(wall)}, critical path {_ms(path)}")


def _legend(y: float) -> str:
    items = [("backend call", PALETTE[0], "#555555", 0.5), ("model load", LOAD_COLOUR, "#555555", 0.5),
             ("HTTP request", REQUEST_COLOUR, "#555555", 0.5), ("cache hit", HIT_COLOUR, "#555555", 0.5),
             ("Python op", PYTHON_COLOUR, "#555555", 0.5),
             ("critical path", "#ffffff", CRITICAL_LINE, 2), ("failed", FAILED_FILL, FAILED_LINE, 2)]
    parts, x = [], 10
    for label, fill, stroke, width in items:
        parts.append(f'<rect x="{x}" y="{y}" width="18" height="10" fill="{fill}" stroke="{stroke}" stroke-width="{width}"/>'
                     f'<text x="{x + 24}" y="{y + 9}">{label}</text>')
        x += 30 + 7 * len(label)
    return '<g class="legend">' + "".join(parts) + "</g>"


def _escape(text: str) -> str:
    return html.escape(text, quote=True)


_SCRIPT = """
(function () {
  var tip = document.getElementById("tip"), bars = document.querySelectorAll("svg .bar");
  bars.forEach(function (bar) {
    var title = bar.querySelector("title");
    bar.setAttribute("data-details", title ? title.textContent : "");
    if (title) { title.remove(); }
    bar.addEventListener("mousemove", function (event) {
      tip.textContent = bar.getAttribute("data-details");
      tip.style.display = "block";
      tip.style.left = (event.pageX + 12) + "px";
      tip.style.top = (event.pageY + 12) + "px";
    });
    bar.addEventListener("mouseleave", function () { tip.style.display = "none"; });
  });
  document.body.setAttribute("data-bars", String(bars.length));
})();
"""


def timeline_html(trace: Any) -> str:
    """A self-contained HTML page: the SVG chart inline, a small inline script, no URL."""
    style = ("body{font-family:Helvetica,Arial,sans-serif;margin:16px}"
             "#tip{position:absolute;display:none;white-space:pre;background:#222;color:#fff;"
             "padding:6px 8px;border-radius:4px;font-size:12px;pointer-events:none}"
             ".bar:hover rect{opacity:.75}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>outlines timeline</title><style>{style}</style></head><body>\n"
            f"{timeline_svg(trace, standalone=False)}\n<div id=\"tip\"></div>\n<script>{_SCRIPT}</script>\n</body></html>\n")


def write_timeline(trace: Any, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
    """Write the trace's timeline to ``path``: HTML, or SVG when it ends in ``.svg``.

    Parameters
    ----------
    trace
        A ``Trace``.
    path
        Output file; ``.svg`` writes the bare chart (hover via ``<title>``),
        anything else the self-contained HTML page.

    Returns
    -------
    str or os.PathLike
        ``path``, as given.
    """
    svg = os.fspath(path).lower().endswith(".svg")
    text = timeline_svg(trace) if svg else timeline_html(trace)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path
