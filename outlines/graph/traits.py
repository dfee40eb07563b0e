"""What an op declares about itself: one frozen ``Traits`` record per op class.

The planner and the scheduler branch on these and nothing else: how a node
runs (``Run``: the scheduler's dispatch, ``explain``'s too), whether equal
uses may merge and fold (``pure``), whether it pairs its inputs on leading
axes with one result per element (``elementwise``), whether its ``perform``
fails element by element itself (``guards_elements``) and whether it carries
elements nobody knows yet through ``explain``'s dry run (``moves_unknown``).
Where a trait follows an instance's parameters (a model call's purity, a
user function's), the op computes its record once at construction, from
parameters that never change after (an op's hash is its parameters), and
keeps it: a record read per node is never recomputed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Run", "Traits"]


class Run(enum.StrEnum):
    """How the scheduler runs an op's nodes: each value names the ``Walk`` step that runs them.

    A ``StrEnum`` so that the value is the kind a trace records (``"generate"``...)
    and a dispatch table keyed by it hashes as fast as a ``str``.
    """

    #: A cheap op, run on the event loop (``+``, templates, indexing, stacking).
    INLINE = "inline"
    #: A user function (``outlines.fn``): inline, in a task or in the thread pool; see ``PythonStep``.
    PYTHON = "python"
    #: A model call: its draws join the batcher's queues; see ``ModelCall``.
    GENERATE = "generate"
    #: A loop or a branch, whose sub-graphs run as schedules of their own.
    CONTROL = "control"


@dataclass(frozen=True, slots=True)
class Traits:
    """What the planner and the scheduler may assume of an op; see the module docstring.

    Attributes
    ----------
    run
        How its nodes run (``Run``).
    pure
        Equal inputs give equal outputs and nothing else happens: equal uses
        merge, and an inline op on constants is folded when planned. A model
        call is pure only when greedy; a user function when declared so.
    elementwise
        It pairs its inputs on their leading axes (``outlines.graph.shapes``)
        and gives one result per element: its output shape is the paired
        shape, ragged rows are kept, a failed element fails alone, and (when
        pure) many uses stack into one node over their arrays.
    guards_elements
        Its ``perform`` takes the scheduler's ``on_error`` and
        ``on_failed_input`` and fails element by element itself.
    moves_unknown
        Its ``perform`` takes ``unknown=`` and carries that marker through
        for elements not known yet (``explain``'s dry run), moving elements
        without reading them, or passing on the ones it cannot read.
    """

    run: Run = Run.INLINE
    pure: bool = True
    elementwise: bool = False
    guards_elements: bool = False
    moves_unknown: bool = False
