"""The static part of an evaluation: one family table, one stacking rewrite, one walk.

A ``Plan`` is built once per set of outputs (a ``Program`` keeps its own),
the same way for every entry point:

- the family table (``outlines.graph.families``) is noted as the graph is
  built: sibling uses of ops of one kin (``Op.kin``: equal by parameters, a
  control op by its traced structure) whose inputs are constants or the
  members of one family, member for member. The plan never finds families
  itself, and no op needs to be shared for its uses to be siblings;
- the ordinary walk (``_walk``) over the Apply nodes in creation order (a
  topological order) does, per node: rewrites (a pure node whose op and
  inputs match an earlier one is replaced by it; a pure inline op whose
  inputs are all Constants is folded into a Constant), numbering (the k
  draws of a random model call get numbers ``n..n+k-1``, where ``n`` counts
  earlier draws of the same backend, params and prompt, so rebuilding the
  same program replays the same draws; likewise namespace tags of control
  nodes) and structure (the kept nodes, their in-degree and consumers), and
  notes the kept members of the table's families (``_Found``: split by the
  inputs they read after its rewrites, a call with a draw offset left out).
  When the outputs are whole runs of families that the walk would neither
  rewrite nor number, the table alone says what it would find (``_table``)
  and no node is walked: 20,000 chains are planned in a few ms;
- one stacking rewrite (``_stack``) then turns each family found of at
  least ``stack_min`` members into one node of its stacked op
  (``Op.stacked``) over the arrays of its inputs: model calls of one draw,
  elementwise ops (an impure ``outlines.fn`` too: it still runs once per
  element, and is never merged), loops and conds of one structure.

Inputs match when they are the same Variable, or Constants of simple values
whose ``canonical`` text (``outlines.common.keys``) is equal. Random draws and
impure ops are never merged; free inputs and Constants are kept as the same
objects, so givens still bind. Nothing recurses.
"""
from __future__ import annotations

import warnings
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Hashable, Iterable, Mapping, Sequence, cast

import numpy as np

from outlines.common.config import current_tuning
from outlines.common.keys import canonical
from outlines.common.errors import UnboundInputError
from outlines.graph.basic import Apply, Constant, Op, Variable, as_object_array
from outlines.graph.families import Family, stackable
from outlines.graph.ops import all_text
from outlines.graph.protocols import model_call
from outlines.graph.shapes import propagate, shape_of
from outlines.graph.traits import Run
from outlines.graph.traversal import rewired_error, toposort

__all__ = ["Plan", "bind_givens", "check_shapes"]

_OWNER, _FAMILY, _RANK, _INPUTS, _ORDER = map(attrgetter, ("owner", "family", "rank", "inputs", "order"))
_VALUE, _SHAPE, _RAGGED = attrgetter("value"), attrgetter("shape"), attrgetter("ragged")
# Constants of these exact types (and object arrays of them) are keyed by value.
# Integral floats are not: canonical text writes 1.0 as 1 and -0.0 as 0, which
# is right for a backend's parameters but not for a value a Python op reads.
_SCALARS = (str, int, bool, type(None))


class Plan:
    """Nodes of a graph in topological order, with their dependency structure.

    Parameters
    ----------
    outputs
        The Variables to compute.
    stack_min
        The fewest members of a family that stack into one array node
        (default: ``outlines.common.config.current_tuning().stack_min``, read when
        the plan is built; a huge value plans every node on its own).

    Attributes
    ----------
    outputs
        Variables computing the same values in the same order: the originals
        where nothing was rewritten, otherwise merged, folded or stacked ones
        (a stacked one holds the value at ``picks``).
    nodes
        Apply nodes, each after the owners of its inputs.
    indegree
        For node ``i``, how many distinct nodes it waits for.
    consumers
        For node ``i``, the indices of the nodes that use its outputs.
    inputs, constants
        The free input Variables and the Constants the graph reads.
    draw_offsets
        ``id(apply) -> first draw number`` of each random model call whose
        first draw is not 0 (absent means 0: keeps the plan small).
    tag_offsets
        ``apply.order -> first namespace tag`` of each loop or branch node
        after the first (``Evaluation.child``): control nodes number their
        namespaces in creation order like model calls their draws, so two
        loops making the same calls draw apart, and the first loop evaluated
        alone draws what it drew with the others.
    scatter
        ``id(stacked Apply) -> [(member output, its element)]`` for each
        member output that a node left unstacked reads: the scheduler stores
        each such element under the member's output when the stacked node
        finishes.
    element_tags
        ``id(stacked loop or cond) ->`` the first namespace tag of each
        element (its own node's ``tag_offsets``).
    picks
        Output position -> (the stacked Variable computing it, its element).
    members
        ``id(stacked Apply) ->`` the nodes it stands for, in element order
        (failures name them).

    Examples
    --------
    >>> from outlines.graph.ops import Concat
    >>> plan = Plan([Concat()("a", "b")])
    >>> plan.outputs[0].value, len(plan.nodes)
    ('ab', 0)
    """

    def __init__(self, outputs: Iterable[Variable], *, stack_min: int | None = None) -> None:
        outputs = list(outputs)
        if not all(map(isinstance, outputs, repeat(Variable))):
            argument, output = next((i, v) for i, v in enumerate(outputs) if not isinstance(v, Variable))
            raise TypeError(f"eval expects symbolic Variables; argument {argument} is {type(output).__name__}")
        self.nodes: list[Apply] = []
        self.indegree: list[int] = []
        self.consumers: list[list[int]] = []
        self.draw_offsets: dict[int, int] = {}
        self.tag_offsets: dict[int, int] = {}
        self.scatter: dict[int, list[tuple[Variable, int]]] = {}
        self.element_tags: dict[int, np.ndarray] = {}
        self.picks: dict[int, tuple[Variable, int]] = {}
        self.members: dict[int, Sequence[Apply]] = {}
        stack_min = max(1, current_tuning().stack_min if stack_min is None else stack_min)
        found = _table(outputs, stack_min)
        if found is None:
            found = _Found()
            position, uplinks, leaves, rewritten = self._walk(outputs, found)
        else:  # whole runs of families: what the walk would find, read from the table (no node walked)
            self.nodes, self.outputs = [members[0] for members in found.members], outputs
            position, uplinks, leaves, rewritten = {}, None, [], True
        self._stack(found, stack_min, position, uplinks)
        if self.members or rewritten or any(v.owner is None for v in self.outputs):  # leaves rewritten or not seen
            self._read(list({id(v): v for v in _leaves(self.nodes, self.outputs)}.values()))
        else:
            self._read(leaves)

    def _walk(self, outputs: list[Variable], found: _Found
              ) -> tuple[dict[int, int], list[int | list[int]], list[Variable], bool]:
        """The ordinary walk: merge, fold, number draws and tags, keep the rest; note family members in ``found``.

        Sets ``nodes``, ``outputs``, ``draw_offsets`` and ``tag_offsets``.
        Returns each kept node's index by ``id``, its parents (``_link``'s
        ``uplinks``: the index of its one parent, -1 for none, or their
        list), the leaves read in order of first use, and whether anything
        was rewritten.
        """
        tags = 0  # namespace tags taken by the control nodes so far
        replaced: dict[int, Variable] = {}  # id(original Variable) -> its replacement
        merged: dict[Hashable, Apply] = {}  # (op token, noutputs, input keys) of a pure node -> the node computing it
        draws: dict[Hashable, int] = {}  # (stream number, prompt key) -> draws numbered so far
        stream_numbers: dict[Hashable, int] = {}  # (backend, params) -> its number
        position: dict[int, int] = {}
        # Per op object, once: (merge token, pure, a model call, a loop or branch, and for a random model
        # call the number of its (backend, params) and its draws per prompt, else -1 and 0). Equal ops
        # share a token, so a node's merge key hashes in C (an op's own hash and equality run in Python).
        ops: dict[int, tuple[Any, bool, bool, bool, int, int]] = {}
        tokens: dict[Any, int] = {}
        # Bound once: this loop runs once per node of graphs of 100k nodes.
        nodes, offsets, note = self.nodes, self.draw_offsets, found.add
        leaves: dict[int, Variable] = {}  # the free inputs and Constants read, in order of first use
        # Per kept node, its inputs' nodes: ints, so that a node adds no container for the collector to walk.
        uplinks: list[int | list[int]] = []
        for node in toposort(outputs):
            inputs: Sequence[Variable] = node.inputs
            if replaced:
                inputs = [replaced.get(id(v), v) for v in inputs]
                same = all(a is b for a, b in zip(inputs, node.inputs))
            else:
                same = True
            op, key = node.op, None
            info = ops.get(id(op))
            if info is None:
                info = ops[id(op)] = _op_info(op, tokens, stream_numbers)
            token, pure, generate, control, number, samples = info
            parents: list[int] = []
            try:
                constants, input_keys = _read_inputs(inputs, pure or generate, parents, leaves, position)
            except KeyError:  # an input not computed yet: only a graph rewired after it was built
                raise rewired_error(node, position) from None
            if pure:
                if constants:
                    constant = _fold(node, cast("Sequence[Constant]", inputs))  # all Constants: checked
                    if constant is not None:
                        replaced[id(node.outputs[0])] = constant
                        continue
                if token is not None:
                    key = (token, len(node.outputs), tuple(input_keys))
                    found_node = merged.get(key)
                    if found_node is not None:
                        replaced.update((id(old), new) for old, new in zip(node.outputs, found_node.outputs))
                        continue
            kept = node if same else _rebuild(node, inputs)
            if key is not None:
                merged[key] = kept
            if kept is not node:
                replaced.update((id(old), new) for old, new in zip(node.outputs, kept.outputs))
            if control:
                if tags:
                    self.tag_offsets[kept.order] = tags
                tags += getattr(op, "max_iter", 0) + 1  # a loop's tags: 0 (its first cond), then 1..max_iter
            if number >= 0:  # a random model call: draws are numbered per (backend, params, prompt)
                stream = (number, input_keys[0])
                offset = draws.get(stream, 0)
                if offset:
                    offsets[id(kept)] = offset
                draws[stream] = offset + samples
            index = position[id(kept)] = len(nodes)  # after its parents: a node reading itself is caught
            nodes.append(kept)
            uplinks.append(parents[0] if len(parents) == 1 else parents or -1)
            note(node.family if id(kept) not in offsets else None, kept, inputs, parents, generate, position)
        self.outputs = [replaced.get(id(v), v) for v in outputs]
        return position, uplinks, list(leaves.values()), bool(replaced)

    def _read(self, read: list[Variable]) -> None:
        """``inputs`` and ``constants``: the leaves the plan reads, split."""
        self.inputs = [v for v in read if not isinstance(v, Constant)]
        self.constants = [v for v in read if isinstance(v, Constant)]

    def draw_numbers(self) -> dict[int, tuple[int, int]]:
        """``apply.order -> (first, last)`` draw number of each sampling model call (greedy ones: one draw, left out).

        Keyed by creation order, which a node rebuilt by a rewrite keeps, so
        the numbers find the nodes of the graph as the user built it.
        """
        out: dict[int, tuple[int, int]] = {}
        for node in self.nodes:
            if node.op.traits.run is not Run.GENERATE:
                continue
            op = model_call(node.op)
            if not op.params.deterministic:
                first = self.draw_offsets.get(id(node), 0)
                for member in self.members.get(id(node), (node,)):  # a stacked call: each call it stands for
                    out[member.order] = (first, first + op.num_samples - 1)
        return out

    def pick(self, results: list[Any]) -> list[Any]:
        """The values of the original outputs, given the values of ``outputs`` (see ``picks``)."""
        if not self.picks:
            return results
        return [results[i][self.picks[i][1]] if i in self.picks else value for i, value in enumerate(results)]

    def _stack(self, found: _Found, stack_min: int, position: Mapping[int, int],
               uplinks: list[int | list[int]] | None) -> None:
        """The stacking rewrite over ``found`` (see the module docstring): 5,000 chains run as one array node a step.

        A family stacks when it has at least ``stack_min`` members, member for
        member with its parent families (not ``broken``), and those stack too
        with as many members: its node reads the arrays of its inputs (its
        members' constants stacked, or kept when all are one scalar). A node
        left out that reads a member's output is kept as built: it waits for
        the stacked node, which gives that output its element (``scatter``),
        so nothing downstream is rebuilt. Draw numbers, keys and values are
        unchanged; ``picks``, ``members`` and ``element_tags`` say which
        element is whose. ``position`` and ``uplinks``: the walk's
        (``_walk``); from the table, ``nodes`` holds each family's first member.
        """
        families, family_of, rank = found.members, found.family_of, found.rank
        valid = [len(m) >= stack_min and not found.broken[f] for f, m in enumerate(families)]
        for family, ups in enumerate(found.above):  # parents come first: one pass settles it
            # A parent with more members than its child: its stacked array holds elements nobody reads.
            if valid[family] and not all(valid[up] and len(families[up]) == len(families[family]) for up in ups):
                valid[family] = False
        if found.count < stack_min or not any(valid):
            self._link(uplinks)
            return
        stacked: dict[int, Apply] = {}
        aliases: dict[int, Apply] = {}  # id(member read by a node left out) -> its stacked node
        kept: list[Apply] = []
        for index, node in enumerate(self.nodes):
            family = family_of[index]
            if family < 0 or not valid[family]:
                for variable in node.inputs:
                    owner = variable.owner
                    if owner is None or id(owner) in aliases:
                        continue
                    at = position[id(owner)]
                    up = family_of[at]
                    if up >= 0 and valid[up]:  # a stacked member's output read by a node left out: its element
                        aliases[id(owner)] = source = stacked[up]
                        self.scatter.setdefault(id(source), []).append((variable, rank[at]))
                kept.append(node)
            elif family not in stacked:
                members, op = families[family], node.op
                control, layout = op.traits.run is Run.CONTROL, found.layouts[family]
                whole = control or not op.traits.pure or int not in set(map(type, layout))  # see _stacked_constant
                sources: list[Variable] = []
                for number, part in enumerate(layout):
                    if type(part) is int:  # a parent family's: its stacked node's output
                        sources.append(stacked[part].outputs[0])
                        continue
                    # popped: young lists of 20k values that each collection while picking below would read
                    constants, values = found.constants.pop((family, number), None) or (
                        list(map(itemgetter(number), map(_INPUTS, members))), None)
                    sources.append(_stacked_constant(constants, values, whole=whole))
                whole_op = cast(Op, op.stacked())  # a family's op stacks (families.stacking)
                new = stacked[family] = Apply(whole_op, sources, sibling=False)
                new.order = members[0].order  # labelled as its first member
                self.members[id(new)] = members
                if control:  # each element draws in its own loop's namespaces
                    self.element_tags[id(new)] = np.array([self.tag_offsets.get(m.order, 0) for m in members])
                kept.append(new)
        if found.picked is None:  # the walk's outputs: each one's family and rank, or -1
            places = [position.get(id(v.owner), -1) for v in self.outputs]
            found.picked = ([family_of[i] if i >= 0 else -1 for i in places], [rank[i] for i in places])
        picked, elements = found.picked
        if len(stacked) == len(families) and -1 not in picked:  # every output picked (map: 100k outputs)
            heads = [stacked[f].outputs[0] for f in range(len(families))]
            if picked and picked.count(picked[0]) == len(picked):  # one family's outputs (a C scan): one node's
                self.outputs = [heads[picked[0]]] * len(picked)
            else:
                self.outputs = list(map(heads.__getitem__, picked))
            self.picks = dict(enumerate(zip(self.outputs, elements)))
        else:
            for number, (family, element) in enumerate(zip(picked, elements)):
                if family in stacked:
                    self.outputs[number] = stacked[family].outputs[0]
                    self.picks[number] = (self.outputs[number], element)
        self.nodes = kept
        self._link(aliases=aliases)

    def _link(self, uplinks: list[int | list[int]] | None = None, aliases: Mapping[int, Apply] | None = None) -> None:
        """``indegree`` and ``consumers`` of ``nodes``, once they are final.

        ``uplinks`` (per node, its parent's index, -1 or the list of its
        parents, as the walk found them) when the walk's nodes are kept;
        found again from the nodes' inputs after stacking rewrote them.
        """
        nodes = self.nodes
        position = {id(node): index for index, node in enumerate(nodes)} if uplinks is None else {}
        if aliases:  # a member of a stacked node, read by a node left out: that node waits for the stacked one
            position.update((member, position[id(stacked)]) for member, stacked in aliases.items())
        indegree: list[int] = []
        consumers: list[list[int]] = [[] for _ in nodes]
        for index, node in enumerate(nodes):
            if uplinks is not None:
                up = uplinks[index]
            elif len(node.inputs) == 1:  # the common case: at most one parent
                owner = node.inputs[0].owner
                up = position[id(owner)] if owner is not None else -1
            else:
                up = [position[id(v.owner)] for v in node.inputs if v.owner is not None]
            if isinstance(up, int):
                if up < 0:
                    indegree.append(0)
                else:
                    indegree.append(1)
                    consumers[up].append(index)
                continue
            parents = sorted(set(up))  # a node waits once for each distinct parent
            indegree.append(len(parents))
            for parent in parents:
                consumers[parent].append(index)
        self.indegree, self.consumers = indegree, consumers

    def __len__(self) -> int:
        return len(self.nodes)


class _Found:
    """The table's families among a plan's nodes, for ``Plan._stack``: as the walk meets them, or read from the table.

    Per node: ``family_of`` (its family here, or -1) and ``rank`` (its
    index there). Per family: its ``members`` (Apply nodes, by rank), the
    families ``above`` it (its parents'), whether it is ``broken`` (a member
    reads parents of another rank: not member for member) and its ``layout``
    (per input, a parent family or a constant's shape). A family of the
    table is split here by layout: the walk's rewrites can make its members
    read other nodes than they were built on. ``picked``: per output of the
    plan, its family (or -1) and rank; ``None`` until known.
    """

    __slots__ = ("family_of", "rank", "members", "above", "broken", "layouts", "index", "count", "picked", "constants")

    def __init__(self) -> None:
        self.family_of: list[int] = []
        self.rank: list[int] = []
        self.members: list[list[Apply]] = []
        self.above: list[list[int]] = []
        self.broken: list[bool] = []
        self.layouts: list[tuple[Any, ...]] = []
        self.index: dict[tuple[int, tuple[Any, ...]], int] = {}  # (id(table family), layout) -> family
        self.count = 0  # nodes in a family
        self.picked: tuple[list[int], list[int]] | None = None
        #: (family, input position) -> its members' constants there and their values, where known already
        self.constants: dict[tuple[int, int], tuple[list[Constant], list[Any]]] = {}

    def add(self, table: Family | None, node: Apply, inputs: Sequence[Variable], parents: list[int],
            generate: bool, position: Mapping[int, int]) -> None:
        """Note the next kept ``node`` (of the table's family ``table``, reading ``inputs`` of nodes ``parents``)."""
        family_of = self.family_of
        if table is not None:
            layout: list[Any] = []
            for variable in inputs:
                owner = variable.owner
                if owner is not None:
                    up = family_of[position[id(owner)]]
                    if up < 0:
                        break
                    layout.append(up)
                elif isinstance(variable, Constant) and stackable(variable, generate):
                    layout.append(variable.shape)
                else:  # a free input: its value is known only when it is bound
                    break
            else:
                key = (id(table), tuple(layout))
                family = self.index.get(key, -1)
                if family < 0:
                    family = self.index[key] = len(self.members)
                    self.members.append([])
                    self.above.append(sorted({family_of[up] for up in parents}))
                    self.broken.append(False)
                    self.layouts.append(key[1])
                members = self.members[family]
                for up in parents:
                    if self.rank[up] != len(members):  # not member for member
                        self.broken[family] = True
                family_of.append(family)
                self.rank.append(len(members))
                members.append(node)
                self.count += 1
                return
        family_of.append(-1)
        self.rank.append(0)


def _op_info(op: Op, tokens: dict[Any, int], stream_numbers: dict[Hashable, int]
             ) -> tuple[Any, bool, bool, bool, int, int]:
    """What ``Plan._walk`` reads of ``op`` once, for all its nodes (see ``ops`` there).

    A pure op's merge token is numbered by its kin (``None``: unhashable
    parameters, never merged). A random model call's (backend, params) is
    numbered here, once per op (it hashes in Python), in the order the walk
    numbers their first draws: an op's first node is always numbered (it is
    not pure, so never merged or folded).
    """
    traits = op.traits
    token: Any = None
    if traits.pure:
        try:
            token = tokens.setdefault(op.kin, len(tokens))
        except TypeError:  # an op with unhashable parameters is never merged
            pass
    generate = traits.run is Run.GENERATE
    number, samples = -1, 0
    if generate and not traits.pure:
        call = model_call(op)
        number = stream_numbers.setdefault((call.backend, call.params), len(stream_numbers))
        samples = call.num_samples
    return token, traits.pure, generate, traits.run is Run.CONTROL, number, samples


def _read_inputs(inputs: Sequence[Variable], keyed: bool, parents: list[int], leaves: dict[int, Variable],
                 position: Mapping[int, int]) -> tuple[bool, list[Hashable]]:
    """One pass over a node's inputs: their nodes into ``parents``, leaves into ``leaves``.

    Returns whether all are Constants and, when ``keyed`` (a node to merge
    or number), the inputs' keys (``_input_key``). ``KeyError``: an input
    whose node was not walked yet.
    """
    constants = True
    input_keys: list[Hashable] = []
    if not keyed:  # nothing to merge or number (a plain fn step): only its parents
        for v in inputs:
            owner = v.owner
            if owner is None:
                leaves[id(v)] = v
            else:
                parents.append(position[id(owner)])
        return False, input_keys
    for v in inputs:
        owner = v.owner
        if owner is None:
            leaves[id(v)] = v
            if type(v) is Constant and type(v.value) is str:  # most constants: _input_key inline
                input_keys.append(v.value)
                continue
            if not isinstance(v, Constant):
                constants = False
            input_keys.append(_input_key(v))
        else:
            constants = False
            parents.append(position[id(owner)])
            input_keys.append(id(v))
    return constants, input_keys


def _ranges(families: list[Family], kinds: set[Family], ranks: list[int], stack_min: int
            ) -> dict[Family, tuple[int, int]] | None:
    """The ranks ``[lo, hi)`` each family must give (the outputs', then their readers' shifted).

    ``families`` and ``ranks``: of each output (families hash by identity);
    ``kinds``: the set of ``families``.
    None when an output family's ranks are not one contiguous range of at
    least ``stack_min``, or a family is read over two ranges (some members
    of it are read by others).
    """
    asked: dict[Family, set[int]] = {}
    if len(kinds) == 1:  # the common case: the outputs of one family (no per-output call)
        asked[families[0]] = set(ranks)
    else:
        for family, rank in zip(families, ranks):
            asked.setdefault(family, set()).add(rank)
    need: dict[Family, tuple[int, int]] = {}
    for family, wanted in asked.items():
        lo, hi = min(wanted), max(wanted) + 1
        if len(wanted) != hi - lo or hi - lo < stack_min:
            return None
        need[family] = (lo, hi)
    closure: set[Family] = set()
    todo = list(need)
    while todo:
        family = todo.pop()
        if family not in closure:
            closure.add(family)
            todo.extend(family.parents)
    for family in sorted(closure, key=_ORDER, reverse=True):  # readers first: each passes its range up
        lo, hi = need[family]
        for part, shift in zip(family.layout, family.shifts):
            if type(part) is Family and need.setdefault(part, (lo + shift, hi + shift)) != (lo + shift, hi + shift):
                return None
    return need


def _table(outputs: list[Variable], stack_min: int) -> _Found | None:
    """The families ``Plan._stack`` stacks, read from the family table alone; None where the walk is needed.

    Applies when every output is a member of a family, the outputs of each
    family one contiguous range of ranks ``[lo, hi)`` of at least
    ``stack_min``, and each family read over one range (member ``r`` reads
    members ``r + shift`` of each family it reads): the graph is then
    exactly those members of those families and of the families they read.
    Each family's members are checked against what was noted (their inputs
    still the parents' members, or constants of the noted shape), and what
    the walk would rewrite or number is left to it: model calls repeating a
    prompt (their draws are numbered apart, or merged when greedy), two
    families of equal pure ops or model calls on the same inputs (merged,
    or numbered apart), pure ops on constants only (folded), loops and
    conds (their namespaces are numbered). Each family's first member
    stands for it among the plan's nodes.
    """
    # map() with attrgetter: these passes touch every node of graphs of 100k nodes.
    owners = list(map(_OWNER, outputs))
    try:
        families = list(map(_FAMILY, owners))
    except AttributeError:  # an output of no node (a constant or a free input)
        return None
    outs = set(families)  # families hash by identity
    if None in outs:  # an output of no family
        return None
    ranks = list(map(_RANK, owners))
    need = _ranges(families, outs, ranks, stack_min)  # type: ignore[arg-type]  # None is not in outs
    if need is None:
        return None
    found = _Found()
    number: dict[Family, int] = {}  # table family -> its family in found
    seen: set[Hashable] = set()  # (op, layout) of each family so far
    for family in sorted(need, key=_ORDER):  # readers after
        lo, hi = need[family]
        layout, members = family.layout, family.members[lo:hi]
        # A member's rank is its place in its family, unless two threads built members at once:
        # what the outputs pick by rank is checked; the rest are read by place (their readers' inputs are).
        if len(members) != hi - lo or family in outs and list(map(_RANK, members)) != list(range(lo, hi)):
            return None
        op = members[0].op  # the ops of a family are equal (one kin): the first member's serves all
        traits = op.traits
        generate = traits.run is Run.GENERATE
        if traits.run is Run.CONTROL or traits.pure and not generate and Family not in set(map(type, layout)):
            return None
        if traits.pure or generate:  # an impure step is never merged: two of them on the same inputs both run
            try:
                if (op, layout) in seen:
                    return None
                seen.add((op, layout))
            except TypeError:  # an op with unhashable parameters is never merged
                pass
        rows = list(map(_INPUTS, members))
        if set(map(len, rows)) != {len(layout)}:
            return None
        parts: list[Any] = []
        for position, part in enumerate(layout):
            inputs = list(map(itemgetter(position), rows))
            if type(part) is Family:
                shift = family.shifts[position]
                if list(map(_OWNER, inputs)) != part.members[lo + shift:hi + shift]:
                    return None  # rewired since it was built
                parts.append(number[part])
                continue
            if set(map(type, inputs)) != {Constant}:
                return None  # a free input (or a Variable no longer a Constant's)
            values = list(map(_VALUE, inputs))
            texts = all_text(values)  # the common case: checked in bulk (never empty)
            if generate and (not texts or len(set(values)) != hi - lo) or texts and part != () or not texts and (
                    set(map(_SHAPE, inputs)) != {part} or not stackable(inputs[0], False) or any(map(_RAGGED, inputs))):
                return None  # a prompt not text or asked twice, or not the noted shape
            parts.append(part)
            found.constants[len(found.members), position] = (inputs, values)  # type: ignore[assignment]  # Constants
        number[family] = len(found.members)
        found.members.append(members)
        found.layouts.append(tuple(parts))
        found.above.append(sorted({part for part in parts if type(part) is int}))
        found.broken.append(False)
        found.count += hi - lo
    found.family_of, found.rank = list(range(len(found.members))), [0] * len(found.members)
    if {need[family][0] for family in outs} != {0}:
        ranks = [rank - need[family][0] for family, rank in zip(families, ranks)]
    if len(outs) == 1:  # the common case: one family of outputs (no per-output call)
        found.picked = ([number[families[0]]] * len(families), ranks)
    else:
        found.picked = (list(map(number.__getitem__, families)), ranks)
    return found


def _input_key(variable: Variable) -> Hashable:
    """Equal keys: interchangeable inputs (the same Variable, or equal simple constants)."""
    if isinstance(variable, Constant):
        value = variable.value
        if type(value) is str:
            return value  # most constants; their canonical text is one-to-one with them
        if _keyed(value) or (
            isinstance(value, np.ndarray) and value.dtype == object and value.size <= 4096
            and all(_keyed(v) for v in value.reshape(-1).tolist())
        ):
            return canonical(value)
    return id(variable)


def _stacked_constant(constants: list[Constant], values: list[Any] | None = None, whole: bool = False) -> Constant:
    """The constants of a family's members along a new leading axis (one scalar shared by all: itself).

    ``whole``: an array even of one shared scalar, for a node whose elements
    are as many as this input's leading axis: a loop, an impure op (on one
    constant, each member is still one element, and one call), or a node
    reading no family (nothing else gives it its leading axis). ``values``:
    theirs, when the caller has them already.
    """
    first = constants[0]
    if first.shape == ():
        if values is None:
            values = list(map(_VALUE, constants))
        texts = all_text(values)  # (a family is never empty)
        if texts and not whole and len(constants) > 1 and len(set(values)) == 1:
            return first  # an elementwise op pairs one scalar with every element: one text shared by all
        array = np.empty(len(constants), dtype=object)
        if texts:
            array[:] = values
        else:
            for i, value in enumerate(values):  # one by one: a list stays one element
                array[i] = value
        return Constant(array)
    return Constant(np.stack([c.value if isinstance(c.value, np.ndarray) else as_object_array(c.value)
                              for c in constants]).astype(object))


def _keyed(value: Any) -> bool:
    kind = type(value)
    return kind in _SCALARS or (kind is float and not value.is_integer())


def _fold(node: Apply, inputs: Sequence[Constant]) -> Constant | None:
    """The value of a pure inline op on Constants, or ``None`` to leave it to eval."""
    if node.op.traits.run is not Run.INLINE or len(node.outputs) != 1:
        return None
    try:
        value = node.op.perform(*(v.value for v in inputs))
    except Exception:  # noqa: BLE001 - eval raises it again, naming the node
        return None
    return Constant(value, name=node.outputs[0].name)


def _rebuild(node: Apply, inputs: Sequence[Variable]) -> Apply:
    """``node``'s op on rewritten inputs, keeping its creation order and output names."""
    new = Apply(node.op, inputs, len(node.outputs), sibling=False)
    new.order = node.order
    for old, output in zip(node.outputs, new.outputs):
        output.name = old.name
    return new


def _leaves(nodes: list[Apply], outputs: list[Variable]) -> Iterable[Variable]:
    for output in outputs:
        if output.owner is None:
            yield output
    for node in nodes:
        for variable in node.inputs:
            if variable.owner is None:
                yield variable


def as_value(value: Any) -> Any:
    """Normalize a given: lists and tuples become NumPy object arrays."""
    if isinstance(value, (list, tuple)):
        return as_object_array(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.astype(object)
    return value


def bind_givens(plan: Plan, givens: Mapping[Any, Any] | None, *, partial: bool = False) -> dict[int, Any]:
    """Values of the plan's inputs and constants, keyed by ``id(variable)``.

    ``partial=True`` (a dry run) leaves unbound inputs out instead of raising;
    a name the graph does not have warns either way (a misspelt name would
    otherwise look like an input left unknown on purpose).

    Raises
    ------
    UnboundInputError
        Listing every free input that ``givens`` leaves unbound.
    TypeError
        When a key of ``givens`` is neither a Variable nor a name.

    Warns
    -----
    UserWarning
        When ``givens`` names (by string) inputs that the graph does not have.
    """
    givens = dict(givens or {})
    by_name: dict[str, Any] = {}
    by_variable: dict[int, Any] = {}
    for key, value in givens.items():
        if isinstance(key, Variable):
            by_variable[id(key)] = value
        elif isinstance(key, str):
            by_name[key] = value
        else:
            raise TypeError(f"givens keys must be input Variables or their names, got {type(key).__name__} {key!r:.40}")
    values: dict[int, Any] = {id(c): c.value for c in plan.constants}
    missing = []
    for variable in plan.inputs:
        if id(variable) in by_variable:
            values[id(variable)] = as_value(by_variable[id(variable)])
        elif variable.name is not None and variable.name in by_name:
            values[id(variable)] = as_value(by_name[variable.name])
        else:
            missing.append(variable.label)
    names = {variable.name for variable in plan.inputs if variable.name is not None}
    unknown = [name for name in by_name if name not in names]
    if unknown:
        # Said, not raised: one givens dict for a whole program may bind inputs
        # that the part being evaluated does not use. A misspelt name still
        # shows here (and as a missing input below).
        known = ", ".join(repr(n) for n in sorted(names)) or "none"
        warnings.warn(
            f"givens name input(s) this graph does not have, ignored: {', '.join(repr(n) for n in unknown)} "
            f"(its inputs: {known})",
            UserWarning,
            stacklevel=3,
        )
    if missing and not partial:
        raise UnboundInputError(missing)
    return values


def check_shapes(plan: Plan, values: Mapping[int, Any]) -> None:
    """Raise ``GraphBuildError`` when the bound inputs' shapes cannot pair somewhere in ``plan``.

    ``values`` are the bound values (``bind_givens``); an input left unbound
    keeps the shape it was built with. Called by every entry point before its
    schedule starts, so a pairing that cannot work costs no draw.

    Raises
    ------
    GraphBuildError
        Naming the node and both shapes.
    """
    changed = {}
    for variable in plan.inputs:
        if id(variable) in values:
            shape = shape_of(values[id(variable)])
            if shape != variable.shape:  # as built: its pairings were checked when the graph was built
                changed[id(variable)] = shape
    propagate(plan.nodes, changed)
