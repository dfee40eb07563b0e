"""Fallback chains: draws that fail on one model go to the next.

``FallbackBackend`` sends a batch to its first backend; each draw that fails
there with an error the chain falls back ``on`` (by default a 429, a 5xx, or
a timeout or dropped connection, each after that backend's own retries) is
sent, with the others that failed, to the next backend, and so on; other
errors (a 400, a malformed reply) fail the draw at once. Each draw records the
backend that answered it: the scheduler caches it under THAT backend's key
(``BatchReport.answered_by``), so cache keys stay per model, and a trace's
``RequestRecord.model`` names the model each wire request asked. Looking a draw
up tries the members' keys in order (``cache_identities``).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from outlines.backends.base import Backend, BackendError, BatchReport
from outlines.draws import Draw

__all__ = ["DEFAULT_ON", "FallbackBackend", "falls_back"]

#: What fails over by default: rate limits, server errors, timeouts (and dropped connections).
DEFAULT_ON: tuple[int | str, ...] = (429, "5xx", "timeout")


def _check_on(on: Iterable[int | str]) -> tuple[int | str, ...]:
    items = tuple(on)
    for item in items:
        if not (isinstance(item, int) and not isinstance(item, bool) and 100 <= item <= 599) and item not in (
            "5xx", "4xx", "timeout"
        ):
            raise ValueError(f"fallback on= takes HTTP statuses (429), '5xx', '4xx' or 'timeout'; got {item!r}")
    if not items:
        raise ValueError("fallback on= must name at least one status or 'timeout'")
    return items


def falls_back(error: BaseException, on: Sequence[int | str]) -> bool:
    """Whether ``error`` is one the chain hands to the next model.

    Examples
    --------
    >>> falls_back(BackendError("gave up", status=429, retryable=True), DEFAULT_ON)
    True
    >>> falls_back(BackendError("bad request", status=400), DEFAULT_ON)
    False
    """
    status = getattr(error, "status", None) if isinstance(error, BackendError) else None
    if isinstance(status, int):
        return status in on or ("5xx" in on and 500 <= status <= 599) or ("4xx" in on and 400 <= status <= 499) or (
            "timeout" in on and status == 408
        )
    # No status: the transport failed (timeout, refused or dropped connection) after its retries.
    transport = (isinstance(error, BackendError) and error.retryable) or isinstance(error, (TimeoutError, ConnectionError))
    return "timeout" in on and transport


class FallbackBackend(Backend):
    """Backends tried in order for each draw; see the module docstring.

    Parameters
    ----------
    backends
        The primary backend, then the fallbacks (at least two in all).
    on
        HTTP statuses (``429``), ``"5xx"``, ``"4xx"`` and ``"timeout"`` (timeouts
        and dropped connections): the failures that go to the next backend.

    Examples
    --------
    >>> from outlines.backends.openai import OpenAIChatBackend
    >>> a = OpenAIChatBackend("a", base_url="http://127.0.0.1:1/v1", api_key="k")
    >>> b = OpenAIChatBackend("b", base_url="http://127.0.0.1:2/v1", api_key="k")
    >>> FallbackBackend([a, b])
    FallbackBackend(OpenAIChatBackend('a', 'http://127.0.0.1:1/v1', None), OpenAIChatBackend('b', 'http://127.0.0.1:2/v1', None))
    """

    kind = "fallback"

    def __init__(self, backends: Sequence[Backend], *, on: Iterable[int | str] = DEFAULT_ON) -> None:
        members = tuple(backends)
        if len(members) < 2 or not all(isinstance(b, Backend) for b in members):
            raise ValueError(f"a fallback chain needs at least two backends, got {members!r}")
        self.backends = members
        self.on = _check_on(on)
        primary = members[0]
        self.max_batch = primary.max_batch
        self.max_concurrency = primary.max_concurrency
        self.max_retries = primary.max_retries
        self.sends_requests = any(b.sends_requests for b in members)
        self.local_compute = any(b.local_compute for b in members)
        self.cacheable = all(b.cacheable for b in members)
        self.price = primary.price
        self.tokens_exact = primary.tokens_exact
        # Calls carry the primary's parameters to whichever member answers.
        self.generation_extras = primary.generation_extras
        self.takes_extra_body = primary.takes_extra_body

    @property
    def identity(self) -> tuple[Any, ...]:
        return (self.kind, tuple(b.identity for b in self.backends), tuple(str(x) for x in self.on))

    @property
    def cache_identities(self) -> tuple[tuple[Any, ...], ...]:
        return tuple(identity for b in self.backends for identity in b.cache_identities)

    @property
    def model_name(self) -> str:
        return self.backends[0].model_name

    def __eq__(self, other: object) -> bool:
        # Members compare with their own rules (credentials included), not only by identity.
        return isinstance(other, FallbackBackend) and (self.backends, self.on) == (other.backends, other.on)

    def __hash__(self) -> int:
        return hash((self.backends, self.on))

    def __repr__(self) -> str:
        return f"FallbackBackend({', '.join(repr(b) for b in self.backends)})"

    def redact(self, text: str) -> str:
        """``text`` with every member's secrets starred out."""
        for backend in self.backends:
            text = backend.redact(text)
        return text

    def count_tokens(self, prompt: str) -> int:
        return self.backends[0].count_tokens(prompt)

    def render_prompt(self, prompt: str) -> Any:
        """What the primary sends for ``prompt`` (a model that takes over sends its own form)."""
        return self.backends[0].render_prompt(prompt)

    def prompt_tokens(self, prompt: str) -> list[int]:
        return self.backends[0].prompt_tokens(prompt)

    def usage_bound(self, draws: Sequence[Draw]) -> tuple[int, int | None]:
        """The primary's bound (a draw that falls back is sent again: the bound then undercounts)."""
        return self.backends[0].usage_bound(draws)

    def requests_for(self, draws: Sequence[Draw]) -> int:
        return self.backends[0].requests_for(draws)

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()

    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        out = [""] * len(draws)
        pending = list(range(len(draws)))  # positions in ``draws`` not answered yet
        for position, backend in enumerate(self.backends):
            last = position == len(self.backends) - 1
            pending = await self._try(backend, draws, pending, out, report, last)
            if not pending:
                break
        return out

    async def _try(
        self, backend: Backend, draws: Sequence[Draw], positions: list[int], out: list[str], report: BatchReport,
        last: bool,
    ) -> list[int]:
        """Send ``positions`` to ``backend``; the positions that fail over to the next one."""
        name = repr(backend)
        again: list[int] = []

        def answered(index: int, text: str) -> None:
            where = positions[index]
            out[where] = text
            report.answered_by[where] = backend  # before result(): the scheduler caches it under this key
            report.result(where, text)

        def failed(index: int, error: BaseException) -> None:
            if not last and falls_back(error, self.on):
                again.append(positions[index])
            else:
                report.failure(positions[index], error)

        sub = BatchReport(
            on_result=answered,
            on_failure=failed,
            on_request=lambda start, end, error, model: report.request(start, end, error, model=model or name),
            on_model_loaded=report.model_loaded,
            request_limit=report.request_limit,
        )
        texts: list[str] | None = None
        error: Exception | None = None
        try:
            texts = await backend.generate([draws[p] for p in positions], sub)
        except Exception as exc:  # noqa: BLE001 - the draws it did not report fail (or fall back) with it
            error = exc
        report.usage(*sub.tokens)
        for index in range(len(positions)):
            if index in sub.results or index in sub.failures:
                continue
            if error is not None:
                sub.failure(index, error)
            elif texts is not None and index < len(texts) and isinstance(texts[index], str):
                sub.result(index, texts[index])
            else:
                sub.failure(index, BackendError(f"{name} returned no completion for draw {index}"))
        return sorted(again)
