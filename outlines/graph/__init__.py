"""The symbolic graph: Variables, Apply nodes, Ops, and traversal."""
from __future__ import annotations

from typing import Any

from outlines.graph.basic import Apply, Constant, Op, SymbolicValueError, Variable, as_variable
from outlines.graph.traits import Run, Traits
from outlines.graph.traversal import ancestors, applies, graph_inputs, toposort

__all__ = [
    "Apply",
    "Constant",
    "Op",
    "Run",
    "SymbolicValueError",
    "Traits",
    "Variable",
    "ancestors",
    "applies",
    "as_variable",
    "graph_inputs",
    "to_networkx",
    "toposort",
]


def to_networkx(*variables: Variable, trace: Any = None) -> Any:
    """The graph computing ``variables`` as a ``networkx.DiGraph``, for your own analysis.

    Built from the same description as ``outlines.visualize``, so node names,
    backends and parameters agree with the pictures, and no secret is ever
    copied. Nodes are keyed by their label (``Apply.label`` such as
    ``"Render[solve]#3"``, an input's name, or a constant's short value;
    repeated input or constant labels get a ``~2`` suffix). Edges go from an
    argument to its consumer and are added in argument order, so
    ``graph.pred[node]`` lists arguments in order.

    Parameters
    ----------
    *variables
        The outputs; everything they depend on is included once.
    trace
        Optional ``Trace`` (``outlines.trace()``): nodes then also carry
        ``status`` and ``failed``.

    Returns
    -------
    networkx.DiGraph
        Node attributes: ``label``, ``op`` (the Op class name, ``None`` for
        inputs), ``kind`` (input, constant, prompt, model, python, op),
        ``title``, ``backend`` (``"kind: model"`` or ``None``), ``params`` (the
        generation parameters), ``num_samples``, ``output``. Edge attributes:
        ``position`` (the first argument index), ``positions`` (every index,
        when a value is passed twice) and ``name`` (the parameter name).

    Raises
    ------
    ImportError
        When ``networkx`` is not installed.

    Examples
    --------
    >>> import outlines
    >>> from outlines.graph import to_networkx
    >>> question = outlines.string("question")
    >>> graph = to_networkx(question + "?")
    >>> sorted(graph.nodes)  # doctest: +ELLIPSIS
    ["'?'", 'Concat#...', 'question']
    >>> graph.nodes["question"]["kind"]
    'input'
    """
    from outlines.graph.viz.nx import to_networkx as _to_networkx

    return _to_networkx(*variables, trace=trace)
