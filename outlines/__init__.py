"""outlines: programs that call language models, as lazy dataflow graphs.

Calling a model, a prompt or an ``outlines.fn`` on symbolic values builds
nodes; ``eval`` schedules them with batching, concurrency and caching.
"""
from __future__ import annotations

from typing import Any

from outlines import cache, chat, config, models, text  # config: the public face of outlines.common.config
from outlines.runtime.program import Program, chain, compile
from outlines.common.errors import BudgetExceeded, Failure, GraphBuildError, JobsRunning, NodeError, UnboundInputError
from outlines.runtime.budget import Budget
from outlines.runtime.evaluate import aeval, eval
from outlines.runtime.explain import explain
from outlines.runtime.jobs import Jobs, cancel_jobs, forget_job, jobs
from outlines.runtime.stream import Stream, as_completed
from outlines.fn import elemwise, fn
from outlines.graph.control import cond, where, while_loop
from outlines.graph.basic import Constant, Variable, constant, string
from outlines.graph.ops import concatenate, expand_dims, stack
from outlines.graph.ragged import Ragged
from outlines.text import prompt
from outlines.voting import (
    Cascade,
    Vote,
    Votes,
    calibrate_cascade,
    cascade,
    stop_when_ahead,
    stop_when_confident,
    stop_when_iteration_agrees,
    vote,
)

__version__ = "0.1.0"

# Backends note server quirks; the cache keeps them across processes. Neither
# imports the other, so the process state's quirk store is set here, once
# (outlines.backends.quirks.use_store, outlines.common.config.ProcessState).
from outlines.backends import quirks as _quirks  # noqa: E402
from outlines.cache.quirks import DefaultCacheQuirks as _DefaultCacheQuirks  # noqa: E402

_quirks.use_store(_DefaultCacheQuirks())

__all__ = [
    "Budget",
    "BudgetExceeded",
    "Cascade",
    "Constant",
    "Failure",
    "GraphBuildError",
    "Jobs",
    "JobsRunning",
    "NodeError",
    "Program",
    "Ragged",
    "Stream",
    "UnboundInputError",
    "Variable",
    "Vote",
    "Votes",
    "aeval",
    "as_completed",
    "cache",
    "calibrate_cascade",
    "cancel_jobs",
    "cascade",
    "chain",
    "chat",
    "compile",
    "cond",
    "concatenate",
    "config",
    "constant",
    "elemwise",
    "eval",
    "expand_dims",
    "explain",
    "fn",
    "forget_job",
    "jobs",
    "models",
    "prompt",
    "stack",
    "stop_when_ahead",
    "stop_when_confident",
    "stop_when_iteration_agrees",
    "string",
    "text",
    "trace",
    "visualize",
    "vote",
    "where",
    "while_loop",
]


def trace() -> Any:
    """Record every evaluation run inside the block: what ran, when, in which batch.

    A context manager: ``with outlines.trace() as t:`` records every
    evaluation started inside the block (``eval``, ``aeval``, calling a
    ``Program``, a stream).

    Returns
    -------
    outlines.tracing.Trace
        Filled in as evaluations run; read it after (or during) the block:
        ``summary()`` (a text table per kind of node and per backend),
        ``errors()``, ``timeline(path)`` (a Gantt chart), ``to_json(path)``,
        ``cost(prices)``, and the records ``nodes``, ``batches``,
        ``requests``, ``iterations`` (one per loop iteration), ``evals``.

    Examples
    --------
    >>> import outlines
    >>> question = outlines.string("question")
    >>> with outlines.trace() as t:
    ...     _ = (question + "?").eval({question: ["why", "how"]}, cache=False)
    >>> len(t.evals)
    1
    >>> print(t.summary())  # doctest: +ELLIPSIS
    outlines trace: 1 evaluation(s), ... node(s)
    ...
    """
    from outlines.runtime.tracing import trace as _trace

    return _trace()


def visualize(*variables: Any, filename: str | None = None, format: str | None = None, trace: Any = None) -> Any:  # noqa: A002
    """Draw the graph computing ``variables``: as graphviz, mermaid or plain text.

    Each node shows what it is (an input, a constant, a prompt, a model call
    with its backend and parameters, a Python step, a loop with its body drawn
    as a cluster); edges go from an argument to the node that reads it. A
    sampling call numbered after another call on the same prompt says which
    draws it takes (``draws 1``): draw numbers count the calls drawn together
    (see ``outlines.explain``'s ``draw_numbers``). No secret (API key,
    header) ever appears in a picture.

    Parameters
    ----------
    *variables
        Variables (or a ``Program``) to draw, with everything they depend on.
    filename
        Where to write the picture; its extension picks the format when
        ``format`` is not given (``.svg .png .pdf .dot .gv .mmd .md .txt``;
        ``.md`` wraps the mermaid text in a fenced block).
    format
        One of ``dot``, ``svg``, ``png``, ``pdf`` (graphviz: need the
        ``graphviz`` package of the ``viz`` extra, and all but ``dot`` need the
        ``dot`` program), ``mermaid`` or ``ascii`` (no dependency). Default:
        from ``filename``, else ``svg``.
    trace
        A ``Trace`` of an evaluation (``outlines.trace()``): nodes then show
        their time (and how much of it was queueing), batch, cache hits and
        errors. It is matched by structure, so the trace of a ``Program``
        overlays on a separately built identical graph.

    Returns
    -------
    graphviz.Digraph or str
        A ``Digraph`` for the graphviz formats (it renders itself in
        Jupyter), the text for ``mermaid`` and ``ascii`` (a ``str`` that
        Jupyter shows as text rather than as an escaped string).

    Raises
    ------
    ImportError
        A graphviz format without the ``graphviz`` package (the ``viz`` extra:
        ``pip install -e '.[viz]'``).
    RuntimeError
        Rendering svg/png/pdf to a file without the ``dot`` program.
    ValueError
        An unknown ``format``, or a ``filename`` whose extension names none.

    Examples
    --------
    >>> import outlines
    >>> question = outlines.string("question")
    >>> print(outlines.visualize(question + "?", format="ascii"))
    outlines graph: 3 nodes, 2 edges
    [1] input    question  input
    [2] constant '?'
    [3] op       + (concat)  => output
          <- 0=[1], 1=[2]
    <BLANKLINE>
    >>> print(outlines.visualize(question + "?", format="mermaid"))  # doctest: +ELLIPSIS
    flowchart TD
    ...
    """
    from outlines.graph.viz.writers import visualize as _visualize

    return _visualize(*variables, filename=filename, format=format, trace=trace, draws=_draw_numbers(variables))


def _draw_numbers(values: tuple[Any, ...]) -> dict[int, tuple[int, int]]:
    """The draw numbers of the model calls of ``values`` evaluated together (``Plan.draw_numbers``)."""
    from outlines.runtime.plan import Plan

    variables: list[Any] = []
    for value in values:
        outputs = value.outputs if isinstance(value, Program) else value
        variables.extend(outputs if isinstance(outputs, (tuple, list)) else [outputs])
    try:
        return Plan([v for v in variables if isinstance(v, Variable)]).draw_numbers()
    except Exception:  # noqa: BLE001 - a picture draws what it can; eval reports the graph's errors
        return {}
