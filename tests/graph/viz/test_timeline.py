"""The timeline of a trace: lanes, bars, critical path, offline HTML, headless Chromium."""
from __future__ import annotations

import re
import shutil
import struct
import subprocess
import time
import xml.etree.ElementTree as ET
import zlib
from types import SimpleNamespace

import pytest

import outlines
from outlines import models
from outlines.backends.function import FunctionBackend
from outlines.graph.viz import jupyter as display
from outlines.graph.viz.timeline import backend_label, timeline_html, timeline_svg, write_timeline
from outlines.runtime.tracing import BatchRecord, ModelLoadRecord, NodeRecord, RequestRecord, Trace

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium; "
                                    "CI installs it with scripts/setup.sh --system)")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]  # small /dev/shm in containers
UPPER_COLOUR = (0x8D, 0xD3, 0xC7)  # PALETTE[0]: the first backend's bars


def fake_trace():
    """Two backends, one on two workers, overlapping calls, a failure, a Python op."""
    function, openai = "FunctionBackend('upper', 'abc', True)", "OpenAIChatBackend('gpt-x', 'http://127.0.0.1:9')"
    batches = [
        BatchRecord(1, function, 4, 0.00, 0.50, ["Generate[function:upper]#1"]),
        BatchRecord(2, function, 4, 0.10, 0.40, ["Generate[function:upper]#1"]),
        BatchRecord(3, openai, 2, 0.50, 0.90, ["Generate[openai:gpt-x]#2"], worker="tcp://127.0.0.1:4001",
                    prompt_tokens=10, completion_tokens=20),
        BatchRecord(4, openai, 2, 0.55, 0.70, ["Generate[openai:gpt-x]#2"], worker="tcp://127.0.0.1:4002",
                    error="BackendError: upstream said no status=500"),
    ]
    nodes = {
        "vote#3": NodeRecord("vote#3", "vote", "python", None, 0.90, 1.00),
        "Concat#0": NodeRecord("Concat#0", "Concat", "inline", None, 0.0, 0.0),
    }
    critical = ["Concat#0", "Generate[openai:gpt-x]#2", "vote#3"]
    labels = {function: "function: upper", openai: "openai: gpt-x"}  # what the backends said (Trace.labels)
    return SimpleNamespace(batches=batches, nodes=nodes, critical_path_nodes=critical, wall=1.0, critical_path=1.0,
                           summary=lambda: "fake summary", labels=labels)


def real_trace():
    """A traced eval: batched model calls (max_batch 2) and a Python op."""
    question = outlines.string("question")
    upper = models.from_function(lambda ps: [p.upper() for p in ps], batched=True, max_batch=2, name="upper")

    @outlines.fn(signature="(n)->()")
    def vote(answers):
        time.sleep(0.002)
        return answers[0]

    out = vote(upper(question + "?", num_samples=3))
    with outlines.trace() as trace:
        outlines.eval(out, givens={question: ["a", "b"]}, cache=False)
    return trace


def bars(svg):
    return re.findall(r'<g class="(bar[^"]*)">(<rect[^>]*>)', svg)


def test_one_bar_per_batch_and_python_op_in_lanes():
    svg = timeline_svg(fake_trace())
    drawn = bars(svg)
    assert len(drawn) == 5
    labels = re.findall(r'class="lane-label"[^>]*>([^<]*)<', svg)
    assert labels == ["function: upper", "openai: gpt-x @ 127.0.0.1:4001", "openai: gpt-x @ 127.0.0.1:4002",
                      "python"]
    # The critical node's last-ending batch (3, not 4) gated it; then the vote.
    assert [c for c, _ in drawn] == ["bar", "bar", "bar critical", "bar failed", "bar critical"]
    assert "FAILED: BackendError: upstream said no status=500" in svg
    assert "tokens: 10 prompt, 20 completion" in svg
    assert "wall 1.000 s, critical path 1.000 s" in svg


def test_concurrent_bars_of_a_lane_stack_in_rows():
    svg = timeline_svg(fake_trace())
    ys = [float(re.search(r' y="([\d.]+)"', rect).group(1)) for _, rect in bars(svg)]
    assert ys[0] != ys[1]  # batches 1 and 2 overlap in time, so they get two rows
    assert len(set(ys)) == 5


def test_svg_is_valid_xml_and_standalone():
    root = ET.fromstring(timeline_svg(fake_trace()))
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t and t.startswith("batch 3: 2 prompt(s) to openai: gpt-x") for t in titles)


def test_the_page_refers_to_no_url(tmp_path):
    path = write_timeline(real_trace(), tmp_path / "timeline.html")
    with open(path, encoding="utf-8") as handle:
        page = handle.read()
    assert page.startswith("<!DOCTYPE html>") and "<script>" in page and "<svg" in page
    assert not re.search(r"https?:|ftp:|//[\w.-]+\.\w", page), "the page mentions a URL"
    assert not re.search(r"\b(src|href|xlink:href|action)\s*=", page)
    assert not re.search(r"url\(|@import|fetch\(|XMLHttpRequest|import\(|WebSocket", page)
    inline_svg = re.search(r"<svg.*</svg>", page, re.DOTALL).group(0)
    ET.fromstring(inline_svg)


def test_lanes_are_named_by_what_each_backend_says_and_never_show_the_url():
    chat = "OpenAIChatBackend('gpt-x', 'http://127.0.0.1:9')"
    assert backend_label(chat, {chat: "openai: gpt-x"}) == "openai: gpt-x"  # asked of the backend when traced
    # A trace without the label (built by hand): the class name and the first field, never the later ones.
    assert backend_label(chat) == "openaichat: gpt-x"
    assert backend_label("OpenAICompletionBackend('tiny', 'http://h:1/v1')", {}) == "openaicompletion: tiny"
    assert backend_label("TransformersBackend('/tmp/models/tiny-gpt2', 'cpu', None)") == "transformers: tiny-gpt2"
    assert backend_label("FunctionBackend('upper', 'abc', False)") == "function: upper"
    assert backend_label("weird") == "weird" and backend_label(None) == "backend"


def test_a_trace_keeps_the_label_each_backend_gives_itself(fake_openai):
    class Lane(FunctionBackend):  # a backend class no picture knows
        @property
        def label(self) -> str:
            return "my lane"

    shout = models.Model(Lane(lambda p: p.upper(), name="shout", version="1"))
    chat = models.openai("gpt-x", base_url=fake_openai.base_url, api_key="sk-lanes", max_retries=0)
    q = outlines.string("q")
    with outlines.trace() as trace:
        outlines.eval(shout(q), chat(q), givens={q: "a"}, cache=False)
    assert sorted(trace.labels.values()) == ["my lane", "openai: gpt-x"]
    labels = re.findall(r'class="lane-label"[^>]*>([^<]*)<', timeline_svg(trace))
    assert {"my lane", "openai: gpt-x"} <= set(labels) and not any("127.0.0.1" in label for label in labels)


def test_a_real_trace_draws_every_batch(tmp_path):
    trace = real_trace()
    svg = timeline_svg(trace)
    python_nodes = [r for r in trace.nodes.values() if r.kind == "python"]
    assert len(trace.batches) == 3 and len(python_nodes) == 1  # 6 draws, at most 2 per call
    assert len(bars(svg)) == 4
    assert trace.timeline(tmp_path / "t.svg") == tmp_path / "t.svg"
    ET.parse(tmp_path / "t.svg")
    bundle = display.trace_mimebundle(trace)
    assert bundle["text/plain"] == trace.summary() and bundle["text/html"].count('<g class="bar') == 4


def test_trace_mimebundle_for_jupyter():
    bundle = display.trace_mimebundle(fake_trace())
    assert bundle["text/plain"] == "fake summary"
    assert bundle["text/html"].startswith('<div class="outlines-trace"><svg class="outlines-timeline"')
    assert "<script" not in bundle["text/html"] and "fake summary" in bundle["text/html"]
    assert display.trace_html(fake_trace()) == bundle["text/html"]


def test_an_empty_trace_still_draws():
    with outlines.trace() as trace:
        pass
    ET.fromstring(timeline_svg(trace))
    assert "<svg" in timeline_html(trace)


def chromium(tmp_path, *args):
    command = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=90, check=True)


@needs_chromium
def test_chromium_runs_the_page_and_finds_the_bars(tmp_path):
    path = write_timeline(fake_trace(), tmp_path / "timeline.html")
    dom = chromium(tmp_path, "--dump-dom", f"file://{path}").stdout
    assert '<body data-bars="5">' in dom  # set by the page's script after it ran
    assert dom.count('<g class="bar') == 5
    assert dom.count("data-details=") == 5  # the script moved each title into the tooltip data


@needs_chromium
def test_chromium_screenshot_shows_the_bars(tmp_path):
    path = write_timeline(fake_trace(), tmp_path / "timeline.html")
    shot = tmp_path / "timeline.png"
    chromium(tmp_path, f"--screenshot={shot}", "--window-size=1040,320", "--hide-scrollbars", f"file://{path}")
    width, height, pixels = read_png(shot.read_bytes())
    assert (width, height) == (1040, 320)
    bar_pixels = sum(1 for pixel in pixels if max(abs(a - b) for a, b in zip(pixel, UPPER_COLOUR)) <= 3)
    assert bar_pixels > 2000  # two batches of the first backend, each ~280 x 12 px


def read_png(data):
    """(width, height, [(r, g, b), ...]) of an 8-bit RGB or RGBA PNG; enough for Chromium's screenshots."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,), kind = struct.unpack(">I", data[offset:offset + 4]), data[offset + 4:offset + 8]
        chunks[kind] = chunks.get(kind, b"") + data[offset + 8:offset + 8 + length]
        offset += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert depth == 8 and colour in (2, 6) and interlace == 0
    channels = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(chunks[b"IDAT"]), width * channels
    previous, pixels = bytearray(stride), []
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        _unfilter(kind, line, previous, channels)
        pixels.extend(tuple(line[i:i + 3]) for i in range(0, stride, channels))
        previous = line
    return width, height, pixels


def _unfilter(kind, line, previous, channels):
    for i in range(len(line)):
        left = line[i - channels] if i >= channels else 0
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + previous[i]) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + previous[i]) // 2) & 0xFF
        elif kind == 4:
            corner = previous[i - channels] if i >= channels else 0
            line[i] = (line[i] + _paeth(left, previous[i], corner)) & 0xFF


def _paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def test_a_thousand_bars_draw_quickly():
    batches = [BatchRecord(i, f"FunctionBackend('m{i % 3}', 'h', True)", 8, i * 0.001, i * 0.001 + 0.05, [f"G#{i}"],
                           worker=f"tcp://127.0.0.1:{4000 + i % 4}") for i in range(1, 1001)]
    trace = SimpleNamespace(batches=batches, nodes={}, critical_path_nodes=["G#1000"], wall=1.05, critical_path=0.05)
    start = time.perf_counter()
    svg = timeline_svg(trace)
    assert time.perf_counter() - start < 2.0
    assert len(bars(svg)) == 1000 and svg.count("bar critical") == 1
    ET.fromstring(svg)


def _lane_of(svg, bar_title):
    """The label of the lane whose band holds the bar whose hover text starts with ``bar_title``."""
    lanes = [(float(y), name) for y, name in re.findall(r'<rect class="lane" x="0" y="([\d.]+)".*?\n<text class="lane-label"[^>]*>([^<]*)<', svg)]
    match = re.search(r'<g class="bar[^"]*"><rect x="[\d.]+" y="([\d.]+)"[^>]*>(?:<text[^<]*</text>)?<title>' + re.escape(bar_title), svg)
    y = float(match.group(1))
    return [name for top, name in lanes if top <= y][-1]


def _x_span(svg, bar_title):
    match = re.search(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*>(?:<text[^<]*</text>)?<title>' + re.escape(bar_title), svg)
    return float(match.group(1)), float(match.group(1)) + float(match.group(2))


def test_http_bars_start_and_end_when_the_requests_did():
    """One batch of three requests that a server served one after another: three consecutive bars."""
    backend = "OpenAIChatBackend('gpt-x', 'http://127.0.0.1:9')"
    trace = SimpleNamespace(
        batches=[BatchRecord(1, backend, 3, 0.0, 3.0, ["Generate#1"])],
        requests=[RequestRecord(1, 0.0, 1.0), RequestRecord(1, 1.0, 2.0),
                  RequestRecord(1, 2.0, 3.0, "HTTPError: 500")],
        nodes={}, model_loads=[], critical_path_nodes=[], wall=3.0, critical_path=3.0,
        labels={backend: "openai: gpt-x"})
    svg = timeline_svg(trace)
    spans = [_x_span(svg, f"request {i} of batch 1") for i in (1, 2, 3)]
    assert spans[0][0] < spans[1][0] < spans[2][0]  # not all at 0
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end == pytest.approx(start, abs=0.2)  # each starts where the previous ended
    assert all(_lane_of(svg, f"request {i} of batch 1") == "openai: gpt-x: requests" for i in (1, 2, 3))
    assert "FAILED: HTTPError: 500" in svg
    widths = [end - start for start, end in spans]
    assert max(widths) - min(widths) < 0.5


def test_model_load_is_its_own_bar_before_the_first_batch():
    backend = "TransformersBackend('/models/tiny', 'cpu', None)"
    trace = SimpleNamespace(
        batches=[BatchRecord(1, backend, 4, 5.0, 6.0, ["Generate#1"]), BatchRecord(2, backend, 4, 6.0, 7.0, ["Generate#1"])],
        model_loads=[ModelLoadRecord(backend, 0.0, 5.0)], requests=[], nodes={}, critical_path_nodes=[], wall=7.0, critical_path=7.0)
    svg = timeline_svg(trace)
    load, first = _x_span(svg, "loading the model of transformers: tiny"), _x_span(svg, "batch 1:")
    assert _lane_of(svg, "loading the model") == "transformers: tiny"
    assert load[1] == pytest.approx(first[0], abs=0.2)  # the batch starts when the load ended
    assert first[1] - first[0] == pytest.approx(_x_span(svg, "batch 2:")[1] - _x_span(svg, "batch 2:")[0], abs=0.2)


def test_a_real_trace_records_model_loads_through_the_recorder():
    upper = models.from_function(lambda ps: [p.upper() for p in ps], batched=True, name="upper")
    backend = upper(outlines.string("q")).owner.op.backend
    trace = Trace()
    recorder = trace.for_eval()
    recorder.model_loaded(backend, trace.origin + 0.5, trace.origin + 2.0)
    svg = timeline_svg(trace)
    assert _lane_of(svg, "loading the model of function: upper") == "function: upper"


def test_a_fully_cached_run_shows_its_cache_hits(tmp_path):
    from outlines.cache import Cache

    upper = models.from_function(lambda ps: [p.upper() for p in ps], batched=True, name="upper")
    q = outlines.string("q")
    cache = Cache(tmp_path / "cache")
    outlines.eval(upper(q, num_samples=2), givens={q: ["a", "b"]}, cache=cache)
    with outlines.trace() as trace:
        outlines.eval(upper(q, num_samples=2), givens={q: ["a", "b"]}, cache=cache)
    assert trace.batches == [] and trace.cache_hits == 4
    svg = timeline_svg(trace)
    assert _lane_of(svg, "Generate") == "function: upper: cache hits"
    assert "4 draw(s) from the cache, 0 sent" in svg
    assert 'class="bar mark"' in svg


def test_a_real_openai_run_draws_each_request_at_its_recorded_times(fake_openai):
    """The chat backend reports every wire request (``BatchReport.request``); with progress on, the
    ``Counter`` in front of the trace passes them on, and each becomes a bar at its own times."""
    fake_openai.latency = 0.05
    llm = models.openai("fake-model", base_url=fake_openai.base_url, api_key="sk-timeline", max_retries=0)
    q = outlines.string("q")
    with outlines.trace() as trace:
        llm(q).eval({"q": ["a", "b", "c"]}, cache=False, max_concurrency=1, progress=True)
    (batch,) = trace.batches
    assert len(trace.requests) == 3 == len(fake_openai.requests)
    starts = [r.start for r in trace.requests]
    assert starts == sorted(starts) and starts[-1] - starts[0] >= 0.09  # one after another, not all at once
    assert all(batch.start <= r.start <= r.end <= batch.end for r in trace.requests)
    svg = timeline_svg(trace)
    assert "sk-timeline" not in svg
    spans = []
    for number, request in enumerate(trace.requests, 1):
        title = f"request {number} of batch {batch.id}"
        assert _lane_of(svg, title) == "openai: fake-model: requests"
        assert f"{request.start:.3f} s to {request.end:.3f} s" in svg
        spans.append(_x_span(svg, title))
    whole = _x_span(svg, f"batch {batch.id}:")
    scale = (whole[1] - whole[0]) / (batch.end - batch.start)
    for (left, right), request in zip(spans, trace.requests):
        # Where the bar is drawn is where the request was recorded, within a pixel or two.
        assert left - whole[0] == pytest.approx((request.start - batch.start) * scale, abs=2.0)
        assert right - whole[0] == pytest.approx((request.end - batch.start) * scale, abs=2.0)


@pytest.mark.slow
def test_a_real_transformers_run_draws_its_model_load(tiny_model_path):
    from outlines.backends.transformers import clear_registry

    clear_registry()
    llm = models.transformers(tiny_model_path, device="cpu", max_tokens=2, temperature=0)
    q = outlines.string("q")
    with outlines.trace() as trace:
        llm(q).eval({"q": ["load me"]}, cache=False, progress=True)
        llm(q).eval({"q": ["loaded"]}, cache=False)
    (load,) = trace.model_loads
    assert len(trace.batches) == 2 and trace.batches[0].start <= load.start < load.end <= trace.batches[0].end
    svg = timeline_svg(trace)
    lane = _lane_of(svg, "loading the model of transformers")
    assert lane == _lane_of(svg, "batch 1:") and lane.startswith("transformers")
    assert f"{load.start:.3f} s to {load.end:.3f} s" in svg
    assert "model load" in trace.summary()
