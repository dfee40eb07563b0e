"""Traversal: ancestors, graph inputs, and an iterative, deterministic toposort."""
from __future__ import annotations

import outlines
from outlines.graph import ancestors, applies, graph_inputs, toposort


def test_graph_inputs_excludes_constants_and_keeps_order():
    a, b = outlines.string("a"), outlines.string("b")
    out = (a + "-") + (b + a)
    assert graph_inputs([out]) == [a, b]


def test_toposort_puts_every_node_after_its_inputs():
    a = outlines.string("a")
    left, right = a + "l", a + "r"
    out = left + right
    order = toposort([out])
    position = {id(n): i for i, n in enumerate(order)}
    for node in order:
        for v in node.inputs:
            if v.owner is not None:
                assert position[id(v.owner)] < position[id(node)]
    assert order[-1] is out.owner and len(order) == 3


def test_toposort_is_deterministic():
    a = outlines.string("a")
    outs = [a + str(i) for i in range(20)]
    total = outs[0]
    for o in outs[1:]:
        total = total + o
    assert [n.order for n in toposort([total])] == [n.order for n in toposort([total])]
    assert [n.order for n in applies([total])] == sorted(n.order for n in toposort([total]))


def test_a_chain_100k_deep_does_not_recurse():
    x = outlines.string("x")
    y = x
    for _ in range(100_000):
        y = y + ""
    assert len(toposort([y])) == 100_000
    assert len(ancestors([y])) == 100_000 * 2 + 1  # each node adds its output and one constant
    assert y.eval({"x": "ok"}, cache=False) == "ok"


def test_find_cycle_names_the_nodes_on_it_in_order() -> None:
    from outlines.graph.traversal import find_cycle
    from tests.fixtures.graphs import rewired_cycle

    q = outlines.string("q")
    assert find_cycle(((q + "a") + "b").owner) is None
    a, b, c, tail = rewired_cycle()
    assert find_cycle(a.owner) == [a.owner, b.owner, c.owner]
    assert find_cycle(tail.owner) == [c.owner, a.owner, b.owner]  # the cycle tail reads, from where tail meets it
