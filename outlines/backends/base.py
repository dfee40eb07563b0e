"""The one protocol every backend implements, and the report that crosses it.

A backend owns only the wire (or the model) and its retries. The scheduler owns
batching, deduplication, caching and concurrency. A backend is identified by a
hashable, JSON-able ``identity``: equal identities batch together and share
cache entries. Secrets never enter the identity. ``generate(draws, report)``
receives the draws (``outlines.draws``: they sit below every layer that uses
them) and a ``BatchReport``, the explicit channel back to the scheduler:
finished and failed draws, token usage (with the prompt tokens served from a
provider's prompt cache or a local model's shared prefix), wire requests and
model loads.
"""
from __future__ import annotations

import abc
import asyncio
import contextlib
from typing import Any, AsyncIterator, Callable, Sequence

from outlines.backends.usage import Price, estimate_tokens
from outlines.draws import Draw, GenerationParams
from outlines.draws.params import EXTRA_PARAMS

__all__ = ["Backend", "BackendError", "BatchReport", "check_limit"]


class BackendError(RuntimeError):
    """A backend call failed; carries what is useful and nothing secret."""

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str | None = None,
        endpoint: str | None = None,
        model: str | None = None,
        retryable: bool = False,
    ) -> None:
        parts = [message]
        if status is not None:
            parts.append(f"status={status}")
        if endpoint:
            parts.append(f"endpoint={endpoint}")
        if model:
            parts.append(f"model={model}")
        if body:
            parts.append(f"body={body[:200]!r}")
        super().__init__(" ".join(parts))
        self.status = status
        self.body = body[:200] if body else body
        self.endpoint = endpoint
        self.model = model
        self.retryable = retryable


class Backend(abc.ABC):
    """A place that turns prompts into text.

    Subclasses set ``kind`` and implement ``identity`` and ``generate``.
    Pictures name a backend by its ``label`` and pass their text through its
    ``redact`` (the ``outlines.common.labels.Shown`` protocol); they never look
    inside it.
    ``max_batch`` bounds the draws per ``generate`` call (``None``:
    unlimited), which holds all the samples of each of its prompts unless
    one prompt has more than ``max_batch`` (``outlines.draws.pack``);
    ``max_concurrency`` bounds ``generate`` calls in flight.
    ``sends_requests`` is true for backends whose one call sends several wire
    requests, each inside ``report.request_permit()``: the evaluation's
    ``max_concurrency`` then bounds those requests rather than whole calls.
    """

    kind: str = "backend"
    max_batch: int | None = None
    max_concurrency: int | None = None
    max_retries: int = 3
    #: True when generate blocks a CPU/GPU (local models); a hint for executors.
    local_compute: bool = False
    sends_requests: bool = False
    #: False when the identity cannot cover everything that changes the output
    #: (it holds an object id): draws are then never read from or written to disk.
    cacheable: bool = True
    #: Money per million tokens (``backends.usage.Price``), set by the user; not
    #: part of the identity (it changes the bill, not the text).
    price: Price | None = None
    #: True when ``count_tokens`` uses the model's own tokenizer, not the estimate.
    tokens_exact: bool = False
    #: The shortest head, in characters, that prompts must share for this backend to
    #: pay for it once (a provider's prompt cache, a local model's shared prefill):
    #: the batcher keeps such prompts in one batch (``outlines.draws.prefix_groups``).
    #: ``None``: sharing a head gains nothing here.
    prefix_min_head: int | None = None
    #: The generation parameters this backend takes by name besides the common ones
    #: (``outlines.draws.params.COMMON_PARAMS``); a model refuses any other name when it or a call is built.
    generation_extras: frozenset[str] = frozenset(EXTRA_PARAMS)
    #: True when the backend sends the fields of an ``extra_body`` dict to its server
    #: as they are (unchecked); a backend without a server refuses ``extra_body``.
    takes_extra_body: bool = False

    @property
    @abc.abstractmethod
    def identity(self) -> tuple[Any, ...]:
        """Hashable, JSON-able identity (kind, model, base URL...); no secrets."""

    @abc.abstractmethod
    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        """Return one completion per draw, in order.

        ``report`` takes what the scheduler wants to know before the call
        returns (finished or failed draws, usage, wire requests); a backend
        may ignore it. A draw reported with ``report.failure`` may hold
        anything in the returned list; raising after reporting every draw is
        fine too (the reports win).
        """

    async def aclose(self) -> None:
        """Release resources bound to the running event loop (sessions)."""

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens one request for ``prompt`` costs (here: ``usage.estimate_tokens``)."""
        return estimate_tokens(str(prompt))

    def render_prompt(self, prompt: str) -> Any:
        """What this backend sends (or its model reads) for ``prompt``; here the text itself."""
        return str(prompt)

    def prompt_tokens(self, prompt: str) -> list[int]:
        """The token ids the model reads for ``prompt``, where the backend tokenizes itself.

        Raises
        ------
        TypeError
            Here: a remote server (or a Python function) does its own tokenizing.
        """
        raise TypeError(f"{self.kind} models do not expose token ids: the server (or function) reads text; "
                        "render(prompt) shows what is sent")

    def usage_bound(self, draws: Sequence[Draw]) -> tuple[int, int | None]:
        """``(prompt tokens, most completion tokens)`` of one ``generate(draws)`` call.

        Prompt tokens count each (params, prompt) once, as a server bills one
        request asking ``n`` samples; completions are bounded by
        ``max_tokens`` per sample (greedy samples collapse to one), ``None``
        when a draw sets no ``max_tokens``.
        """
        samples: dict[tuple[GenerationParams, str], int] = {}
        for draw in draws:
            samples[draw.params, draw.prompt] = samples.get((draw.params, draw.prompt), 0) + 1
        prompt_tokens = 0
        completion: int | None = 0
        for (params, prompt), count in samples.items():
            prompt_tokens += self.count_tokens(prompt)
            if params.max_tokens is None:
                completion = None
            elif completion is not None:
                completion += params.max_tokens * (1 if params.deterministic else count)
        return prompt_tokens, completion

    def check_params(self, params: GenerationParams) -> None:
        """Raise ``ValueError`` for parameters outside what the provider documents (here: none).

        Called when a model is built and when a call is built, so a setting
        the provider would refuse fails at once, naming its range, instead of
        on every request.
        """

    def requests_for(self, draws: Sequence[Draw]) -> int:
        """Wire requests one ``generate(draws)`` call sends (here: one)."""
        return 1

    @property
    def cache_identities(self) -> tuple[tuple[Any, ...], ...]:
        """The identities whose cache entries answer this backend's draws, tried in order."""
        return (self.identity,)

    @property
    def model_name(self) -> str:
        return str(self.identity[1]) if len(self.identity) > 1 else self.kind

    @property
    def label(self) -> str:
        """``kind: model``: how pictures and timelines name this backend (``outlines.common.labels.Shown``).

        No URL and no secret; a subclass whose ``model_name`` could hold one
        overrides this.
        """
        return f"{self.kind}: {self.model_name}"

    def redact(self, text: str) -> str:
        """``text`` with this backend's own secrets starred out (here: it holds none).

        Pictures and error messages pass their text through it
        (``outlines.common.labels.redactor``); backends that hold a credential
        override it.
        """
        return text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backend) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    def __repr__(self) -> str:
        fields = ", ".join(repr(part) for part in self.identity[1:])
        return f"{type(self).__name__}({fields})"


class BatchReport:
    """What a backend tells the scheduler about one batch while it runs.

    The scheduler builds one per ``generate`` call; a bare ``BatchReport()``
    (for calling a backend directly) records results, failures, usage and
    requests in its attributes and bounds nothing.

    Parameters
    ----------
    on_result, on_failure
        Called with ``(index, text)`` / ``(index, error)`` as each draw ends.
    on_request
        Called with ``(start, end, error, model)`` for each wire request;
        ``model`` names the model that was asked when it is not the batch's
        own backend (a fallback chain), else ``None``.
    on_model_loaded
        Called with ``(start, end)`` when a local model was loaded.
    request_limit
        Shared bound on wire requests in flight (the evaluation's
        ``max_concurrency``), taken by ``request_permit``; ``None``: unbounded.
    """

    def __init__(
        self,
        *,
        on_result: Callable[[int, str], None] | None = None,
        on_failure: Callable[[int, BaseException], None] | None = None,
        on_request: Callable[[float, float, BaseException | None, str | None], None] | None = None,
        on_model_loaded: Callable[[float, float], None] | None = None,
        request_limit: asyncio.Semaphore | None = None,
    ) -> None:
        self.results: dict[int, str] = {}
        self.failures: dict[int, BaseException] = {}
        #: prompt, completion, and of the prompt tokens: cached (read from the provider's
        #: prompt cache, or a local model's shared prefix), written to the provider's cache.
        self.tokens = [0, 0, 0, 0]
        self.requests = 0
        #: draw index -> the backend that answered it, where that is not the batch's
        #: own (a fallback chain): the draw is cached under that backend's key.
        self.answered_by: dict[int, Backend] = {}
        self.request_limit = request_limit
        self._on_result = on_result
        self._on_failure = on_failure
        self._on_request = on_request
        self._on_model_loaded = on_model_loaded

    def result(self, index: int, text: str) -> None:
        """Draw ``index`` of the batch finished: the scheduler caches it at once."""
        if isinstance(text, str) and index not in self.results and index not in self.failures:
            self.results[index] = text
            if self._on_result is not None:
                self._on_result(index, text)

    def failure(self, index: int, error: BaseException) -> None:
        """Draw ``index`` failed on its own; the other draws of the batch go on."""
        if index not in self.results and index not in self.failures:
            self.failures[index] = error
            if self._on_failure is not None:
                self._on_failure(index, error)

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
              cache_write_tokens: int = 0) -> None:
        """Tokens the batch used (added up; shown in traces).

        ``cached_tokens`` and ``cache_write_tokens`` are the parts of
        ``prompt_tokens`` read from and written to a prompt cache (OpenAI's
        ``prompt_tokens_details.cached_tokens``, Anthropic's
        ``cache_read_input_tokens`` and ``cache_creation_input_tokens``; for a
        local model, the prompt tokens whose keys and values were shared
        rather than computed). The order is ``usage.WireUsage``'s, so
        ``report.usage(*other.tokens)`` forwards a sub-report whole.
        """
        self.tokens[0] += int(prompt_tokens)
        self.tokens[1] += int(completion_tokens)
        self.tokens[2] += int(cached_tokens)
        self.tokens[3] += int(cache_write_tokens)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens read from a prompt cache (or a shared prefix) so far."""
        return self.tokens[2]

    @property
    def cache_write_tokens(self) -> int:
        """Prompt tokens written to a provider's prompt cache so far."""
        return self.tokens[3]

    def request(self, start: float, end: float, error: BaseException | None = None, model: str | None = None) -> None:
        """One wire request (each retry counts) ran from ``start`` to ``end`` (``time.perf_counter()``).

        ``model``: the model asked, when it is not the batch's backend (a fallback).
        """
        self.requests += 1
        if self._on_request is not None:
            self._on_request(start, end, error, model)

    def model_loaded(self, start: float, end: float) -> None:
        """A local model was loaded from ``start`` to ``end`` (apart from the first batch)."""
        if self._on_model_loaded is not None:
            self._on_model_loaded(start, end)

    @contextlib.asynccontextmanager
    async def request_permit(self) -> AsyncIterator[None]:
        """Hold one of the evaluation's request permits while one wire request is in flight."""
        if self.request_limit is None:
            yield
            return
        async with self.request_limit:
            yield


def check_limit(name: str, value: Any, *, where: str) -> int | None:
    """``value`` as a positive int (``None`` stays ``None``); a clear ``ValueError`` otherwise.

    Used by every constructor for ``max_batch`` and ``max_concurrency``: a
    zero, negative or fractional limit would stall the scheduler instead.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name} must be a positive integer or None, got {value!r}")
    return int(value)
