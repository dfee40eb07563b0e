"""The one protocol every backend implements, and the values that cross it.

A backend owns only the wire (or the model) and its retries. The scheduler owns
batching, deduplication, caching and concurrency. A backend is identified by a
hashable, JSON-able ``identity``: equal identities batch together and share
cache entries. Secrets never enter the identity. ``generate(draws, report)``
receives a ``BatchReport``, the explicit channel back to the scheduler:
finished and failed draws, token usage (with the prompt tokens served from a
provider's prompt cache or a local model's shared prefix), wire requests and
model loads.
"""
from __future__ import annotations

import abc
import asyncio
import contextlib
import copy
import json
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Iterator, Mapping, NamedTuple, Sequence, overload

from outlines.backends.usage import Price, estimate_tokens
from outlines.keys import canonical

if TYPE_CHECKING:
    from outlines.backends.constraints import Constraint

__all__ = [
    "Backend",
    "BackendError",
    "BatchReport",
    "Draw",
    "DrawBatch",
    "GenerationParams",
    "Slot",
    "check_limit",
]


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters of one model call; hashable, part of the cache key.

    ``None`` means "the backend's default". ``extra`` holds further
    backend-specific parameters (``logit_bias`` ...) as sorted items, values as
    given; they compare and hash by their canonical JSON text
    (``outlines.keys.canonical``), so ``{"a": 1, "b": 2}`` equals
    ``{"b": 2, "a": 1}`` and a list may be a value.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    _extra_text: bytes = field(init=False, repr=False, default=b"")
    #: Structured output (issue 13): choices, regex or JSON schema in its canonical
    #: form (its text made by ``outlines.keys.canonical``); see backends/constraints.py.
    constraint: Constraint | None = None

    def __post_init__(self) -> None:
        if self.extra:
            try:
                text = canonical(dict(self.extra))
            except TypeError as exc:
                name = next(k for k, v in self.extra if not _keyable(v))
                raise ValueError(f"generation parameter {name!r} must be JSON data (it is part of the cache key): {exc}") from None
            object.__setattr__(self, "_extra_text", text)

    def __hash__(self) -> int:
        # Computed once: params are dict keys in planning and batching (draw
        # numbering, queues), and the generated dataclass hash runs in Python.
        try:
            return self._hash  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            value = hash((self.max_tokens, self.temperature, self.top_p, self.stop, self.seed,
                          self._extra_text, self.constraint))
            object.__setattr__(self, "_hash", value)
            return value

    def __getstate__(self) -> dict[str, Any]:
        # String hashes differ between processes: never ship the cached one.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @classmethod
    def create(cls, **kwargs: Any) -> GenerationParams:
        """Build params from user keywords, validating and normalizing them."""
        extra = {k: v for k, v in kwargs.items() if k not in _NAMED and v is not None}
        base = {k: v for k, v in kwargs.items() if k in _NAMED}
        return cls(extra=_items(extra), **base)._validated()

    def merged(self, **overrides: Any) -> GenerationParams:
        """Return a copy with every non-``None`` override applied (``self`` when there is none)."""
        set_ = {k: v for k, v in overrides.items() if v is not None}
        if not set_:  # the common call: a model's defaults as they are, no copy, no validation
            return self
        changes = {k: v for k, v in set_.items() if k in _NAMED}
        others = {k: v for k, v in set_.items() if k not in _NAMED}
        if others:
            extra = dict(self.extra)
            extra.update(others)
            changes["extra"] = _items(extra)
        return replace(self, **changes)._validated()

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
            out[key] = copy.deepcopy(value)  # the wire may not change our value
        if self.constraint is not None:
            out["constraint"] = self.constraint.to_dict()
        return out

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _keyable(value: Any) -> bool:
    try:
        canonical(value)
    except TypeError:
        return False
    return True


_NAMED = frozenset({"max_tokens", "temperature", "top_p", "stop", "seed", "constraint"})
#: The generation parameters every backend takes by name.
COMMON_PARAMS = ("max_tokens", "temperature", "top_p", "stop", "seed")
#: Further parameters some backends take by name (each declares its own in ``Backend.generation_extras``).
EXTRA_PARAMS = ("logit_bias", "presence_penalty", "frequency_penalty", "top_k", "repetition_penalty",
                "no_repeat_ngram_size")


def _items(extra: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Sorted ``(name, value)`` items, each value a private copy (callers may mutate theirs)."""
    return tuple(sorted((str(k), copy.deepcopy(v)) for k, v in extra.items()))


@dataclass(frozen=True)
class Draw:
    """One sample of one prompt: the prompt, its parameters and its draw number.

    A draw is identified by its *slot* (its params and draw number, ``Slot``)
    and its prompt: tables that find draws (the scheduler's queues, the
    cache's memory) are kept per slot and keyed by prompt, so each lookup
    hashes a string, whose hash Python caches. A batch holds its draws as
    columns (``DrawBatch``). Draws of deterministic parameters all carry
    ``draw=0`` (they collapse).
    """

    prompt: str
    params: GenerationParams = field(default_factory=GenerationParams)
    draw: int = 0


class Slot(NamedTuple):
    """The draws of one params and one draw number: told apart by their prompt alone (see ``Draw``)."""

    params: GenerationParams
    number: int


class DrawBatch(Sequence[Draw]):
    """The draws of one batch held as columns: prompts, params and draw numbers.

    The scheduler hands a backend's ``generate`` one of these: a batch of
    100,000 prompts costs three lists, not 100,000 ``Draw`` objects. It is a
    ``Sequence[Draw]`` (indexing and iterating make the ``Draw`` objects on
    demand); a backend that needs only the text reads ``prompts``.

    Examples
    --------
    >>> batch = DrawBatch(["a", "b"], [GenerationParams()] * 2, [0, 3])
    >>> batch.prompts, batch[1].draw, len(batch)
    (['a', 'b'], 3, 2)
    """

    __slots__ = ("prompts", "params", "numbers")

    def __init__(self, prompts: list[Any], params: list[GenerationParams], numbers: list[int]) -> None:
        self.prompts = prompts
        self.params = params
        self.numbers = numbers

    @classmethod
    def of(cls, draws: Iterable[Draw]) -> DrawBatch:
        """The batch of ``draws`` (already a ``DrawBatch``: itself)."""
        if isinstance(draws, DrawBatch):
            return draws
        draws = list(draws)
        return cls([d.prompt for d in draws], [d.params for d in draws], [d.draw for d in draws])

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def slot(self) -> Slot | None:
        """The slot of every draw of the batch, when they share one (else, or when empty, ``None``).

        Two C-speed ``list.count`` passes (an identity test per draw): a
        batch of 100,000 draws costs no Python step each.
        """
        params, numbers = self.params, self.numbers
        if not params:
            return None
        first, number = params[0], numbers[0]
        if params.count(first) == len(params) and numbers.count(number) == len(numbers):
            return Slot(first, int(number))
        return None

    def by_slot(self) -> list[tuple[Slot, list[int] | None]]:
        """The batch's draws per slot: ``(slot, positions)``, positions ``None`` when all are in that slot.

        The usual batch has one slot (``slot``); several follow the order of their first draw.
        """
        if not self.params:
            return []
        one = self.slot
        if one is not None:
            return [(one, None)]
        groups: dict[Slot, list[int]] = {}
        for position, slot in enumerate(map(Slot, self.params, self.numbers)):
            groups.setdefault(slot, []).append(position)
        return [(Slot(slot.params, int(slot.number)), positions) for slot, positions in groups.items()]

    def take(self, positions: Sequence[int]) -> DrawBatch:
        """The draws at ``positions``, in that order."""
        prompts, params, numbers = self.prompts, self.params, self.numbers
        return DrawBatch([prompts[i] for i in positions], [params[i] for i in positions],
                         [numbers[i] for i in positions])

    @overload
    def __getitem__(self, index: int) -> Draw: ...

    @overload
    def __getitem__(self, index: slice) -> DrawBatch: ...

    def __getitem__(self, index: int | slice) -> Draw | DrawBatch:
        if isinstance(index, slice):
            return DrawBatch(self.prompts[index], self.params[index], self.numbers[index])
        return Draw(self.prompts[index], self.params[index], self.numbers[index])

    def __iter__(self) -> Iterator[Draw]:
        return map(Draw, self.prompts, self.params, self.numbers)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DrawBatch):
            return (self.prompts, self.numbers, self.params) == (other.prompts, other.numbers, other.params)
        return isinstance(other, (list, tuple)) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"DrawBatch({len(self)} draws)"


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
    ``redact`` (the ``outlines.labels.Shown`` protocol); they never look
    inside it.
    ``max_batch`` bounds the draws per ``generate`` call (``None``:
    unlimited), which holds all the samples of each of its prompts unless
    one prompt has more than ``max_batch`` (``outlines.backends.packing.pack``);
    ``max_concurrency`` bounds ``generate`` calls in flight.
    ``sends_requests`` is true for backends whose one call sends several wire
    requests, each inside ``report.request_slot()``: the evaluation's
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
    #: the batcher keeps such prompts in one batch (``backends.prefix.prefix_groups``).
    #: ``None``: sharing a head gains nothing here.
    prefix_min_head: int | None = None
    #: The generation parameters this backend takes by name besides the common ones
    #: (``COMMON_PARAMS``); a model refuses any other name when it or a call is built.
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
        """``kind: model``: how pictures and timelines name this backend (``outlines.labels.Shown``).

        No URL and no secret; a subclass whose ``model_name`` could hold one
        overrides this.
        """
        return f"{self.kind}: {self.model_name}"

    def redact(self, text: str) -> str:
        """``text`` with this backend's own secrets starred out (here: it holds none).

        Pictures and error messages pass their text through it
        (``outlines.labels.redactor``); backends that hold a credential
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
        ``max_concurrency``), taken by ``request_slot``; ``None``: unbounded.
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
    async def request_slot(self) -> AsyncIterator[None]:
        """Hold one of the evaluation's request slots while one wire request is in flight."""
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
