"""Families: the one table of sibling nodes, noted as they are built, for the plan to stack.

A user builds 20,000 chains one node at a time (``llm(tpl(llm(q)))`` in a
loop). Each node of an op that stacks (``Op.stacked``: model calls of one
draw, elementwise ops, pure or not, and loops and conds of one traced
structure) joins a *family* when it is built: the uses of ops of one *kin*
(``Op.kin``: equal by their parameters, a control op by its traced
structure; never by object identity, so no op needs to be shared) whose
inputs are, position by position, constants of one shape
or members of one family, member for member: a member's *rank* is its index
in its family, and the member it reads at each position has its own rank
plus the family's ``shifts`` there (a family's first member sets them: a
test call built before the loop shifts every family after it by one). A node
that would break the step starts a new family under the same key (a graph
built again while the old one lives; nodes that never run in step, such as a
step for every other chain, each make a family of one, kept small).
The plan (``outlines.runtime.plan``) stacks from this table alone: it never
finds families itself.

Nothing here holds a graph alive: a family is reachable from its members, and
the registries that find it hold weak references.
"""
from __future__ import annotations

import itertools
import weakref
from collections.abc import Sequence
from typing import Any

from outlines.graph.traits import Run

__all__ = ["CALL", "LOOP", "STEP", "Family", "note", "stacking", "stackable"]

#: How an op's uses stack (``stacking``): an elementwise step, a model call over one ``str`` prompt
#: each, a loop or cond over one element each (every input a scalar).
STEP, CALL, LOOP = 1, 2, 3

_order = itertools.count()
#: (kin, layout or one input's shape) -> the family of uses of ops of that kin on constants only (its roots);
#: also keyed by ``(id(op), shape)``, an alias (``_join``).
_ROOTS: dict[Any, _Entry] = {}


class Family:
    """The uses of one op noted member for member; see the module docstring.

    Attributes
    ----------
    op
        The first member's op (the members' ops are all of one kin: its stacked op serves them all).
    layout
        Per input position: the ``Family`` whose members feed it, or the
        shape of the constants there.
    members
        The member Apply nodes, by rank.
    shifts
        Per input position: member ``r`` reads member ``r + shift`` of the
        family there (0 for constants). A family's first member sets them:
        a test call built before the loop shifts every family after it by one.
    shift
        The shift of the first family in ``layout`` (0 for a root).
    order
        Creation order: a family comes after the families it reads.
    """

    __slots__ = ("op", "layout", "members", "shifts", "shift", "order", "children", "__weakref__")

    def __init__(self, op: Any, layout: tuple[Any, ...], shifts: tuple[int, ...]) -> None:
        self.op = op
        self.layout = layout
        self.members: list[Any] = []
        self.shifts = shifts
        self.shift = next((s for s, p in zip(shifts, layout) if type(p) is Family), 0)
        self.order = next(_order)
        #: kin (one input; or its alias id(op), see ``_join``) or (kin, layout) -> a family reading this one
        #: first, weakly (made on first use).
        self.children: dict[Any, _Entry] | None = None

    @property
    def parents(self) -> list[Family]:
        """The families this one reads, in input order, each once."""
        return list({id(p): p for p in self.layout if type(p) is Family}.values())

    def __repr__(self) -> str:
        return f"Family({getattr(self.op, 'name', self.op)!r}, {len(self.members)} members)"


def stackable(constant: Any, text: bool) -> bool:
    """Whether a Constant can be stacked with its siblings' (``text``: a model call's prompt, a ``str``)."""
    if text:
        return type(constant.value) is str
    shape = constant.shape
    return not constant.ragged and shape is not None and None not in shape


def stacking(op: Any) -> tuple[int, Any] | None:
    """``(how, kin)`` of an op whose uses join families (``how``: ``STEP``, ``CALL`` or ``LOOP``), else ``None``.

    Asked once per op object (``Apply`` keeps the answer on the op). An op
    whose kin cannot be hashed (unhashable parameters) never stacks.
    """
    if op.stacked() is None:
        return None
    kin = op.kin
    try:
        hash(kin)
    except TypeError:
        return None
    run = op.traits.run
    return (CALL if run is Run.GENERATE else LOOP if run is Run.CONTROL else STEP), kin


def note(node: Any, stacks: tuple[int, Any]) -> None:
    """Join ``node`` (one output, of an op that stacks) to its family if its inputs allow; else ``family = None``.

    ``stacks``: the op's ``stacking``, ``(how, kin)``. A model call stacks over one ``str`` prompt each, a loop or
    cond over scalars only. A node with a free input, a constant that cannot stack or an input outside any family
    joins none; one whose family inputs are out of step with its family (``Family.shifts``) starts a new one. Runs
    once per node built (graphs of 100k nodes are built in a loop): the common cases are spelled out.
    """
    inputs = node.inputs
    if len(inputs) == 1:  # a call, a template, a step: keyed by the op alone under its parent
        variable = inputs[0]
        owner = variable.owner
        if owner is not None:
            parent = owner.family
            if parent is None:
                node.family = None
                return
            children = parent.children
            if children is not None:
                entry = children.get(id(node.op))  # the family this very op joined here last (see _join)
                family = entry() if entry is not None else None
                if family is not None:  # the common case, inline: the next member of a family in step (its
                    # members read alike: the checks below passed for its first)
                    members = family.members
                    rank = len(members)
                    if owner.rank - rank == family.shift:
                        node.family = family
                        node.rank = rank
                        members.append(node)
                        return
            else:
                children = parent.children = {}
    how, kin = stacks
    generate = how == CALL
    if how == LOOP and any(variable.shape != () for variable in inputs):
        node.family = None  # a loop stacks over one element each
        return
    if len(inputs) == 1:
        if owner is not None:
            if generate and variable.shape != ():
                node.family = None
                return
            _join(node, children, kin, (parent,), (owner.rank,), id(node.op))
        elif variable.is_constant and stackable(variable, generate):
            shape = variable.shape
            entry = _ROOTS.get((id(node.op), shape))
            family = entry() if entry is not None else None
            if family is None:
                _join(node, _ROOTS, (kin, shape), (shape,), None, (id(node.op), shape))
            else:  # a root takes every use on constants of its shape
                node.family = family
                node.rank = len(family.members)
                family.members.append(node)
        else:
            node.family = None  # a free input: its value is known only when it is bound
        return
    first: Family | None = None
    layout: list[Any] = []
    ranks: list[int] = []  # per input position: its member's rank (0 for a constant)
    for variable in inputs:
        owner = variable.owner
        if owner is None:
            if not variable.is_constant or (type(variable.value) is not str and not stackable(variable, generate)):
                node.family = None  # (one text always stacks)
                return
            layout.append(variable.shape)
            ranks.append(0)
            continue
        family = owner.family
        if family is None:  # outside any family
            node.family = None
            return
        if first is None:
            first = family
        layout.append(family)
        ranks.append(owner.rank)
    if not layout or (generate and inputs[0].shape != ()):
        node.family = None
        return
    shape = tuple(layout)
    registry = _ROOTS if first is None else first.children
    if registry is None:
        registry = first.children = {}  # type: ignore[union-attr]  # first is set: _ROOTS is no None
    alias = (id(node.op), shape)
    entry = registry.get(alias)  # the common case, inline (``a + "!"`` in a loop): this op's own family, in step
    if entry is not None and (family := entry()) is not None:
        members = family.members
        rank = len(members)
        step = True  # ``_in_step``, spelled out: each family input is the member of this rank plus its shift
        if first is not None:
            for read, shift, part in zip(ranks, family.shifts, shape):
                if read - rank != shift and type(part) is Family:
                    step = False
                    break
        if step:
            node.family = family
            node.rank = rank
            members.append(node)
            return
    _join(node, registry, (kin, shape), shape, tuple(ranks) if first is not None else None, alias)


def _join(node: Any, registry: dict[Any, Any], key: Any, layout: tuple[Any, ...], ranks: tuple[int, ...] | None,
          alias: Any = None) -> None:
    """Add ``node`` to the family under ``key``: a new one when there is none, or ``node`` starts a new run.

    ``ranks``: per input position, the rank of the member read there (0 for
    a constant); ``None`` for a root (constants only). ``alias``: a second
    key, made of ``id(node.op)``, under which the family is found again
    when it is that op's own (``Family.op``, a shared op: the next use of it
    is found by a key hashed in C, not by the op's hash in Python). An
    alias never outlives its op while its family lives (the family's
    members hold the op); a dead family's alias gives ``None``.
    """
    family = None
    if alias is not None:  # this op's own family first: found by a key hashed in C
        ref = registry.get(alias)
        family = ref() if ref is not None else None
        if family is not None and not _in_step(family, ranks, layout):
            family = None
    if family is None:
        ref = registry.get(key)
        family = ref() if ref is not None else None
        if family is None or not _in_step(family, ranks, layout):
            family = Family(node.op, layout, ranks or (0,) * len(layout))
            registry[key] = _Entry(family, registry, key)
        if alias is not None and family.op is node.op and registry.get(alias) is not (entry := registry[key]):
            registry[alias] = entry
            entry.aliases.append(alias)
    members = family.members
    node.family = family
    node.rank = len(members)
    members.append(node)


def _in_step(family: Family, ranks: Sequence[int] | None, layout: tuple[Any, ...]) -> bool:
    """Whether a node reading members of ``ranks`` is ``family``'s next member (a root's always is)."""
    if ranks is None:
        return True
    rank = len(family.members)
    for read, shift, part in zip(ranks, family.shifts, layout):  # a loop, not all(): called per node built
        if read - rank != shift and type(part) is Family:
            return False
    return True


class _Entry(weakref.ref):  # type: ignore[type-arg]  # subclassed bare: typeshed's generic
    """A registry's weak reference to a family, which drops its key once the family is gone."""

    __slots__ = ("registry", "key", "aliases")

    def __init__(self, family: Family, registry: dict[Any, Any], key: Any) -> None:
        super().__init__(family, _forget)  # type: ignore[call-arg]  # ref takes its callback; typeshed says no
        self.registry, self.key = registry, key
        self.aliases: list[Any] = []  # its other keys (``_join``'s alias)

    def __new__(cls, family: Family, registry: dict[Any, Any], key: Any) -> _Entry:
        return super().__new__(cls, family, _forget)


def _forget(entry: _Entry) -> None:
    """Drop a dead family's keys (unless a newer family took them)."""
    registry = entry.registry
    for key in (entry.key, *entry.aliases):
        if registry.get(key) is entry:
            del registry[key]
