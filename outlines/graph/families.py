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
built again while the old one lives).
``outlines.eval``'s plan (``outlines.runtime.plan``) then stacks whole families
from this record, one array node each, and checks member by member that the
graph is still what was noted; anything else takes the plan's general walk.

Nothing here holds a graph alive: a family is reachable from its members, and
the registries that find it hold weak references.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable

__all__ = ["Family", "note", "stackable"]

_order = itertools.count()
#: (id(op), layout or one input's shape) -> the family of uses of ``op`` on constants only (its roots).
_ROOTS: dict[Any, weakref.ref[Family]] = {}


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
        #: id(op) (one input) or (id(op), layout) -> a family reading this one first, weakly.
        self.children: dict[Any, weakref.ref[Family]] = {}

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
            _join(node, parent.children, id(op), (parent,), parent, owner.rank)
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
            if not variable.is_constant or not stackable(variable, generate):
                node.family = None
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
    _join(node, _ROOTS if first is None else first.children, (id(op), shape), shape, first, rank)


def _join(node: Any, registry: dict[Any, Any], key: Any, layout: tuple[Any, ...], parent: Family | None,
          rank: int) -> None:
    """Add ``node`` to the family under ``key`` (a new one when there is none, or ``node`` is out of its step)."""
    ref = registry.get(key)
    family = ref() if ref is not None else None
    if family is None or (parent is not None and rank - len(family.members) != family.shift):
        family = Family(node.op, layout, rank if parent is not None else 0)
        registry[key] = weakref.ref(family, _forget(registry, key))
    members = family.members
    node.family = family
    node.rank = len(members)
    members.append(node)


def _forget(registry: dict[Any, Any], key: Any) -> Callable[[Any], None]:
    """A weakref callback dropping ``key`` once its family is gone (unless a new one took the key)."""

    def forget(ref: Any) -> None:
        if registry.get(key) is ref:
            del registry[key]

    return forget
