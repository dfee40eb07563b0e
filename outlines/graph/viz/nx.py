"""The graph of some Variables as a ``networkx.DiGraph``, for users' own analysis.

Built from the same ``describe`` as the pictures, so node names, backends and
parameters agree with what ``visualize`` draws, and no secret is ever copied.
"""
from __future__ import annotations

from typing import Any

from outlines.graph.basic import Variable
from outlines.graph.viz.drawing import describe

__all__ = ["to_networkx"]


def to_networkx(*variables: Variable, trace: Any = None) -> Any:
    """``outlines.graph.to_networkx``: documented there (the public name), implemented here."""
    import networkx

    drawing = describe(*variables, trace=trace)
    graph = networkx.DiGraph()
    labels = {}
    for node in drawing.nodes:
        labels[node.key] = node.label
        attributes: dict[str, Any] = {
            "label": node.label,
            "op": node.op,
            "kind": node.kind,
            "title": node.title,
            "backend": node.backend,
            "params": dict(node.params),
            "num_samples": node.num_samples,
            "output": node.output,
        }
        if trace is not None:
            attributes.update(status=list(node.status), failed=node.failed)
        graph.add_node(node.label, **attributes)
    for source, target, position, name in drawing.edges:
        u, v = labels[source], labels[target]
        if graph.has_edge(u, v):
            graph.edges[u, v]["positions"].append(position)
        else:
            graph.add_edge(u, v, position=position, positions=[position], name=name)
    return graph
