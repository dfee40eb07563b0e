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
    """The graph computing ``variables`` as a ``networkx.DiGraph``.

    Nodes are keyed by their label (``Apply.label`` such as ``"Render[solve]#3"``,
    an input's name, or a constant's short value; repeated input or constant
    labels get a ``~2`` suffix). Edges go from an argument to its consumer and
    are added in argument order, so ``graph.pred[node]`` lists arguments in order.

    Parameters
    ----------
    *variables
        The outputs; everything they depend on is included once.
    trace
        Optional ``Trace``: nodes then also carry ``status`` and ``failed``.

    Returns
    -------
    networkx.DiGraph
        Node attributes: ``label``, ``op`` (the Op class name, ``None`` for
        inputs), ``kind`` (input, constant, prompt, model, python, op),
        ``title``, ``backend`` (``"kind: model"`` or ``None``), ``params`` (the
        generation parameters), ``num_samples``, ``output``. Edge attributes:
        ``position`` (the first argument index), ``positions`` (every index,
        when a value is passed twice) and ``name`` (the parameter name).

    Examples
    --------
    >>> import outlines
    >>> question = outlines.string("question")
    >>> graph = to_networkx(question + "?")
    >>> sorted(graph.nodes)  # doctest: +ELLIPSIS
    ["'?'", 'Concat#...', 'question']
    """
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
