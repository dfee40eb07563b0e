"""outlines: programs that call language models, as lazy dataflow graphs.

Calling a model, a prompt or an ``outlines.fn`` on symbolic values builds
nodes; ``eval`` schedules them with batching, concurrency and caching.
"""
from __future__ import annotations

from typing import Any

from outlines import cache, chat, config, models, text
from outlines.runtime.program import Program, chain, compile
from outlines.errors import BudgetExceeded, Failure, GraphBuildError, NodeError, UnboundInputError
from outlines.runtime.budget import Budget
from outlines.runtime.evaluate import aeval, eval
from outlines.runtime.explain import explain
from outlines.runtime.stream import Stream, as_completed
from outlines.fn import elemwise, fn
from outlines.graph.control import cond, where, while_loop
from outlines.graph.basic import Constant, Variable
from outlines.graph.ops import concatenate, expand_dims, stack
from outlines.graph.ragged import Ragged
from outlines.text import constant, prompt, string
from outlines.voting import Vote, Votes, vote

__version__ = "0.1.0"

__all__ = [
    "Budget",
    "BudgetExceeded",
    "Constant",
    "Failure",
    "GraphBuildError",
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
    "models",
    "prompt",
    "stack",
    "string",
    "text",
    "trace",
    "visualize",
    "vote",
    "where",
    "while_loop",
]


def trace() -> Any:
    """Record what the evaluations inside a ``with`` block did; returns a ``Trace``."""
    from outlines.tracing import trace as _trace

    return _trace()


def visualize(*variables: Any, filename: str | None = None, format: str | None = None, trace: Any = None) -> Any:  # noqa: A002
    """Draw the graph of ``variables`` (svg/png/pdf/dot/mermaid/ascii)."""
    from outlines.graph.viz.writers import visualize as _visualize

    return _visualize(*variables, filename=filename, format=format, trace=trace)
