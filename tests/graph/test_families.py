"""Families noted as a graph is built: sibling nodes, member for member, for the plan to stack without a walk."""
from __future__ import annotations

import gc
import weakref
from typing import Any

import numpy as np
import pytest

import outlines
from outlines.graph import families as families_module
from outlines.graph.families import Family
from outlines.graph.ops import Concat
from outlines.graph.ragged import Ragged
from tests.fixtures.recording import RecordingBackend

N = 40


@outlines.prompt
def _again(v):  # type: ignore[no-untyped-def]
    """Say {{ v }} again"""


_SHOUT = outlines.fn(str.upper, name="shout", pure=True)


def _chains(llm: Any, n: int = N, prefix: str = "Q") -> list[Any]:
    """n chains of llm -> template -> + -> pure fn -> llm, built one by one."""
    outs = []
    for i in range(n):
        x = llm(outlines.constant(f"{prefix}{i}:"))
        outs.append(llm(_SHOUT(_again(x) + "!")))
    return outs


def _steps(out: Any) -> list[Any]:
    """The nodes of one chain, last first."""
    nodes, node = [], out.owner
    while node is not None:
        nodes.append(node)
        node = node.inputs[0].owner
    return nodes


def test_each_step_of_chains_built_one_by_one_is_one_family_ranked_in_build_order() -> None:
    llm = RecordingBackend(name="families").model()
    outs = _chains(llm)
    steps = list(zip(*(_steps(out) for out in outs)))  # per step, its N nodes
    assert len(steps) == 5
    for nodes in steps:
        family = nodes[0].family
        assert all(node.family is family for node in nodes) and [node.rank for node in nodes] == list(range(N))
        assert family.members[:N] == list(nodes) and family.shift == 0
    last, first = steps[0][0].family, steps[-1][0].family
    assert first.layout == ((),) and first.parents == []  # a root: one text constant per member
    assert last.parents == [steps[1][0].family]
    assert steps[2][0].family.layout == (steps[3][0].family, ())  # v + "!": a family, then a constant
    assert sorted(f.order for f in (s[0].family for s in steps)) == [s[0].family.order for s in reversed(steps)]


def test_a_call_built_before_the_loop_shifts_the_families_after_it() -> None:
    llm = RecordingBackend(name="shifted").model()
    probe = llm(outlines.constant("hello"))
    outs = [llm(llm(outlines.constant(f"Q{i}")) + "?") for i in range(N)]
    root = probe.owner.family
    assert probe.owner.rank == 0 and [o.owner.inputs[0].owner.inputs[0].owner.rank for o in outs] == list(range(1, N + 1))
    concat = outs[0].owner.inputs[0].owner.family
    assert concat.parents == [root] and concat.shift == 1
    assert [o.owner.rank for o in outs] == list(range(N)) and outs[0].owner.family.shift == 0


def test_what_joins_no_family() -> None:
    llm = RecordingBackend(name="none").model()
    free = outlines.string("q")
    impure = outlines.fn(str.upper, name="impure")  # not declared pure: stacks all the same
    assert llm(free).owner.family is None  # a free input: known only when bound
    assert llm(outlines.constant("a"), num_samples=2).owner.family is None
    assert llm(impure(free)).owner.family is None  # an input outside any family
    assert outlines.fn(lambda s: [s], signature="()->(n)", name="split")("a").owner.family is None  # not elementwise
    step = impure(llm("a")).owner  # an impure elementwise step joins a family like any step
    assert step.family is not None and step.op._stacks == (families_module.STEP, step.op)
    assert llm(step.outputs[0]).owner.family is not None
    assert llm(outlines.constant(["a", "b"])).owner.family is None  # not one prompt


def test_a_node_out_of_step_starts_a_new_family() -> None:
    llm = RecordingBackend(name="steps").model()
    firsts = [llm(outlines.constant(f"Q{i}")) for i in range(N)]
    backwards = [first + "!" for first in reversed(firsts)]  # member r reads member N-1-r: no one shift
    assert len({id(v.owner.family) for v in backwards}) == N
    again = [first + "?" for first in firsts]  # in step again: one family, whatever came before
    assert len({id(v.owner.family) for v in again}) == 1


def test_a_graph_built_again_while_the_first_lives_continues_its_families() -> None:
    llm = RecordingBackend(name="again").model()
    first, second = _chains(llm), _chains(llm, prefix="R")
    assert second[0].owner.family is first[0].owner.family
    assert [o.owner.rank for o in second] == list(range(N, 2 * N))


def test_families_hold_no_graph_alive() -> None:
    llm = RecordingBackend(name="alive").model()
    outs = _chains(llm)
    node, family = weakref.ref(outs[0].owner), weakref.ref(outs[0].owner.family)
    root = _steps(outs[0])[-1].family
    key = next(k for k, ref in families_module._ROOTS.items() if ref() is root)
    del outs, root
    gc.collect()
    assert node() is None and family() is None
    assert key not in families_module._ROOTS
    assert all(ref() is not None for ref in families_module._ROOTS.values())  # aliases (id(op) keys) too


@pytest.mark.parametrize("value", ["text", 3])
def test_stackable_constants(value: Any) -> None:
    constant = outlines.constant(value)
    assert families_module.stackable(constant, text=True) is isinstance(value, str)
    assert families_module.stackable(constant, text=False)
    assert not families_module.stackable(outlines.constant(Ragged.from_rows([["a"], ["b", "c"]])), text=False)


def test_a_family_shows_its_op_and_size() -> None:
    llm = RecordingBackend(name="shown").model()
    outs = [llm(outlines.constant(f"Q{i}")) for i in range(3)]
    assert isinstance(outs[0].owner.family, Family)
    assert repr(outs[0].owner.family).endswith("3 members)")


def test_equal_ops_built_as_separate_objects_are_one_family() -> None:
    """Families are keyed by what an op is (its parameters), not by which object it is: nothing is shared."""
    llm = RecordingBackend(name="index").model()
    pairs = [llm(outlines.constant(f"Q{i}")) + outlines.constant(np.array(["<", ">"], dtype=object)) for i in range(N)]
    firsts = [p[1] for p in pairs]
    assert len({id(v.owner.op) for v in firsts}) == N and len({id(v.owner.family) for v in firsts}) == 1
    joined = [Concat()(p, "!") for p in firsts]  # two Concat() per chain, each its own object
    assert len({id(v.owner.op) for v in joined}) == N and len({id(v.owner.family) for v in joined}) == 1
    assert outlines.eval(firsts[0], cache=False) == "Q0.>"
