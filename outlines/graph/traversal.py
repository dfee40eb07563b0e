"""Walking graphs: one generic iterative walk and thin helpers around it.

Nothing here recurses, so a chain 100,000 nodes deep is fine. Every result is
in a deterministic order (creation order breaks ties), never set order.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator, Sequence

from outlines.graph.basic import Apply, Constant, Variable

__all__ = ["ancestors", "applies", "graph_inputs", "toposort", "walk"]


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
    """Every Variable that ``variables`` depend on, themselves included."""
    return list(walk(variables, _parents))


def graph_inputs(variables: Iterable[Variable]) -> list[Variable]:
    """The free inputs (not Constants) that ``variables`` depend on."""
    return [v for v in ancestors(variables) if v.owner is None and not isinstance(v, Constant)]


def toposort(outputs: Iterable[Variable]) -> list[Apply]:
    """The Apply nodes needed for ``outputs``, each after all of its inputs' owners.

    Kahn's algorithm over in-degree counters; ties are broken by creation order,
    so the order is the same on every run.
    """
    nodes: dict[int, Apply] = {}
    for variable in ancestors(outputs):
        if variable.owner is not None:
            nodes.setdefault(id(variable.owner), variable.owner)
    indegree: dict[int, int] = {}
    consumers: dict[int, list[Apply]] = {key: [] for key in nodes}
    for key, node in nodes.items():
        parents = {id(v.owner): v.owner for v in node.inputs if v.owner is not None}
        indegree[key] = len(parents)
        for parent_key in parents:
            consumers[parent_key].append(node)
    ready = deque(sorted((n for k, n in nodes.items() if indegree[k] == 0), key=_order))
    result: list[Apply] = []
    while ready:
        node = ready.popleft()
        result.append(node)
        for consumer in consumers[id(node)]:
            indegree[id(consumer)] -= 1
            if indegree[id(consumer)] == 0:
                ready.append(consumer)
    return result


def applies(outputs: Iterable[Variable]) -> list[Apply]:
    """The Apply nodes needed for ``outputs`` in creation order."""
    return sorted(toposort(outputs), key=_order)


def _order(node: Apply) -> int:
    return node.order
