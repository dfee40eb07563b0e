"""The one protocol every backend implements, and the values that cross it.

A backend owns only the wire (or the model) and its retries. The scheduler owns
batching, deduplication, caching and concurrency. A backend is identified by a
hashable, JSON-able ``identity``: equal identities batch together and share
cache entries. Secrets never enter the identity.
"""
from __future__ import annotations

import abc
import contextvars
import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

if TYPE_CHECKING:
    from outlines.backends.constraints import Constraint

__all__ = [
    "Backend",
    "BackendError",
    "GenerationParams",
    "Request",
    "report_requests",
    "report_result",
    "report_usage",
]


def _freeze(value: Any) -> Any:
    """Turn a JSON-like value into a hashable, canonically ordered one."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters of one model call; hashable, part of the cache key.

    ``None`` means "the backend's default". ``extra`` holds further
    backend-specific parameters (``logit_bias`` ...) as sorted frozen items.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: tuple[tuple[str, Any], ...] = ()
    #: Structured output (issue 13): choices, regex or JSON schema; see backends/constraints.py.
    constraint: Constraint | None = None

    @classmethod
    def create(cls, **kwargs: Any) -> GenerationParams:
        """Build params from user keywords, validating and normalizing them."""
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        extra = {k: v for k, v in kwargs.items() if k not in known and v is not None}
        base = {k: v for k, v in kwargs.items() if k in known}
        return cls(extra=_freeze(extra) if extra else (), **base)._validated()

    def merged(self, **overrides: Any) -> GenerationParams:
        """Return a copy with every non-``None`` override applied."""
        known = {f for f in self.__dataclass_fields__ if f != "extra"}
        changes = {k: v for k, v in overrides.items() if k in known and v is not None}
        extra = dict(self.extra)
        extra.update({k: _freeze(v) for k, v in overrides.items() if k not in known and v is not None})
        return replace(self, extra=tuple(sorted(extra.items())), **changes)._validated()

    def _validated(self) -> GenerationParams:
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        stop = tuple(stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature is not None and not (0 <= float(self.temperature) <= 10):
            raise ValueError(f"temperature must be between 0 and 10, got {self.temperature!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.constraint is not None and stop:
            raise ValueError(f"stop={list(stop)!r} cannot be combined with {self.constraint.kind}=: the "
                             "constraint decides where the text ends")
        if stop != self.stop:
            object.__setattr__(self, "stop", stop)
        return self

    @property
    def deterministic(self) -> bool:
        """Greedy decoding: every draw of a prompt gives the same text."""
        return self.temperature is not None and float(self.temperature) == 0.0

    def to_dict(self) -> dict[str, Any]:
        """The parameters that are set, as a JSON-able dict (for keys and wires)."""
        out: dict[str, Any] = {}
        for name in ("max_tokens", "temperature", "top_p", "seed"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.stop:
            out["stop"] = list(self.stop)
        for key, value in self.extra:
            out[key] = _thaw(value)
        if self.constraint is not None:
            out["constraint"] = self.constraint.to_dict()
        return out

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {k: _thaw(v) for k, v in value}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class Request:
    """One draw: a prompt, its parameters and its draw number.

    Draws of a deterministic request all carry ``draw=0`` (they collapse).
    """

    prompt: str
    params: GenerationParams = field(default_factory=GenerationParams)
    draw: int = 0


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
    ``max_batch`` bounds the requests per ``generate`` call (``None``:
    unlimited); ``max_concurrency`` bounds ``generate`` calls in flight.
    """

    kind: str = "backend"
    max_batch: int | None = None
    max_concurrency: int | None = None
    max_retries: int = 3
    #: True when generate blocks a CPU/GPU (local models); a hint for executors.
    local_compute: bool = False

    @property
    @abc.abstractmethod
    def identity(self) -> tuple[Any, ...]:
        """Hashable, JSON-able identity (kind, model, base URL...); no secrets."""

    @abc.abstractmethod
    async def generate(self, requests: Sequence[Request]) -> list[str]:
        """Return one completion per request, in order."""

    async def aclose(self) -> None:
        """Release resources bound to the running event loop (sessions)."""

    @property
    def model_name(self) -> str:
        return str(self.identity[1]) if len(self.identity) > 1 else self.kind

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Backend) and self.identity == other.identity

    def __hash__(self) -> int:
        return hash(self.identity)

    def __repr__(self) -> str:
        fields = ", ".join(repr(part) for part in self.identity[1:])
        return f"{type(self).__name__}({fields})"


UsageCallback = Callable[[int, int], None]
_usage_callback: contextvars.ContextVar[UsageCallback | None] = contextvars.ContextVar(
    "outlines_usage_callback", default=None
)


ResultCallback = Callable[[int, str], None]
_result_callback: contextvars.ContextVar[ResultCallback | None] = contextvars.ContextVar(
    "outlines_result_callback", default=None
)


def report_result(index: int, text: str) -> None:
    """Tell the running batch that its request ``index`` is done, before the rest.

    The scheduler stores it in the cache at once, and keeps it when another
    request of the batch fails (or the run is interrupted).
    """
    callback = _result_callback.get()
    if callback is not None:
        callback(index, text)


def report_usage(prompt_tokens: int, completion_tokens: int) -> None:
    """Tell the running batch how many tokens it used (shown in traces)."""
    callback = _usage_callback.get()
    if callback is not None:
        callback(int(prompt_tokens), int(completion_tokens))


_requests_callback: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "outlines_requests_callback", default=None
)


def report_requests(count: int = 1) -> None:
    """Tell the running batch it sent ``count`` wire requests (retries included).

    Backends whose one ``generate`` call may be many requests (chat: one per
    prompt) call this, so traces count requests, not only backend calls.
    """
    callback = _requests_callback.get()
    if callback is not None:
        callback(int(count))
