"""Families: sibling nodes noted as they are built, so a plan can stack them without walking them.

A user builds 20,000 chains one node at a time (``llm(tpl(llm(q)))`` in a
loop). Each node of an op that stacks (``Op.stacked``: model calls of one
draw, pure elementwise ops) joins a *family* when it is built: the uses of
that op object whose inputs are, position by position, constants of one shape
or members of one family, member for member: a member's *rank* is its index
in its family, its family inputs are all members of one rank, and that rank is
its own plus the family's ``shift`` (a family's first member sets it: a
test call built before the loop shifts every family after it by one). A node
that would break the step starts a new family under the same key (a graph
built again while the old one lives; nodes that never run in step, such as a
step for every other chain, each make a family of one, kept small).
``outlines.eval``'s plan (``outlines.runtime.plan``) then stacks whole families
from this record, one array node each, and checks member by member that the
graph is still what was noted; anything else takes the plan's general walk.

Nothing here holds a graph alive: a family is reachable from its members, and
the registries that find it hold weak references.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any

__all__ = ["Family", "note", "stackable"]

_order = itertools.count()
#: (id(op), layout or one input's shape) -> the family of uses of ``op`` on constants only (its roots).
_ROOTS: dict[Any, _Entry] = {}


class Family:
    """The uses of one op noted member for member; see the module docstring.

    Attributes
    ----------
    op
        The op every member applies (kept: ``id(op)`` keys the registries).
    layout
        Per input position: the ``Family`` whose members feed it, or the
        shape of the constants there.
    members
        The member Apply nodes, by rank.
    shift
        Member ``r`` reads members ``r + shift`` of the families in ``layout``.
    order
        Creation order: a family comes after the families it reads.
    """

    __slots__ = ("op", "layout", "members", "shift", "order", "children", "__weakref__")

    def __init__(self, op: Any, layout: tuple[Any, ...], shift: int) -> None:
        self.op = op
        self.layout = layout
        self.members: list[Any] = []
        self.shift = shift
        self.order = next(_order)
        #: id(op) (one input) or (id(op), layout) -> a family reading this one first, weakly (made on first use).
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


def note(node: Any, generate: bool) -> None:
    """Join ``node`` (one output, of an op that stacks) to its family if its inputs allow; else ``family = None``.

    ``generate``: the op is a model call, which stacks over one ``str``
    prompt each. A node with a free input, a constant that cannot stack, an
    input outside any family, or family inputs of different ranks joins none.
    Runs once per node built (graphs of 100k nodes are built in a loop): the
    one-input case is spelled out.
    """
    inputs = node.inputs
    op = node.op
    if len(inputs) == 1:  # a call, a template, a step: keyed by the op alone under its parent
        variable = inputs[0]
        owner = variable.owner
        if owner is not None:
            parent = owner.family
            if parent is None or (generate and variable.shape != ()):
                node.family = None
                return
            children = parent.children
            if children is None:
                children = parent.children = {}
            entry = children.get(id(op))
            family = entry() if entry is not None else None
            if family is not None:  # the common case, inline: the next member of a family in step
                members = family.members
                rank = len(members)
                if owner.rank - rank == family.shift:
                    node.family = family
                    node.rank = rank
                    members.append(node)
                    return
            _join(node, children, id(op), (parent,), parent, owner.rank)
        elif variable.is_constant and stackable(variable, generate):
            _join(node, _ROOTS, (id(op), variable.shape), (variable.shape,), None, -1)
        else:
            node.family = None  # a free input: its value is known only when it is bound
        return
    rank = -1
    first: Family | None = None
    layout: list[Any] = []
    for variable in inputs:
        owner = variable.owner
        if owner is None:
            if not variable.is_constant or (type(variable.value) is not str and not stackable(variable, generate)):
                node.family = None  # (one text always stacks)
                return
            layout.append(variable.shape)
            continue
        family = owner.family
        if family is None or (rank >= 0 and owner.rank != rank):  # outside, or not member for member
            node.family = None
            return
        rank = owner.rank
        if first is None:
            first = family
        layout.append(family)
    if not layout or (generate and inputs[0].shape != ()):
        node.family = None
        return
    shape = tuple(layout)
    registry = _ROOTS if first is None else first.children
    if registry is None:
        registry = first.children = {}  # type: ignore[union-attr]
    _join(node, registry, (id(op), shape), shape, first, rank)


def _join(node: Any, registry: dict[Any, Any], key: Any, layout: tuple[Any, ...], parent: Family | None,
          rank: int) -> None:
    """Add ``node`` to the family under ``key``: a new one when there is none, or ``node`` starts a new run."""
    ref = registry.get(key)
    family = ref() if ref is not None else None
    if family is None or (parent is not None and rank - len(family.members) != family.shift):
        family = Family(node.op, layout, rank if parent is not None else 0)
        registry[key] = _Entry(family, registry, key)
    members = family.members
    node.family = family
    node.rank = len(members)
    members.append(node)


class _Entry(weakref.ref):  # type: ignore[type-arg]
    """A registry's weak reference to a family, which drops its key once the family is gone."""

    __slots__ = ("registry", "key")

    def __init__(self, family: Family, registry: dict[Any, Any], key: Any) -> None:
        super().__init__(family, _forget)  # type: ignore[call-arg]
        self.registry, self.key = registry, key

    def __new__(cls, family: Family, registry: dict[Any, Any], key: Any) -> _Entry:
        return super().__new__(cls, family, _forget)


def _forget(entry: _Entry) -> None:
    """Drop a dead family's key (unless a newer family took it)."""
    if entry.registry.get(entry.key) is entry:
        del entry.registry[entry.key]
