"""Errors raised while building or evaluating graphs, the ``Failure`` value, ``CacheWarning``.

``Failure`` stands in for an element whose computation failed when a graph is
evaluated with ``errors="return"``: it says which node failed and why, and
nodes computed from it carry a Failure naming the upstream cause.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

__all__ = ["BudgetExceeded", "CacheWarning", "Failure", "GraphBuildError", "JobsRunning", "MaxIterError", "NodeError",
           "UnboundInputError", "install_hint"]


class CacheWarning(UserWarning):
    """The cache skipped something (a damaged entry, a locked file, an uncacheable model); work goes on.

    Users meet it as ``outlines.cache.CacheWarning``. It lives here, with the
    other error types, because backends warn with it too (a function model
    whose identity cannot be keyed) and backends import nothing from the cache.
    """


#: The distribution's name; ``outlines`` on the package registry is another library.
DISTRIBUTION = "outlines-dataflow"


def install_hint(extra: str) -> str:
    """The command that installs one extra of this distribution, for error messages.

    Hints never name the ``outlines`` distribution: that name belongs to an
    unrelated library on the registry. No release of this one is published
    yet, so the hint is the install from a checkout.

    Parameters
    ----------
    extra
        The extra's name in ``setup.cfg`` (``"viz"``, ``"structured"``, ...).

    Returns
    -------
    str
        The command, to quote in an error message.

    Examples
    --------
    >>> install_hint("viz")
    "pip install -e '.[viz]' in a checkout of outlines-dataflow"
    """
    return f"pip install -e '.[{extra}]' in a checkout of {DISTRIBUTION}"


class GraphBuildError(TypeError):
    """A graph cannot be built as written (wrong arity, bad argument...).

    Raised when the node is built, before anything runs, with a message
    naming the op (and, for shapes, both shapes); a ``Program`` also raises it
    when called on inputs whose shapes cannot pair, before anything is sent.

    Examples
    --------
    >>> import outlines
    >>> @outlines.prompt
    ... def ask(question):
    ...     '''Q: {{ question }} ({{ style }})'''
    Traceback (most recent call last):
    ...
    outlines.common.errors.GraphBuildError: prompt ask: the template uses style which is not parameter(s) of ask(question)
    """


class UnboundInputError(KeyError):
    """Evaluation needs free inputs that ``givens`` does not bind.

    Attributes
    ----------
    names
        Every missing input's name.

    Examples
    --------
    >>> import outlines
    >>> q = outlines.string("question")
    >>> (q + "?").eval()
    Traceback (most recent call last):
    ...
    outlines.common.errors.UnboundInputError: no value given for input(s): 'question'; pass them in givens={...} (by Variable or by name)
    """

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        super().__init__(
            "no value given for input(s): "
            + ", ".join(repr(n) for n in self.names)
            + "; pass them in givens={...} (by Variable or by name)"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class NodeError(RuntimeError):
    """A node failed during evaluation; the original exception is chained.

    Raised by ``eval`` (and Programs, streams) with ``errors="raise"``; with
    ``errors="return"`` the failed elements hold a ``Failure`` instead.

    Attributes
    ----------
    node
        The label of the failed node (``"check#12"``).
    op
        Its op, as text.
    cause
        The original exception (also ``__cause__``).

    Examples
    --------
    >>> import outlines
    >>> half = outlines.fn(lambda text: text[: len(text) // int(text)])
    >>> try:
    ...     half(outlines.constant("0")).eval()
    ... except outlines.NodeError as error:
    ...     print(type(error.cause).__name__)
    ZeroDivisionError
    """

    def __init__(self, node: str, op: str, cause: BaseException) -> None:
        self.node = node
        self.op = op
        self.cause = cause
        super().__init__(f"node {node} ({op}) failed: {type(cause).__name__}: {cause}")


class BudgetExceeded(NodeError):
    """The next batch could pass the evaluation's ``outlines.Budget``: nothing more was sent.

    Names the budget, what was spent (batches in flight counted at their
    upper bound) and what the refused batch would have needed. Everything
    that finished is cached: a re-run with a larger budget sends only the rest.
    """

    def __init__(
        self,
        node: str,
        budget: Any,
        *,
        spent_tokens: int,
        spent_cost: float,
        needed_tokens: int,
        needed_cost: float | None,
        backend: str,
        draws: int,
    ) -> None:
        self.budget = budget
        self.spent_tokens, self.spent_cost = spent_tokens, spent_cost
        self.needed_tokens, self.needed_cost = needed_tokens, needed_cost
        self.backend, self.draws = backend, draws
        money = budget.cost is not None
        spent = f"{spent_tokens} tokens" + (f" (cost {spent_cost:.6g})" if money else "")
        needed = f"{needed_tokens} tokens" + (f" (cost {needed_cost:.6g})" if money and needed_cost is not None else "")
        self.message = (
            f"budget exhausted: {budget!r} has spent {spent}; the next batch ({draws} draw(s) to {backend}) "
            f"would need up to {needed}"
        )
        RuntimeError.__init__(self, self.message)
        self.node, self.op, self.cause = node, "Generate", self

    def again(self, node: str) -> BudgetExceeded:
        """The same refusal, for the draws of another node refused after it."""
        return BudgetExceeded(
            node, self.budget, spent_tokens=self.spent_tokens, spent_cost=self.spent_cost,
            needed_tokens=self.needed_tokens, needed_cost=self.needed_cost, backend=self.backend, draws=self.draws,
        )


class JobsRunning(NodeError):
    """Batch mode without waiting (``Jobs(wait=False)``, ``Program.submit``): the jobs were created and run on.

    Nothing is lost: the cache's ledger holds the jobs, and the same call
    again (waiting, or not) finds them instead of paying twice.

    Attributes
    ----------
    provider
        ``"openai"`` or ``"anthropic"``.
    jobs
        The provider's job ids still running.
    requests
        The requests they hold.
    """

    def __init__(self, provider: str, jobs: list[str], requests: int) -> None:
        self.provider, self.jobs, self.requests = provider, list(jobs), requests
        self.message = (f"{len(self.jobs)} {provider} batch job(s) running ({requests} request(s)): "
                        f"{', '.join(self.jobs)}; call again to collect them")
        RuntimeError.__init__(self, self.message)
        self.node, self.op, self.cause = "", "Generate", self


class MaxIterError(RuntimeError):
    """An element of a ``while_loop(..., on_max_iter="fail")`` ran ``max_iter`` iterations and ``cond`` still held.

    Under ``errors="return"`` each such element holds a ``Failure`` of this
    type; under ``errors="raise"`` the evaluation raises a ``NodeError`` naming
    the loop, caused by it.
    """


@dataclass(frozen=True)
class Failure:
    """The value of an element whose computation failed.

    Attributes
    ----------
    node
        Label of the node that failed.
    op
        The op of that node, as text.
    error_type, message
        The exception's type name and message.
    upstream
        For values that were not computed because an input failed: the
        Failure that caused it (``None`` for the original failure).

    A Failure is falsy, and ``str(failure)`` says where and why.

    Examples
    --------
    >>> import outlines
    >>> check = outlines.fn(lambda text: int(text))
    >>> text = outlines.string("text")
    >>> out = check(text).eval({text: ["1", "x"]}, errors="return")
    >>> out[0], bool(out[1]), out[1].error_type
    (1, False, 'ValueError')
    """

    node: str
    op: str
    error_type: str
    message: str
    upstream: Failure | None = None

    @classmethod
    def from_exception(cls, node: str, op: str, exc: BaseException) -> Failure:
        """The Failure of ``node`` (running ``op``) that raised ``exc``."""
        return cls(node, op, type(exc).__name__, str(exc))

    def skipped(self, node: str, op: str) -> Failure:
        """The Failure of a node that could not run because of this one."""
        root = self.root
        return Failure(node, op, "UpstreamFailure", f"input failed at {root.node}: {root.error_type}: {root.message}", root)

    @property
    def root(self) -> Failure:
        return self.upstream if self.upstream is not None else self

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"Failure at {self.node} ({self.op}): {self.error_type}: {self.message}"
