"""Token counts and prices of model calls, known before anything is sent.

A backend counts the prompt tokens of one request with ``count_tokens``: a
local model with its own tokenizer (exact), an OpenAI-compatible backend with a
user-supplied ``tokenizer=`` (exact for the server it describes), with
``tiktoken`` when the model is known to it AND its encoding file is already on
disk (tiktoken downloads encodings from the internet; this module never does),
or else with the documented estimate ``estimate_tokens``: one token per 4
characters, rounded up. ``Price`` turns tokens into money (per million tokens:
input, output, and the provider's prompt-cache reads and writes, with the
discount of provider batch jobs). There is no built-in price table: prices go
stale, so they come from the user (``models.openai(..., price=(0.15, 0.60))``,
``price=Price(3.0, 15.0, cached_input=0.30, cache_write=3.75)`` or a
``prices={model name: (input, output)}`` table).

Money follows one rule everywhere (``explain``, budgets, ``Trace.cost()``):
it is counted exactly (``Price.money``: a ``Fraction``, with each price and
budget read as the decimal it is written as, so ``0.1`` is one tenth), and
rounded only where it is reported, up to a whole micro-unit (a millionth of
the prices' currency: a micro-dollar for prices in dollars; ``reported``).
A run split into batches then costs to the last digit what it costs whole,
and a budget equal to a reported estimate admits the run it estimates.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import tempfile
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Mapping, NamedTuple, Sequence, Union

__all__ = [
    "CHARS_PER_TOKEN",
    "MICROS",
    "Price",
    "PriceTable",
    "TokenCounter",
    "WireUsage",
    "estimate_tokens",
    "exact_money",
    "price_of",
    "reported",
    "tiktoken_counter",
    "user_counter",
    "wire_usage",
]

#: The estimate's ratio: English text averages about 4 characters per token
#: with OpenAI's tokenizers; code and other languages use more tokens.
CHARS_PER_TOKEN = 4

#: Reported money is rounded up to a whole 1/MICROS of the prices' currency (a micro-dollar).
MICROS = 1_000_000

#: ``text -> tokens``: an int, or a sequence of tokens (its length counts).
Tokenizer = Callable[[str], Union[int, Sequence[Any]]]
TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """The documented estimate: ``ceil(len(text) / 4)`` tokens.

    Examples
    --------
    >>> estimate_tokens("What is 17 * 3?")
    4
    """
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def user_counter(tokenizer: Tokenizer) -> TokenCounter:
    """A counter from a user's ``tokenizer``: a callable returning a count or a list of tokens."""
    if not callable(tokenizer):
        raise TypeError(f"tokenizer must be a callable text -> tokens (or count), got {type(tokenizer).__name__}")

    def count(text: str) -> int:
        tokens = tokenizer(text)
        return int(tokens) if isinstance(tokens, int) else len(tokens)

    return count


_TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/{}.tiktoken"
_tiktoken_counters: dict[str, TokenCounter | None] = {}


def tiktoken_counter(model: str) -> TokenCounter | None:
    """tiktoken's counter for ``model`` when tiktoken knows it and its encoding is on disk; else ``None``.

    tiktoken fetches encodings from the internet on first use and keeps them
    under ``TIKTOKEN_CACHE_DIR`` (or ``DATA_GYM_CACHE_DIR``, or
    ``<tmp>/data-gym-cache``). This looks only at that folder, so counting
    never reaches the network: on a machine that never downloaded the encoding,
    the caller falls back to ``estimate_tokens``.
    """
    if model in _tiktoken_counters:
        return _tiktoken_counters[model]
    counter: TokenCounter | None = None
    try:
        import tiktoken

        name = tiktoken.encoding_name_for_model(model)
    except (ImportError, KeyError):
        name = None
    if name is not None and os.path.exists(_tiktoken_cache_path(_TIKTOKEN_URL.format(name))):
        try:
            encoding = tiktoken.get_encoding(name)
            counter = lambda text: len(encoding.encode(text, disallowed_special=()))  # noqa: E731
        except Exception:  # noqa: BLE001 - an unreadable file: use the estimate
            counter = None
    _tiktoken_counters[model] = counter
    return counter


def _tiktoken_cache_path(url: str) -> str:
    folder = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    if folder is None:
        folder = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return os.path.join(folder, hashlib.sha1(url.encode()).hexdigest())


class WireUsage(NamedTuple):
    """Tokens of one answer: ``prompt`` (all of them, cached or not), ``completion``, and of the
    prompt's, those ``cached`` (read from the provider's prompt cache) and ``cache_write``
    (written to it: Anthropic bills them apart)."""

    prompt: int
    completion: int
    cached: int = 0
    cache_write: int = 0


def wire_usage(usage: Any) -> WireUsage | None:
    """The tokens a response's ``usage`` object reports; ``None`` when absent or malformed.

    OpenAI-style servers say ``prompt_tokens``/``completion_tokens``, and the
    cached part of the prompt in ``prompt_tokens_details.cached_tokens``.
    Anthropic says ``input_tokens``/``output_tokens`` and counts the prompt
    tokens written to or read from its prompt cache apart
    (``cache_creation_input_tokens``, ``cache_read_input_tokens``): they are
    prompt tokens too, as OpenAI's ``prompt_tokens`` counts its cached ones.

    Examples
    --------
    >>> wire_usage({"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5})
    WireUsage(prompt=100, completion=5, cached=90, cache_write=0)
    >>> wire_usage({"prompt_tokens": 2006, "completion_tokens": 3,
    ...             "prompt_tokens_details": {"cached_tokens": 1920}}).cached
    1920
    """
    if not isinstance(usage, dict):
        return None
    prompt: Any  # JSON values, each checked to be an int >= 0 below
    completion: Any
    if "prompt_tokens" in usage:
        prompt, completion, write = usage.get("prompt_tokens"), usage.get("completion_tokens"), 0
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        cached = 0 if cached is None else cached
        inside = 0  # OpenAI's prompt_tokens already counts its cached tokens
    else:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        write = usage.get("cache_creation_input_tokens") or 0
        cached = usage.get("cache_read_input_tokens") or 0
        inside = 1
    if not all(type(n) is int and n >= 0 for n in (prompt, completion, write, cached)):
        return None
    total = int(prompt) + inside * (int(write) + int(cached))
    return WireUsage(total, int(completion), min(int(cached), total), int(write))


@dataclass(frozen=True)
class Price:
    """Money per million tokens: ``input`` (prompt) and ``output`` (completion).

    ``cached_input`` is the price of prompt tokens read from the provider's
    prompt cache (OpenAI bills them at a fraction of ``input``, Anthropic at
    0.1x) and ``cache_write`` that of tokens written to it (Anthropic: 1.25x
    for 5 minutes); ``None`` bills them as ``input``. ``job_discount`` is the
    fraction taken off everything in a provider batch job (0.5 at OpenAI and
    Anthropic); ``batch_discount`` is its deprecated name (kept for one
    release, as a keyword, a mapping key and an attribute).

    Examples
    --------
    >>> Price(0.15, 0.60).cost(1_000_000, 500_000)
    0.45
    >>> price = Price(3.0, 15.0, cached_input=0.30, cache_write=3.75, job_discount=0.5)
    >>> round(price.cost(3_000_000, 0, cached_tokens=2_000_000, cache_write_tokens=500_000), 4)
    3.975
    >>> round(price.cost(1_000_000, 0, jobs=True), 4)
    1.5
    """

    input: float
    output: float
    cached_input: float | None = None
    cache_write: float | None = None
    job_discount: float = 0.0

    def __init__(self, input: float, output: float, cached_input: float | None = None,  # noqa: A002
                 cache_write: float | None = None, job_discount: float = 0.0, *,
                 batch_discount: float | None = None) -> None:
        if batch_discount is not None:
            _deprecated("Price(batch_discount=...)", "job_discount=")
            job_discount = batch_discount
        for name, value in (("input", input), ("output", output), ("cached_input", cached_input),
                            ("cache_write", cache_write), ("job_discount", job_discount)):
            object.__setattr__(self, name, value)
        self.__post_init__()

    @property
    def batch_discount(self) -> float:
        """The deprecated name of ``job_discount`` (it goes in the next release)."""
        _deprecated("Price.batch_discount", "job_discount")
        return self.job_discount

    def __post_init__(self) -> None:
        for name in ("input", "output", "cached_input", "cache_write", "job_discount"):
            value = getattr(self, name)
            if value is None and name in ("cached_input", "cache_write"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"price {name} must be a number >= 0 (money per 1M tokens), got {value!r}")
        if self.job_discount >= 1:
            raise ValueError(f"price job_discount is the fraction taken off (0.5 for half price), "
                             f"got {self.job_discount!r}")

    @classmethod
    def of(cls, value: Any) -> Price:
        """A ``Price`` from itself, an ``(input_per_1M, output_per_1M)`` pair, or a mapping of its fields."""
        if isinstance(value, Price):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(*value)
        if isinstance(value, Mapping):
            if "batch_discount" in value:
                _deprecated("the price field batch_discount", "job_discount")
                value = {("job_discount" if name == "batch_discount" else name): v for name, v in value.items()}
            unknown = sorted(set(value) - _PRICE_FIELDS)
            if unknown:
                raise TypeError(f"unknown price field {unknown[0]!r}; the fields are {', '.join(sorted(_PRICE_FIELDS))}")
            return cls(**value)
        raise TypeError(f"a price is (input_per_1M, output_per_1M), a mapping of Price's fields or a Price, "
                        f"got {value!r}")

    def money(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
        jobs: bool = False,
        batch: bool | None = None,
    ) -> Fraction:
        """The money ``prompt_tokens`` in and ``completion_tokens`` out cost, exactly (what totals add up).

        ``cached_tokens`` and ``cache_write_tokens`` are the parts of
        ``prompt_tokens`` read from and written to the provider's prompt
        cache; ``jobs``: they ran in a provider batch job (``batch=`` is its
        deprecated name). Each price is read as the decimal it is written as
        (``exact_money``).

        Examples
        --------
        >>> Price(0.1, 0.3).money(3, 0) == Fraction(3, 10) / 1_000_000
        True
        """
        if batch is not None:
            _deprecated("Price.money(batch=...)", "jobs=")
            jobs = batch
        input_price, cached_price, write_price, output_price, kept = self._exact
        plain = max(prompt_tokens - cached_tokens - cache_write_tokens, 0)
        money = plain * input_price + cached_tokens * cached_price + cache_write_tokens * write_price
        money += completion_tokens * output_price
        return money * kept if jobs else money

    @functools.cached_property
    def _exact(self) -> tuple[Fraction, Fraction, Fraction, Fraction, Fraction]:
        """Input, cached-input, cache-write and output prices per token, exact; the part a job keeps."""
        input_price = exact_money(self.input) / 1_000_000
        cached_price = input_price if self.cached_input is None else exact_money(self.cached_input) / 1_000_000
        write_price = input_price if self.cache_write is None else exact_money(self.cache_write) / 1_000_000
        return input_price, cached_price, write_price, exact_money(self.output) / 1_000_000, 1 - exact_money(self.job_discount)

    def cost(
        self,
        prompt_tokens: int,
        completion_tokens: int,
        *,
        cached_tokens: int = 0,
        cache_write_tokens: int = 0,
        jobs: bool = False,
        batch: bool | None = None,
    ) -> float:
        """``money(...)`` as reported: rounded up to a whole micro-unit (``reported``)."""
        if batch is not None:
            _deprecated("Price.cost(batch=...)", "jobs=")
            jobs = batch
        return reported(self.money(prompt_tokens, completion_tokens, cached_tokens=cached_tokens,
                                   cache_write_tokens=cache_write_tokens, jobs=jobs))


def exact_money(amount: float) -> Fraction:
    """A price or a budget as exact money: the decimal it is written as (``0.1`` is one tenth).

    Examples
    --------
    >>> exact_money(0.1) * 3 == Fraction(3, 10)
    True
    """
    return Fraction(repr(amount)) if isinstance(amount, float) else Fraction(amount)


def reported(money: Fraction) -> float:
    """Exact ``money`` rounded up to a whole micro-unit (``MICROS``): how every amount is shown.

    The float prints as that many micro-units, and ``exact_money`` reads it
    back as exactly them (up to 10**15 micro-units), so a budget set to a
    reported estimate is never below the money it estimates.

    Examples
    --------
    >>> reported(Fraction(1, 3))
    0.333334
    """
    return math.ceil(money * MICROS) / MICROS


_PRICE_FIELDS = frozenset({"input", "output", "cached_input", "cache_write", "job_discount"})


def _deprecated(old: str, new: str) -> None:
    """Warn that ``old`` goes in the next release (docs/reference/glossary.md: a job, not a batch)."""
    warnings.warn(f"{old} is deprecated and goes in the next release: use {new} (a provider batch job is a job; "
                  f"a batch is one backend call)", DeprecationWarning, stacklevel=3)


#: A user's price table: model name (or a backend's repr) -> Price or (input, output).
PriceTable = Mapping[str, Any]


def price_of(backend: Any, prices: PriceTable | None = None) -> Price | None:
    """The price of ``backend``: its own ``price``, else ``prices[model name]``, else ``prices[repr]``."""
    own = getattr(backend, "price", None)
    if own is not None:
        return Price.of(own)
    if prices:
        for key in (backend.model_name, repr(backend)):
            if key in prices:
                return Price.of(prices[key])
    return None
