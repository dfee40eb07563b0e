"""The symbolic graph: Variables, Apply nodes, Ops, and traversal."""
from outlines.graph.basic import Apply, Constant, Op, SymbolicValueError, Variable, as_variable
from outlines.graph.traversal import ancestors, applies, graph_inputs, toposort

__all__ = [
    "Apply",
    "Constant",
    "Op",
    "SymbolicValueError",
    "Variable",
    "ancestors",
    "applies",
    "as_variable",
    "graph_inputs",
    "to_networkx",
    "toposort",
]


def to_networkx(*variables, **kwargs):  # noqa: ANN001, ANN201, ANN003 - see outlines.graph.viz.nx.to_networkx
    """The graph of ``variables`` as a ``networkx.DiGraph``; see ``outlines.graph.viz.nx``."""
    from outlines.graph.viz.nx import to_networkx as _to_networkx

    return _to_networkx(*variables, **kwargs)
