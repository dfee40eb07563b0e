"""``to_networkx``: node attributes and ordered edges for users' own analysis."""
from __future__ import annotations

import networkx

import outlines
from outlines import models
from outlines.graph.viz.nx import to_networkx


@outlines.prompt
def ask(question, style):
    """{{ style }}: {{ question }}"""


def build():
    question = outlines.string("question")
    llm = models.openai("gpt-x", api_key="sk-SECRET-nx-0123456789", base_url="http://127.0.0.1:9",
                        max_retries=0, temperature=0.5)
    upper = models.from_function(lambda p: p.upper(), name="upper")

    @outlines.fn(signature="(n),()->()")
    def vote(answers, fallback):
        return answers[0] or fallback

    prompt = ask(question, "terse")
    return question, vote(llm(prompt, num_samples=4), upper(prompt))


def test_nodes_carry_op_kind_backend_and_params():
    _, out = build()
    graph = to_networkx(out)
    assert isinstance(graph, networkx.DiGraph)
    assert networkx.is_directed_acyclic_graph(graph)
    assert graph.number_of_nodes() == 6 and graph.number_of_edges() == 6
    data = dict(graph.nodes(data=True))
    assert data["question"]["kind"] == "input" and data["question"]["op"] is None
    (model,) = [n for n, d in data.items() if d["backend"] == "openai: gpt-x"]
    assert model.startswith("Generate[openai:gpt-x]#")
    assert data[model]["op"] == "Generate" and data[model]["kind"] == "model"
    assert data[model]["params"] == {"temperature": 0.5} and data[model]["num_samples"] == 4
    (render,) = [n for n, d in data.items() if d["kind"] == "prompt"]
    assert render.startswith("Render[ask]#") and data[render]["title"] == "prompt ask"
    (vote,) = [n for n, d in data.items() if d["kind"] == "python"]
    assert data[vote]["op"] == "CallFunction" and data[vote]["output"] is True
    assert sum(d["output"] for d in data.values()) == 1


def test_edges_are_in_argument_order_with_positions():
    _, out = build()
    graph = to_networkx(out)
    (vote,) = [n for n, d in graph.nodes(data=True) if d["kind"] == "python"]
    arguments = list(graph.pred[vote])
    assert [graph.nodes[a]["backend"] for a in arguments] == ["openai: gpt-x", "function: upper"]
    assert [graph.edges[a, vote]["position"] for a in arguments] == [0, 1]
    assert [graph.edges[a, vote]["name"] for a in arguments] == ["answers", "fallback"]
    (render,) = [n for n, d in graph.nodes(data=True) if d["kind"] == "prompt"]
    assert [graph.edges[a, render]["name"] for a in graph.pred[render]] == ["question", "style"]
    assert list(networkx.topological_sort(graph))[-1] == vote


def test_a_value_used_twice_is_one_edge_with_both_positions():
    word = outlines.string("word")
    graph = to_networkx(word + word)
    ((source, _, data),) = graph.edges(data=True)
    assert source == "word" and data["positions"] == [0, 1] and data["position"] == 0


def test_shared_subgraphs_are_one_node_and_secrets_stay_out():
    question, out = build()
    other = models.from_function(lambda p: p, name="echo")(ask(question, "long"))
    graph = to_networkx(out, other)
    assert sum(1 for _, d in graph.nodes(data=True) if d["kind"] == "input") == 1
    assert sum(1 for _, d in graph.nodes(data=True) if d["output"]) == 2
    assert "SECRET" not in repr(graph.nodes(data=True)) + repr(graph.edges(data=True))


def test_with_a_trace_nodes_carry_their_status():
    question = outlines.string("q")
    upper = models.from_function(lambda p: p.upper(), name="upper")
    out = upper(question + "!")
    with outlines.trace() as trace:
        outlines.eval(out, givens={question: "hi"}, cache=False)
    data = dict(to_networkx(out, trace=trace).nodes(data=True))
    (model,) = [d for d in data.values() if d["kind"] == "model"]
    assert model["failed"] is False and any(s.startswith("batch 1 (size 1)") for s in model["status"])
