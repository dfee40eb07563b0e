"""The static part of an evaluation, built in one pass over the graph.

A ``Plan`` is built once per set of outputs (a ``Program`` keeps its own). One
walk over the Apply nodes in creation order (a topological order) does three
things at once (and ``outlines.eval``'s plans a fourth after it: sibling model
calls built one by one are stacked into array nodes, see ``Plan._stack``):

- rewrites: a pure node whose op (equal by its parameters) and inputs match an
  earlier one is replaced by it, so two identical prompt renders, or two greedy
  calls on one prompt, become one node; a pure inline op whose inputs are all
  Constants is evaluated now into a Constant (folded);
- numbering: the k draws of a random model call get numbers ``n..n+k-1``, where
  ``n`` counts earlier draws of the same backend, params and prompt, so
  rebuilding the same program replays the same draws;
- structure: the kept nodes in order, the in-degree and consumers of each.

Inputs match when they are the same Variable, or Constants of simple values
whose ``canonical`` text (``outlines.keys``) is equal. Random draws and
impure ops are never merged; free inputs and Constants are kept as the same
objects, so givens still bind. Nothing recurses.
"""
from __future__ import annotations

import warnings
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Hashable, Iterable, Mapping, Sequence

import numpy as np

from outlines.config import Tuning
from outlines.keys import canonical
from outlines.errors import UnboundInputError
from outlines.graph.basic import Apply, Constant, Variable, as_object_array
from outlines.graph.families import Family, stackable
from outlines.graph.ops import Gather, all_text
from outlines.graph.shapes import propagate, shape_of
from outlines.graph.traversal import rewired_error, toposort

__all__ = ["Plan", "bind_givens", "check_shapes"]

_OWNER, _FAMILY, _RANK, _INPUTS = attrgetter("owner"), attrgetter("family"), attrgetter("rank"), attrgetter("inputs")
_VALUE, _SHAPE, _RAGGED = attrgetter("value"), attrgetter("shape"), attrgetter("ragged")
# Constants of these exact types (and object arrays of them) are keyed by value.
# Integral floats are not: canonical text writes 1.0 as 1 and -0.0 as 0, which
# is right for a backend's parameters but not for a value a Python op reads.
_SCALARS = (str, int, bool, type(None))
#: The fewest sibling uses ``Plan(stack=True)`` stacks into one array node, by default (``Tuning.stack_min``).
STACK_MIN = Tuning.stack_min


class Plan:
    """Nodes of a graph in topological order, with their dependency structure.

    Parameters
    ----------
    outputs
        The Variables to compute.
    stack, stack_min
        Stack sibling uses of an op, at least ``stack_min`` of them, into one
        node (``_stack``; ``outlines.config.Tuning.stack_min``).

    Attributes
    ----------
    outputs
        Variables computing the same values in the same order: the originals
        where nothing was rewritten, otherwise merged or folded ones.
    nodes
        Apply nodes, each after the owners of its inputs (creation order).
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

    Examples
    --------
    >>> from outlines.graph.ops import Concat
    >>> plan = Plan([Concat()("a", "b")])
    >>> plan.outputs[0].value, len(plan.nodes)
    ('ab', 0)
    """

    def __init__(self, outputs: Iterable[Variable], *, stack: bool = False, stack_min: int = STACK_MIN) -> None:
        self.stack_min = stack_min  # the fewest sibling uses that stack (``outlines.config.Tuning.stack_min``)
        outputs = list(outputs)
        if not all(map(isinstance, outputs, repeat(Variable))):
            argument, output = next((i, v) for i, v in enumerate(outputs) if not isinstance(v, Variable))
            raise TypeError(f"eval expects symbolic Variables; argument {argument} is {type(output).__name__}")
        self.nodes: list[Apply] = []
        self.indegree: list[int] = []
        self.consumers: list[list[int]] = []
        self.draw_offsets: dict[int, int] = {}
        self.tag_offsets: dict[int, int] = {}
        #: id(stacked Apply) -> (member output, its element) for each member output a node left out reads:
        #: the scheduler stores each such element under the member's output when the stacked node finishes.
        self.scatter: dict[int, list[tuple[Variable, int]]] = {}
        #: id(stacked loop or cond) -> the first namespace tag of each element (its own node's ``tag_offsets``).
        self.element_tags: dict[int, np.ndarray] = {}
        if stack and self._from_families(outputs):
            return
        tags = 0  # namespace tags taken by the control nodes so far
        replaced: dict[int, Variable] = {}  # id(original Variable) -> its replacement
        merged: dict[Hashable, Apply] = {}  # (op, noutputs, input keys) of a pure node -> the node computing it
        draws: dict[Hashable, int] = {}  # (stream number, prompt key) -> draws numbered so far
        streams: dict[int, int] = {}  # id(Generate op) -> number of its (backend, params)
        stream_numbers: dict[Hashable, int] = {}  # (backend, params) -> its number
        position: dict[int, int] = {}
        stackables = 0  # nodes that joined a family: stacking runs only when there are enough
        # Per op object, once: (merge token, pure, a model call, its stacked op, a loop or branch, gathered).
        # Equal ops share a token, so a node's merge key hashes in C (an op's own hash and equality
        # run in Python).
        ops: dict[int, tuple[Any, bool, bool, Any, bool, bool]] = {}
        tokens: dict[Any, int] = {}
        # Families of sibling nodes, found on the way when stacking (see _stack).
        family_of: list[int] = []  # per kept node: its family, or -1
        rank: list[int] = []  # per kept node: its index in its family
        families: list[list[int]] = []
        signatures: dict[tuple[Any, ...], int] = {}  # (op token, per input: its family or a constant's shape) -> family
        above: list[list[int]] = []  # per family: the families its inputs come from
        broken: list[bool] = []  # per family: not member for member with a parent
        gathered: list[bool] = []  # per family: uses of an impure step, kept one node each (see _stack)
        layouts: list[tuple[Any, ...]] = []  # per family: per input, its family (int) or a constant's shape
        # Bound once: this loop runs once per node of graphs of 100k nodes.
        nodes, offsets = self.nodes, self.draw_offsets
        leaves: dict[int, Variable] = {}  # the free inputs and Constants read, in order of first use
        # Per kept node, its inputs' nodes (linked once, ``_link``): the index of its one parent, -1 for
        # none, or their list; ints, so that a node adds no container for the collector to walk.
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
                token: Any = None
                stacker = op.stacked() if stack else None
                if op.pure or stacker is not None:
                    try:
                        token = tokens.setdefault(op.kin, len(tokens))  # control ops: by their structure
                    except TypeError:  # an op with unhashable parameters is never merged
                        pass
                gather = stack and stacker is None and op.gathered  # it never stacks; what reads it may
                info = ops[id(op)] = (token, bool(op.pure), op.mode == "generate", stacker, op.mode == "control", gather)
            token, pure, generate, stacker, control, gather = info
            # One pass over the inputs: their keys, parents, and whether all are Constants.
            constants = True
            parents: list[int] = []
            input_keys: list[Hashable] = []
            try:
                if not (pure or generate):  # nothing to merge or number (a plain fn step): only its parents
                    for v in inputs:
                        owner = v.owner
                        if owner is None:
                            leaves[id(v)] = v
                        else:
                            parents.append(position[id(owner)])
                else:
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
            except KeyError:  # an input not computed yet: only a graph rewired after it was built
                raise rewired_error(node, position) from None
            if pure:
                if constants:
                    constant = _fold(node, inputs)
                    if constant is not None:
                        replaced[id(node.outputs[0])] = constant
                        continue
                if token is not None:
                    key = (token, len(node.outputs), tuple(input_keys))
                    found = merged.get(key)
                    if found is not None:
                        replaced.update((id(old), new) for old, new in zip(node.outputs, found.outputs))
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
            if not pure and generate:
                # Draws are numbered per (backend, params, prompt), whatever num_samples;
                # (backend, params) is numbered once per op, its hash runs in Python.
                number = streams.get(id(op))
                if number is None:
                    base = (op.backend, op.params)  # type: ignore[attr-defined]
                    number = streams[id(op)] = stream_numbers.setdefault(base, len(stream_numbers))
                stream = (number, input_keys[0])
                offset = draws.get(stream, 0)
                if offset:
                    offsets[id(kept)] = offset
                draws[stream] = offset + op.num_samples  # type: ignore[attr-defined]
            index = position[id(kept)] = len(nodes)  # after its parents: a node reading itself is caught
            nodes.append(kept)
            uplinks.append(parents[0] if len(parents) == 1 else parents or -1)
            if stack:
                family = -1
                if (stacker is not None or gather and kept.outputs[0].shape == ()) and len(kept.outputs) == 1 and (
                        id(kept) not in offsets) and (
                        not control or all(v.shape == () for v in inputs)):  # a loop stacks over one element each
                    # The one rule: each input is a constant (of a known shape) or a member of a
                    # family; siblings of one op with the same layout of inputs form a family.
                    layout: list[Any] = []
                    ups: list[int] = parents  # the inputs' nodes, in input order (not sorted when stacking)
                    for variable in inputs:
                        owner = variable.owner
                        if owner is not None:
                            up_family = family_of[position[id(owner)]]
                            if up_family < 0:
                                break
                            layout.append(up_family)
                        elif isinstance(variable, Constant) and stackable(variable, generate):
                            layout.append(variable.shape)
                        else:  # a free input: its value is known only when it is bound
                            break
                    else:
                        if not generate or inputs[0].shape == ():  # a model call stacks over one prompt each
                            signature = (token if token is not None else id(op), tuple(layout))
                            family = signatures.get(signature, -1)
                            if family < 0:
                                family = signatures[signature] = len(families)
                                families.append([])
                                above.append(sorted({family_of[up] for up in ups}))
                                broken.append(False)
                                gathered.append(gather)
                                layouts.append(signature[1])
                            members = families[family]
                            for up in ups:
                                if rank[up] != len(members):  # not member for member: it would need a gather
                                    broken[family] = True
                            rank.append(len(members))
                            members.append(index)
                            stackables += 1
                family_of.append(family)
                if family < 0:
                    rank.append(0)
        self.outputs = [replaced.get(id(v), v) for v in outputs]
        #: output position -> (the stacked Variable computing it, its index there); see ``_stack``.
        self.picks: dict[int, tuple[Variable, int]] = {}
        #: id(stacked Apply) -> the calls it stands for, in element order (failures name them).
        self.members: dict[int, Sequence[Apply]] = {}
        if stack and stackables >= self.stack_min:
            self._stack(position, family_of, rank, families, above, broken, layouts, uplinks, gathered)
        else:
            self._link(uplinks)
        if self.members or replaced or any(v.owner is None for v in self.outputs):  # leaves rewritten or not seen
            self._read(list({id(v): v for v in _leaves(self.nodes, self.outputs)}.values()))
        else:
            self._read(list(leaves.values()))

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
            op: Any = node.op
            if op.mode == "generate" and not op.params.deterministic:
                first = self.draw_offsets.get(id(node), 0)
                out[node.order] = (first, first + op.num_samples - 1)
        return out

    def pick(self, results: list[Any]) -> list[Any]:
        """The values of the original outputs, given the values of ``outputs`` (see ``picks``)."""
        if not self.picks:
            return results
        return [results[i][self.picks[i][1]] if i in self.picks else value for i, value in enumerate(results)]

    def _from_families(self, outputs: list[Variable]) -> bool:
        """Stack whole families noted as the graph was built (``outlines.graph.families``), walking no node.

        Applies when every output is a member of a family, the outputs of
        each family one contiguous range of ranks ``[lo, hi)`` of at least
        ``stack_min``, and each family read over one range (member ``r``
        reads members ``r + shift``): the graph is then exactly those members
        of those families and of the families they read, and each family
        becomes one node of its stacked op, as ``_stack`` makes it; a
        gathered family (an impure step's uses) keeps its members as nodes,
        and a ``Gather`` of their results is made for the families reading
        them (``_gather_members``). Each family's members are checked against what was noted (their inputs
        still the parents' members, or constants of the noted shape). What the
        walk would rewrite is left to the walk: model calls repeating a prompt
        (their draws are numbered apart, or merged when greedy), two families
        of equal ops on the same inputs (merged), pure ops on constants only
        (folded). Returns False, having changed nothing, when anything differs.
        """
        # map() with attrgetter: these passes touch every node of graphs of 100k nodes.
        owners = list(map(_OWNER, outputs))
        try:
            families = list(map(_FAMILY, owners))
        except AttributeError:  # an output of no node (a constant or a free input)
            return False
        kinds = set(families)  # families hash by identity
        if None in kinds:  # an output of no family
            return False
        ranks = list(map(_RANK, owners))
        by_family: dict[int, tuple[Family, set[int]]] = {}
        if len(kinds) == 1:  # the common case: one family of outputs
            by_family[id(families[0])] = (families[0], set(ranks))
        else:
            for family, rank in zip(families, ranks):
                by_family.setdefault(id(family), (family, set()))[1].add(rank)
        # The ranks each family must give, [lo, hi): the outputs' own, and their parents' shifted.
        need: dict[int, tuple[int, int]] = {}
        closure: dict[int, Family] = {}
        for family, asked in by_family.values():
            lo, hi = min(asked), max(asked) + 1
            if len(asked) != hi - lo or hi - lo < self.stack_min:
                return False
            need[id(family)] = (lo, hi)
        todo = [family for family, _ in by_family.values()]
        while todo:
            family = todo.pop()
            if id(family) not in closure:
                closure[id(family)] = family
                todo.extend(family.parents)
        ordered = sorted(closure.values(), key=lambda f: f.order)  # the families a family reads come first
        for family in reversed(ordered):  # children first (a parent is made before them): each passes its range up
            lo, hi = need[id(family)]
            for parent in family.parents:
                wanted = (lo + family.shift, hi + family.shift)
                if need.setdefault(id(parent), wanted) != wanted:
                    return False  # read over two ranges: some members of it are read by others
        seen: set[Hashable] = set()
        stacked: dict[int, Apply] = {}  # per family: its stacked node, or a gathered family's Gather node once read
        gathered_members: dict[int, list[Apply]] = {}  # per gathered family: its members in the plan
        nodes: list[Apply] = []
        members_of: dict[int, Sequence[Apply]] = {}
        scatter: dict[int, list[tuple[Variable, int]]] = {}
        aliases: dict[int, Apply] = {}  # id(member of a stacked family read by a gathered one) -> its stacked node

        def source(part: Family) -> Variable:
            """What a stacked family reads of ``part``: its stacked node, or its members gathered (made once)."""
            node = stacked.get(id(part))
            if node is None:  # after the gathered members (families come in order), before this reader
                node = stacked[id(part)] = _gather_node(gathered_members[id(part)])
                nodes.append(node)
            return node.outputs[0]

        for family in ordered:
            op, layout = family.op, family.layout
            generate, gathered = op.mode == "generate", op.gathered
            if not (generate or gathered) and not any(type(part) is Family for part in layout):
                return False  # a pure op on constants only: the walk folds it
            try:
                if not gathered and (op, layout) in seen:
                    return False  # equal ops on the same inputs: the walk merges them, or numbers their draws apart
                seen.add((op, layout))
            except TypeError:  # an op with unhashable parameters is never merged
                pass
            lo, hi = need[id(family)]
            count = hi - lo
            members = family.members[lo:hi]
            rows = list(map(_INPUTS, members))
            if len(members) != count or set(map(len, rows)) != {len(layout)}:
                return False
            if gathered:  # each member kept as built, reading its elements; then their results gathered
                if not self._gather_members(family, members, rows, lo, need, stacked, scatter, aliases):
                    return False
                nodes.extend(members)
                gathered_members[id(family)] = members
                continue
            # A member's rank is its place in its family, unless two threads built members at once: what
            # the outputs pick by rank is checked; the rest are read by place (their children's inputs are).
            if id(family) in by_family and list(map(_RANK, members)) != list(range(lo, hi)):
                return False
            sources: list[Variable] = []
            for number, part in enumerate(layout):
                inputs = list(map(itemgetter(number), rows))
                if type(part) is Family:
                    if list(map(_OWNER, inputs)) != part.members[lo + family.shift:hi + family.shift]:
                        return False  # rewired since it was built
                    sources.append(source(part))
                    continue
                if set(map(type, inputs)) != {Constant}:
                    return False  # a free input (or a Variable no longer a Constant's)
                values = list(map(_VALUE, inputs))
                texts = all_text(values)  # the common case: checked in bulk (count >= stack_min, never empty)
                if generate and (not texts or len(set(values)) != count):
                    return False  # not text, or a prompt asked twice: the walk numbers its draws (or merges greedy calls)
                if texts and part != () or not texts and (
                        set(map(_SHAPE, inputs)) != {part} or not stackable(inputs[0], False) or any(map(_RAGGED, inputs))):
                    return False
                sources.append(_stacked_constant(inputs, values))  # type: ignore[arg-type]
            new = stacked[id(family)] = _stacked_node(op, sources, members, members_of)
            nodes.append(new)
        kept = [key for key in by_family if key in gathered_members]  # outputs of gathered families: as built
        if len(by_family) == 1 and not kept:
            self.outputs = [stacked[id(families[0])].outputs[0]] * len(outputs)
        else:
            chosen = {key: node.outputs[0] for key, node in stacked.items() if key not in gathered_members}
            self.outputs = [chosen[id(family)] if id(family) in chosen else output
                            for family, output in zip(families, outputs)]
        starts = {need[key][0] for key in by_family}
        if starts == {0}:
            elements = ranks
        else:
            first = {key: need[key][0] for key in by_family}
            elements = [rank - first[id(family)] for family, rank in zip(families, ranks)]
        self.picks = dict(enumerate(zip(self.outputs, elements)))
        if kept:
            for at in [at for at, family in enumerate(families) if id(family) in gathered_members]:
                del self.picks[at]
        self.members = members_of
        self.scatter = scatter
        self.nodes = nodes
        self._link(aliases=aliases)
        self._read(list({id(v): v for v in _leaves(self.nodes, self.outputs)}.values()))
        return True

    @staticmethod
    def _gather_members(family: Family, members: list[Apply], rows: list[tuple[Variable, ...]], lo: int,
                        need: dict[int, tuple[int, int]], stacked: dict[int, Apply],
                        scatter: dict[int, list[tuple[Variable, int]]], aliases: dict[int, Apply]) -> bool:
        """Check a gathered family's members as ``_from_families`` checks a stacked one's; note what they read.

        A member reading a member of a stacked family reads its element: the
        stacked node scatters it (``scatter``) and the member waits for that
        node (``aliases``). One reading a gathered family's member reads it
        as built; constants stay its own. False when anything differs.
        """
        if any(member.outputs[0].shape != () for member in members):
            return False  # the Gather holds one scalar per member
        hi = lo + len(members)
        for number, part in enumerate(family.layout):
            inputs = list(map(itemgetter(number), rows))
            if type(part) is not Family:
                if set(map(type, inputs)) != {Constant}:
                    return False  # a free input (or a Variable no longer a Constant's)
                continue
            owners = list(map(_OWNER, inputs))
            if owners != part.members[lo + family.shift:hi + family.shift]:
                return False  # rewired since it was built
            if part.op.gathered:
                continue  # a gathered family's members are nodes of the plan: read as built
            source = stacked[id(part)]
            start = lo + family.shift - need[id(part)][0]  # the element of the first member's input there
            scatter.setdefault(id(source), []).extend(zip(inputs, range(start, start + len(inputs))))
            aliases.update(zip(map(id, owners), repeat(source)))
        return True

    def _stack(
        self, position: dict[int, int], family_of: list[int], rank: list[int], families: list[list[int]],
        above: list[list[int]], broken: list[bool], layouts: list[tuple[Any, ...]],
        uplinks: list[int | list[int]] | None, gathered: list[bool],
    ) -> None:
        """Stack sibling nodes into array nodes: 5,000 chains built one by one run as one array each step.

        One rule for every op (``Op.stacked``: model calls of one draw, and
        pure elementwise ops: templates, ``+``, pure ``outlines.fn`` steps,
        parses, ``Index``). A *family* is the uses of one op (equal by its
        parameters) whose inputs are, position by position, constants of one
        shape or the members of one family, member for member in the same
        order (found by ``__init__``'s walk: ``family_of`` and ``rank`` of
        each node, each family's members, parents, ``layouts`` and whether it
        is ``broken``, not member for member). A family of at least
        ``stack_min`` nodes whose parent families are stacked becomes one node
        of the stacked op over the arrays of its inputs (the constants of its
        members stacked into one array, or kept when all are one scalar): the
        scheduler then runs, sends, caches and waits for it in bulk. A node
        left out that reads a member's output is kept as built: it waits for
        the stacked node, which gives the member's output its element
        (``scatter``), so nothing downstream is rebuilt. Draw numbers, keys and values are unchanged (a call
        with a draw offset, or with samples, is never stacked); ``picks`` maps
        each output of the plan to its element, ``members`` each stacked node
        to the nodes it stands for (failures name them). The uses of an impure
        step (``gathered`` families) never stack: each stays its own node, run
        once, but a family reading them member for member still stacks, over
        a ``Gather`` node of their results in order. Loops and conds stack
        by their traced structure (``Op.kin``) over members of one element
        each; ``element_tags`` keeps each element's own namespace tag. ``uplinks``, the
        walk's parents of each node, link the nodes when no family stacks.
        """
        nodes = self.nodes
        valid = [len(m) >= self.stack_min and not broken[f] for f, m in enumerate(families)]
        for family, ups in enumerate(above):  # parents come first: one pass settles it
            # A parent with more members than its child: its stacked array holds elements nobody reads.
            if valid[family] and not all(valid[up] and len(families[up]) == len(families[family]) for up in ups):
                valid[family] = False
        if not any(valid):
            self._link(uplinks)
            return
        stacked: dict[int, Apply] = {}
        gathers: dict[int, Apply] = {}  # gathered family -> its Gather node, made for the first family reading it

        def element(variable: Variable) -> tuple[Variable, int] | None:
            """(stacked output, element) of a stacked call's output; None for anything else."""
            owner = variable.owner
            if owner is None:
                return None
            at = position.get(id(owner), -1)
            family = family_of[at] if at >= 0 else -1
            return (stacked[family].outputs[0], rank[at]) if family >= 0 and valid[family] and not gathered[family] \
                else None

        def gather(family: int) -> Variable:
            """The output of the Gather node of ``family``'s members, made (and kept) the first time it is read."""
            node = gathers.get(family)
            if node is None:
                node = gathers[family] = _gather_node([nodes[i] for i in families[family]])
                kept.append(node)
            return node.outputs[0]

        aliases: dict[int, Apply] = {}  # id(member read by a node left out) -> its stacked node
        kept: list[Apply] = []
        for index, node in enumerate(nodes):
            family = family_of[index]
            if family < 0 or not valid[family] or gathered[family]:
                for variable in node.inputs:
                    if variable.owner is None or id(variable.owner) in aliases:
                        continue
                    found = element(variable)
                    if found is not None:  # a stacked call's output read by a node left out: its element
                        source = found[0].owner
                        aliases[id(variable.owner)] = source  # type: ignore[assignment]
                        self.scatter.setdefault(id(source), []).append((variable, found[1]))
                kept.append(node)
                continue
            if family not in stacked:
                members = families[family]
                sources: list[Variable] = []
                for number, part in enumerate(layouts[family]):
                    if type(part) is int:  # the outputs of a stacked (or gathered) family, member for member
                        sources.append(gather(part) if gathered[part] else stacked[part].outputs[0])
                    else:
                        sources.append(_stacked_constant([nodes[i].inputs[number] for i in members],  # type: ignore[misc]
                                                         whole=node.op.mode == "control"))
                new = stacked[family] = _stacked_node(node.op, sources, [nodes[i] for i in members], self.members)
                if node.op.mode == "control":  # each element draws in its own loop's namespaces
                    self.element_tags[id(new)] = np.array([self.tag_offsets.get(nodes[i].order, 0) for i in members])
                kept.append(new)
        for number, output in enumerate(self.outputs):
            found = element(output)
            if found is not None:
                self.picks[number] = found
                self.outputs[number] = found[0]
        self.nodes = kept
        self._link(aliases=aliases)
        if gathers:  # a Gather and what reads it were placed before the last members it gathers
            self._sort()

    def _sort(self) -> None:
        """Reorder ``nodes`` (and ``indegree``, ``consumers``) so that each comes after the nodes it waits for."""
        indegree, consumers = self.indegree, self.consumers
        left = list(indegree)
        order = [index for index, count in enumerate(left) if not count]
        for index in order:  # Kahn's: the list grows as nodes become ready
            for consumer in consumers[index]:
                left[consumer] -= 1
                if not left[consumer]:
                    order.append(consumer)
        if len(order) != len(indegree):
            raise RuntimeError(f"plan: {len(indegree) - len(order)} node(s) wait in a cycle after stacking")
        moved = [0] * len(order)
        for at, index in enumerate(order):
            moved[index] = at
        for readers in consumers:  # renumbered in place: no new list per node for the collector to walk
            for at, consumer in enumerate(readers):
                readers[at] = moved[consumer]
        self.nodes = [self.nodes[index] for index in order]
        self.indegree = [indegree[index] for index in order]
        self.consumers = [consumers[index] for index in order]

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


def _stacked_node(op: Any, sources: list[Variable], members: list[Apply], members_of: dict[int, Sequence[Apply]]) -> Apply:
    """The node of ``op``'s stacked op over ``sources``, standing for ``members`` (recorded in ``members_of``)."""
    new = Apply(op.stacked(), sources, sibling=False)
    new.order = members[0].order  # labelled as its first member
    members_of[id(new)] = members
    return new


def _gather_node(members: list[Apply]) -> Apply:
    """A ``Gather`` of the outputs of ``members``, in order (its own creation number: they are nodes of the plan too)."""
    return Apply(Gather(len(members)), [member.outputs[0] for member in members], sibling=False)


def _stacked_constant(constants: list[Constant], values: list[Any] | None = None, whole: bool = False) -> Constant:
    """The constants of a family's members along a new leading axis (one scalar shared by all: itself).

    ``values``: their values, when the caller has them already. ``whole``:
    an array even of one shared scalar (a loop's elements are as many as its
    inputs' leading axis: loops on one constant are still one element each).
    """
    first = constants[0]
    if first.shape == ():
        if values is None:
            values = list(map(_VALUE, constants))
        texts = all_text(values)  # (a family is never empty)
        if texts and not whole and len(set(values)) == 1:
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


def _fold(node: Apply, inputs: Sequence[Variable]) -> Constant | None:
    """The value of a pure inline op on Constants, or ``None`` to leave it to eval."""
    if node.op.mode != "inline" or len(node.outputs) != 1:
        return None
    try:
        value = node.op.perform(*(v.value for v in inputs))  # type: ignore[attr-defined]
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
