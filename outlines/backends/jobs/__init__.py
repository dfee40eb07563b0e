"""Provider batch jobs: many requests sent as one job, answered within a day at half price.

``base`` holds the ``JobClient`` protocol and the values crossing it (lines,
statuses, line results), ``split`` (jobs at the provider's limits) and
``wait`` (polling with a capped backoff on an injectable clock); ``openai``
and ``anthropic`` implement it for OpenAI's Batch API (and servers speaking
it) and Anthropic's Message Batches, on what ``wire`` gives both (paging,
cancelling, creating a job once). ``job_client`` picks the client of a
backend. The ledger that makes jobs survive a crash is
``outlines.cache.ledger``; sending a round's draws as jobs is the runtime's.
"""
from __future__ import annotations

from typing import Any

from outlines.backends.base import Backend
from outlines.backends.jobs.base import (
    FINISHED,
    Backoff,
    Clock,
    JobClient,
    JobInDoubt,
    JobLimits,
    JobLine,
    JobStatus,
    LineResult,
    SystemClock,
    split,
    wait,
)

__all__ = [
    "FINISHED",
    "Backoff",
    "Clock",
    "JobClient",
    "JobInDoubt",
    "JobLimits",
    "JobLine",
    "JobStatus",
    "LineResult",
    "SystemClock",
    "job_client",
    "split",
    "wait",
]


def job_client(backend: Backend, **limits: Any) -> JobClient:
    """The batch-job client of ``backend``.

    Parameters
    ----------
    backend
        An OpenAI chat or completions backend, or an Anthropic backend.
    **limits
        ``max_requests`` and ``max_bytes`` per job (default: the provider's),
        and for OpenAI ``completion_window``.

    Returns
    -------
    JobClient

    Raises
    ------
    TypeError
        For a backend whose provider has no batch jobs, naming it.

    Examples
    --------
    >>> from outlines.backends.anthropic import AnthropicBackend
    >>> job_client(AnthropicBackend("claude-haiku-4-5", api_key="k")).provider
    'anthropic'
    """
    from outlines.backends.anthropic import AnthropicBackend
    from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend

    if isinstance(backend, (OpenAIChatBackend, OpenAICompletionBackend)):
        from outlines.backends.jobs.openai import OpenAIJobs

        return OpenAIJobs(backend, **limits)
    if isinstance(backend, AnthropicBackend):
        from outlines.backends.jobs.anthropic import AnthropicJobs

        return AnthropicJobs(backend, **limits)
    raise TypeError(f"{backend!r} has no provider batch jobs (OpenAI and Anthropic backends do)")
