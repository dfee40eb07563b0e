"""Pictures of graphs: the description, each format's content, traces, secrets, speed."""
from __future__ import annotations

import html
import pathlib
import re
import shutil
import sys
import time
import xml.etree.ElementTree as ET

import pytest

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.graph.viz import jupyter as display
from outlines.graph.viz import writers as viz
from outlines.graph.viz.drawing import describe
from outlines.graph.viz.nx import to_networkx
from outlines.graph.viz.writers import TextPicture, to_ascii, to_mermaid

SECRET = "sk-SECRET-do-not-show-0123456789"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="the Graphviz `dot` program is not installed "
                               "(apt-get install graphviz; CI installs it with scripts/setup.sh --system)")


@outlines.prompt
def solve(question):
    """Q: {{ question }}
    A: Let's think step by step."""


@outlines.fn(signature="(n),()->()")
def majority(answers, other):
    return max(set(answers), key=list(answers).count) + other


def small_graph():
    """question -> solve (shared) -> openai x3 -> majority <- upper(solve + '!')."""
    question = outlines.string("question")
    llm = models.openai("gpt-x", api_key=SECRET, base_url="http://127.0.0.1:9", max_retries=0, temperature=0.7, max_tokens=128)
    upper = models.from_function(lambda p: p.upper(), name="upper")
    prompt = solve(question)
    best = majority(llm(prompt, num_samples=3), upper(prompt + "!"))
    return question, best


def test_describe_draws_each_node_once_with_edges_in_argument_order():
    _, best = small_graph()
    drawing = describe(best)
    kinds = [node.kind for node in drawing.nodes]
    assert sorted(kinds) == sorted(["input", "constant", "prompt", "model", "op", "model", "python"])
    titles = {node.title for node in drawing.nodes}
    assert {"question", "'!'", "prompt solve", "openai: gpt-x", "function: upper", "+ (concat)", "majority"} <= titles
    assert len(drawing.edges) == 7
    by_key = {node.key: node for node in drawing.nodes}
    into_majority = [(by_key[s].title, position, label) for s, t, position, label in drawing.edges
                     if by_key[t].title == "majority"]
    assert into_majority == [("openai: gpt-x", 0, "answers"), ("function: upper", 1, "other")]
    model = next(node for node in drawing.nodes if node.backend == "openai: gpt-x")
    assert model.params == {"max_tokens": 128, "temperature": 0.7} and model.num_samples == 3
    assert drawing.backends == ["openai: gpt-x", "function: upper"]
    assert [node.title for node in drawing.nodes if node.output] == ["majority"]


def test_ascii_lists_nodes_inputs_and_the_legend():
    _, best = small_graph()
    text = outlines.visualize(best, format="ascii")
    assert text.isascii()
    assert text.startswith("outlines graph: 7 nodes, 7 edges\n")
    assert re.search(r"\[\d\] prompt +solve  \"Q: \{\{ question \}\} A: Let's think", text)
    assert re.search(r"openai: gpt-x \{A\}  max_tokens=128, temperature=0\.7  num_samples=3", text)
    assert re.search(r"majority  \(n\),\(\)->\(\)  => output\n +<- answers=\[\d\], other=\[\d\]", text)
    assert text.rstrip().endswith("backends: {A} openai: gpt-x, {B} function: upper")


def test_mermaid_has_every_node_edge_and_a_legend():
    _, best = small_graph()
    text = outlines.visualize(best, format="mermaid")
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert sum("-->" in line for line in lines) == 7
    assert '-->|"answers"|' in text and '-->|"other"|' in text
    assert 'subgraph legend ["backends"]' in text
    assert re.search(r'legend0\["openai: gpt-x"\]:::backend0', text)
    assert re.search(r'legend1\["function: upper"\]:::backend1', text)
    assert text.count("classDef backend") == 2
    assert "&quot;Q: {{ question }} A: Let's think" in text  # quotes escaped inside the label
    assert "(n),()-&gt;()" in text
    for line in lines[1:]:  # every node line is `key<shape>"label"<shape>`: quotes balanced
        assert line.count('"') % 2 == 0, line


def test_mermaid_labels_hold_any_text():
    """Checked once by rendering with mermaid 11 in Chromium; here: the escaping rule."""

    @outlines.prompt
    def tricky(x):
        """He said "{{ x }}" <b>bold</b> & #hash; `code` {curly} [square] | pipe ; ñ 日本"""

    text = outlines.visualize(tricky(outlines.string('in"put#1')) + 'end"|', format="mermaid")
    labels = re.findall(r'^    n\d+\W+"(.*)"\W*$', text, re.MULTILINE)
    assert len(labels) == 4
    for label in labels:
        assert '"' not in label and "#" not in label
    assert "He said &quot;{{ x }}&quot; &lt;b&gt;bold&lt;/b&gt; &amp; &num;hash" in text


def test_dot_source_needs_no_program(tmp_path):
    _, best = small_graph()
    graph = outlines.visualize(best, filename=str(tmp_path / "chain.dot"))
    source = (tmp_path / "chain.dot").read_text()
    assert source == graph.source
    assert source.count(" -> ") == 7
    assert "subgraph cluster_legend" in source and 'label="openai: gpt-x"' in source
    assert "<b>prompt solve</b>" in source and "<b>majority</b>" in source
    assert re.search(r'fillcolor="#8dd3c7" shape=box', source)


def test_format_comes_from_format_or_extension(tmp_path):
    question = outlines.string("q")
    out = question + "?"
    assert outlines.visualize(out, filename=str(tmp_path / "g.txt")).startswith("outlines graph")
    assert outlines.visualize(out, filename=str(tmp_path / "g.mmd")).startswith("flowchart TD")
    assert (tmp_path / "g.md").exists() is False
    outlines.visualize(out, filename=str(tmp_path / "g.md"))
    assert (tmp_path / "g.md").read_text().startswith("```mermaid\nflowchart TD")
    assert outlines.visualize(out, filename=str(tmp_path / "g.anything"), format="ascii").startswith("outlines")
    with pytest.raises(ValueError, match="cannot tell the format"):
        outlines.visualize(out, filename=str(tmp_path / "g.xyz"))
    with pytest.raises(ValueError, match="unknown format 'jpeg'"):
        outlines.visualize(out, format="jpeg")
    with pytest.raises(TypeError, match="nothing to draw"):
        outlines.visualize(format="ascii")
    with pytest.raises(TypeError, match="visualize draws Variables; got str"):
        outlines.visualize("not a graph", format="ascii")


@needs_dot
def test_svg_is_valid_xml_with_every_node(tmp_path):
    _, best = small_graph()
    outlines.visualize(best, filename=str(tmp_path / "chain.svg"))
    root = ET.parse(tmp_path / "chain.svg").getroot()
    ns = {"svg": "http://www.w3.org/2000/svg"}
    groups = root.findall(".//svg:g", ns)
    nodes = [g for g in groups if g.get("class") == "node"]
    edges = [g for g in groups if g.get("class") == "edge"]
    assert len(nodes) == 7 + 2  # the graph and two legend boxes
    assert len(edges) == 7
    text = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "prompt solve" in text and "openai: gpt-x" in text and "backends" in text


@needs_dot
@pytest.mark.parametrize("extension, magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF")])
def test_png_and_pdf_are_rendered(tmp_path, extension, magic):
    _, best = small_graph()
    path = tmp_path / f"chain{extension}"
    outlines.visualize(best, filename=str(path))
    assert path.read_bytes().startswith(magic)


def test_missing_dot_names_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"apt-get install graphviz.*conda install graphviz"):
        outlines.visualize(outlines.string("q") + "!", filename=str(tmp_path / "g.svg"))
    assert not (tmp_path / "g.svg").exists()


def test_missing_graphviz_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError, match=re.escape("pip install -e '.[viz]' in a checkout of outlines-dataflow")):
        outlines.visualize(outlines.string("q") + "!")
    assert outlines.visualize(outlines.string("q") + "!", format="mermaid").startswith("flowchart")


def test_the_api_key_is_never_shown(tmp_path):
    question, best = small_graph()
    with outlines.trace() as trace:
        outlines.eval(best, givens={question: "x"}, cache=False, errors="return")
    texts = [outlines.visualize(best, format=f, trace=trace) for f in ("ascii", "mermaid")]
    texts.append(outlines.visualize(best, trace=trace).source)
    texts.append(str(to_networkx(best, trace=trace).nodes(data=True)))
    texts.extend(display.mimebundle(best).values())
    texts.extend(display.trace_mimebundle(trace).values())
    trace.timeline(tmp_path / "t.html")
    texts.append((tmp_path / "t.html").read_text())
    for text in texts:
        assert SECRET not in text and "SECRET" not in text


def test_key_like_text_is_redacted_from_constants():
    text = outlines.visualize(outlines.constant("key sk-abcdef123456") + "!", format="ascii")
    assert "sk-abcdef" not in text and "sk-***" in text


def test_pictures_ask_each_backend_to_redact_its_own_secrets():
    # Neither key looks like one (no sk-, no Bearer): only the backends' own redact hooks know them,
    # for a model in the graph, one inside a loop's body, and the members of a fallback chain.
    plain, member = "hunter2-plain-secret", "correct-horse-staple"
    direct = models.openai("gpt-x", api_key=plain, base_url="http://127.0.0.1:9", max_retries=0)
    spare = models.openai("gpt-y", api_key=member, base_url="http://127.0.0.1:9", max_retries=0)
    chain = models.fallback(direct, spare)
    question = outlines.string("question")
    looped = outlines.while_loop(lambda s: outlines.fn(lambda t: len(t) < 9)(s),
                                 lambda s: s + spare(outlines.constant(f"say {member}")), init="", max_iter=2)
    out = chain(question + f" (not {plain})") + direct(outlines.constant(f"{plain} {member}")) + looped
    texts = [str(outlines.visualize(out, format=f)) for f in ("ascii", "mermaid")]
    texts.append(str(to_networkx(out).nodes(data=True)))
    for text in texts:
        assert plain not in text and member not in text and "***" in text
    assert "fallback: gpt-x" in texts[0] and "openai: gpt-y" in texts[0]


def test_trace_shows_time_batch_and_cache(tmp_path):
    question = outlines.string("question")
    upper = models.from_function(lambda p: p.upper(), name="upper")
    out = upper(solve(question), num_samples=2)
    cache = Cache(tmp_path)
    outlines.eval(out, givens={question: ["a", "b"]}, cache=cache)
    with outlines.trace() as trace:
        outlines.eval(out, givens={question: ["a", "b", "c"]}, cache=cache)
    text = outlines.visualize(out, format="ascii", trace=trace)
    assert re.search(r"[\d.]+ ms \| batch \d+ \(size 2\) \| cache 4 hit / 2 miss", text), text
    assert re.search(r"prompt +solve.*\n.*\n +[\d.]+ ms\n", text)
    mermaid = outlines.visualize(out, format="mermaid", trace=trace)
    assert "cache 4 hit / 2 miss" in mermaid


def test_trace_shows_failures_in_red_with_the_first_line():
    question = outlines.string("question")

    def explode(prompt):
        raise ValueError("the model broke\nsecond line never shown")

    out = models.from_function(explode, name="explode")(question + "!")
    with outlines.trace() as trace:
        outlines.eval(out, givens={question: "x"}, cache=False, errors="return")
    text = outlines.visualize(out, format="ascii", trace=trace)
    assert "!! FAILED: ValueError: the model broke" in text and "second line" not in text
    source = outlines.visualize(out, trace=trace).source
    assert 'fillcolor="#ffd6d6"' in source and 'color="#d62728"' in source
    assert "FAILED: ValueError: the model broke" in source
    assert re.search(r"class n\d failed", outlines.visualize(out, format="mermaid", trace=trace))


def test_nodes_not_in_the_trace_say_so():
    question = outlines.string("question")
    with outlines.trace() as trace:
        pass
    assert "not run" in outlines.visualize(question + "!", format="ascii", trace=trace)


def test_programs_and_variables_draw_themselves(monkeypatch):
    program = outlines.compile(lambda question: solve(question) + "!")
    assert "prompt   solve" in outlines.visualize(program, format="ascii")
    assert "prompt   solve" in program.visualize(format="ascii")
    monkeypatch.setattr(display.shutil, "which", lambda name: None)
    bundle = program._repr_mimebundle_()
    assert bundle["text/markdown"].startswith("```mermaid\nflowchart TD") and "image/svg+xml" not in bundle
    assert bundle["text/plain"].startswith("outlines graph: 4 nodes")
    assert outlines.string("q")._repr_mimebundle_()["text/plain"].startswith("outlines graph: 1 nodes")
    pair = outlines.compile(lambda a, b: (a + "!", b + "?"))
    text = outlines.visualize(pair, format="ascii")
    assert text.startswith("outlines graph: 6 nodes, 4 edges") and text.count("=> output") == 2


@needs_dot
def test_jupyter_gets_svg_when_dot_works():
    _, best = small_graph()
    bundle = best._repr_mimebundle_()
    ET.fromstring(bundle["image/svg+xml"])
    assert "text/plain" in bundle and "text/markdown" not in bundle


def test_multiple_outputs_and_repeated_arguments():
    @outlines.fn(signature="()->(),()")
    def split(text):
        return text[:1], text[1:]

    head, tail = split(outlines.string("word"))
    drawing = describe(tail + head + tail)
    labels = [label for _, _, _, label in drawing.edges]
    assert labels.count("0 (output 1)") == 1 and labels.count("1 (output 0)") == 1
    assert to_ascii(drawing).count("[2]") >= 3  # split drawn once, used three times


def wide_graph(n_layers=100):
    question = outlines.string("question")
    upper = models.from_function(lambda p: p.upper(), name="upper")

    @outlines.fn
    def pick(a, b):
        return a or b

    current = question
    for _ in range(n_layers):  # five nodes a layer
        current = pick(upper(current + "x"), current + "y")
    return current


def test_a_500_node_graph_is_quick():
    out = wide_graph()
    start = time.perf_counter()
    drawing = describe(out)
    texts = [to_ascii(drawing), to_mermaid(drawing), viz.to_graphviz(drawing).source]
    elapsed = time.perf_counter() - start
    # the input, then per layer: +, model, +, pick ("x" and "y" repeat: written inside the + nodes)
    assert len(drawing.nodes) == 1 + 4 * 100
    assert elapsed < 1.0, elapsed
    assert texts[0].count("\n") > 500


@needs_dot
def test_a_500_node_graph_renders_to_svg_in_seconds(tmp_path):
    out = wide_graph()
    start = time.perf_counter()
    outlines.visualize(out, filename=str(tmp_path / "big.svg"))
    assert time.perf_counter() - start < 5.0
    ET.parse(tmp_path / "big.svg")


def test_a_very_deep_chain_does_not_recurse():
    current = outlines.string("q")
    for _ in range(5000):
        current = current + "!"
    # the repeated "!" is written inside each + node rather than boxed 5000 times
    assert outlines.visualize(current, format="ascii").startswith("outlines graph: 5001 nodes, 5000 edges")


@needs_dot
def test_the_readme_pictures_script_runs_the_example(tmp_path):
    import runpy

    script = runpy.run_path(str(pathlib.Path(__file__).parents[3] / "scripts" / "make_pictures.py"))
    paths = script["main"](tmp_path, samples=3)
    assert [p.name for p in paths] == ["self_consistency_graph.mmd", "self_consistency_graph.svg",
                                       "self_consistency_timeline.svg", "self_consistency_trace.svg"]
    for path in paths:
        if path.suffix == ".svg":
            ET.parse(path)
    assert "batch 1 (size 9)" in (tmp_path / "self_consistency_trace.svg").read_text()


# -- text pictures: str values that Jupyter shows as their lines --------------------------
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
