"""Walking graphs: one generic iterative walk and thin helpers around it.

Nothing here recurses, so a chain 100,000 nodes deep is fine. Every result is
in a deterministic order (creation order breaks ties), never set order.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Callable, Container, Iterable, Iterator, Sequence

from outlines.common.errors import GraphBuildError
from outlines.graph.basic import Apply, Constant, Variable

__all__ = ["ancestors", "applies", "find_cycle", "graph_inputs", "rewired_error", "toposort", "walk"]


def walk(
    roots: Iterable[Variable],
    expand: Callable[[Variable], Sequence[Variable]],
) -> Iterator[Variable]:
    """Yield every Variable reachable from ``roots`` through ``expand``, once each."""
    seen: set[int] = set()
    stack = list(reversed(list(roots)))
    while stack:
        variable = stack.pop()
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        yield variable
        stack.extend(reversed(expand(variable)))


def _parents(variable: Variable) -> Sequence[Variable]:
    return variable.owner.inputs if variable.owner is not None else ()


def ancestors(variables: Iterable[Variable]) -> list[Variable]:
    """Every Variable that ``variables`` depend on, themselves included.

    Parameters
    ----------
    variables
        Where the walk starts.

    Returns
    -------
    list of Variable
        Each once, depth first from the first of ``variables`` (a Variable
        before its inputs), in the same order on every run.

    Examples
    --------
    >>> import outlines
    >>> question = outlines.string("question")
    >>> [v.label for v in ancestors([question + "?"])]  # doctest: +ELLIPSIS
    ['Concat#...', 'question', "'?'"]
    """
    return list(walk(variables, _parents))


def graph_inputs(variables: Iterable[Variable]) -> list[Variable]:
    """The free inputs (not Constants) that ``variables`` depend on.

    These are what ``givens`` must bind when ``variables`` are evaluated.

    Parameters
    ----------
    variables
        The outputs of interest.

    Returns
    -------
    list of Variable
        The Variables without an owner that are not ``Constant``, in the order
        of ``ancestors``.

    Examples
    --------
    >>> import outlines
    >>> question, style = outlines.string("question"), outlines.string("style")
    >>> [v.name for v in graph_inputs([style + ": " + question])]
    ['style', 'question']
    """
    return [v for v in ancestors(variables) if v.owner is None and not isinstance(v, Constant)]


def toposort(outputs: Iterable[Variable]) -> list[Apply]:
    """The Apply nodes needed for ``outputs``, each after all of its inputs' owners.

    An Apply's inputs exist before it is created, so creation order is a
    topological order; sorting by it makes the result the same on every run.
    The walk is iterative (a chain 100,000 deep is fine).

    Parameters
    ----------
    outputs
        The Variables to compute.

    Returns
    -------
    list of Apply
        Every node ``outputs`` depend on, in creation order.

    Examples
    --------
    >>> import outlines
    >>> question = outlines.string("question")
    >>> [node.op.name for node in toposort([(question + "?") + "!"])]
    ['Concat', 'Concat']
    """
    # Keyed by the nodes themselves: an Apply hashes and compares by identity, in C (no id() calls);
    # a dict, not a set, so nodes sharing an order (rebuilt by a plan) keep the walk's order.
    seen: dict[Apply, None] = {}
    stack = [v.owner for v in outputs if v.owner is not None]
    pop, push = stack.pop, stack.append
    while stack:
        node = pop()
        if node in seen:
            continue
        seen[node] = None
        for variable in node.inputs:
            owner = variable.owner
            if owner is not None and owner not in seen:
                push(owner)
    return sorted(seen, key=_order)


def applies(outputs: Iterable[Variable]) -> list[Apply]:
    """The Apply nodes needed for ``outputs`` in creation order (same as ``toposort``).

    Parameters
    ----------
    outputs
        The Variables to compute.

    Returns
    -------
    list of Apply
        As ``toposort``.

    Examples
    --------
    >>> import outlines
    >>> len(applies([outlines.string("q") + "?"]))
    1
    """
    return toposort(outputs)


#: An Apply's creation order, read in C (a sort key called once per node of graphs of 100k nodes).
_order: Callable[[Apply], int] = attrgetter("order")


def find_cycle(start: Apply) -> list[Apply] | None:
    """A cycle among ``start`` and the nodes it reads, in dataflow order (each feeds the next, the last the first).

    Only a graph whose ``inputs`` were changed after it was built can have
    one: an Apply's inputs exist before it. ``None`` when there is none.
    """
    path = [start]  # path[i + 1] computes an input of path[i]
    on_path = {id(start): 0}
    pending = [iter(start.inputs)]
    finished: set[int] = set()
    while pending:
        variable = next(pending[-1], None)
        if variable is None:
            node = path.pop()
            pending.pop()
            del on_path[id(node)]
            finished.add(id(node))
            continue
        owner = variable.owner
        if owner is None or id(owner) in finished:
            continue
        if id(owner) in on_path:  # path[-1] reads owner, which reads ... path[-1]
            first = on_path[id(owner)]
            return [owner] + path[first + 1 :][::-1]
        on_path[id(owner)] = len(path)
        path.append(owner)
        pending.append(iter(owner.inputs))
    return None


def rewired_error(node: Apply, placed: Container[int]) -> GraphBuildError:
    """Why ``node`` reads an input not computed before it (``placed``: ids of the nodes that are).

    A walk in creation order finds this only in a graph rewired after it was
    built: the error names the cycle it makes, or the input built later.
    """
    cycle = find_cycle(node)
    if cycle is not None:
        loop = " -> ".join(n.label for n in cycle + cycle[:1])
        return GraphBuildError(
            f"the graph has a cycle: {loop} (each node reads the one before it); a node's inputs were "
            "changed after it was built, and a value cannot depend on itself"
        )
    later = next(v.owner for v in node.inputs if v.owner is not None and id(v.owner) not in placed)
    return GraphBuildError(
        f"{node.label} reads {later.label}, which was built after it: the graph was rewired after it was "
        "built (Apply.inputs changed); build each node from inputs that exist already"
    )
