"""Token counts and prices of model calls, known before anything is sent.

A backend counts the prompt tokens of one request with ``count_tokens``: a
local model with its own tokenizer (exact), an OpenAI-compatible backend with a
user-supplied ``tokenizer=`` (exact for the server it describes), with
``tiktoken`` when the model is known to it AND its encoding file is already on
disk (tiktoken downloads encodings from the internet; this module never does),
or else with the documented estimate ``estimate_tokens``: one token per 4
characters, rounded up. ``Price`` turns tokens into money (per million tokens,
input and output). There is no built-in price table: prices go stale, so they
come from the user (``models.openai(..., price=(0.15, 0.60))`` or a
``prices={model name: (input, output)}`` table).
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence, Union

__all__ = [
    "CHARS_PER_TOKEN",
    "Price",
    "PriceTable",
    "TokenCounter",
    "estimate_tokens",
    "price_of",
    "tiktoken_counter",
    "user_counter",
    "wire_usage",
]

#: The estimate's ratio: English text averages about 4 characters per token
#: with OpenAI's tokenizers; code and other languages use more tokens.
CHARS_PER_TOKEN = 4

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


def wire_usage(usage: Any) -> tuple[int, int] | None:
    """``(prompt tokens, completion tokens)`` of a response's ``usage`` object; ``None`` when absent.

    OpenAI-style servers say ``prompt_tokens``/``completion_tokens``;
    Anthropic says ``input_tokens``/``output_tokens`` and counts the prompt
    tokens written to or read from its prompt cache apart
    (``cache_creation_input_tokens``, ``cache_read_input_tokens``): they are
    prompt tokens too, as OpenAI's ``prompt_tokens`` counts its cached ones.

    Examples
    --------
    >>> wire_usage({"input_tokens": 10, "cache_read_input_tokens": 90, "output_tokens": 5})
    (100, 5)
    """
    if not isinstance(usage, dict):
        return None
    if "prompt_tokens" in usage:
        prompt, completion, extra = usage.get("prompt_tokens"), usage.get("completion_tokens"), []
    else:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        extra = [usage.get(k) for k in ("cache_creation_input_tokens", "cache_read_input_tokens")]
    numbers = [prompt, completion, *(e for e in extra if e is not None)]
    if not all(type(n) is int and n >= 0 for n in numbers):
        return None
    return int(prompt) + sum(int(e) for e in extra if e is not None), int(completion)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Price:
    """Money per million tokens: ``input`` (prompt) and ``output`` (completion).

    Examples
    --------
    >>> Price(0.15, 0.60).cost(1_000_000, 500_000)
    0.45
    """

    input: float
    output: float

    def __post_init__(self) -> None:
        for name in ("input", "output"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"price {name} must be a number >= 0 (money per 1M tokens), got {value!r}")

    @classmethod
    def of(cls, value: Any) -> Price:
        """A ``Price`` from itself or an ``(input_per_1M, output_per_1M)`` pair."""
        if isinstance(value, Price):
            return value
        if isinstance(value, (tuple, list)) and len(value) == 2:
            return cls(*value)
        raise TypeError(f"a price is (input_per_1M, output_per_1M) or a Price, got {value!r}")

    def cost(self, prompt_tokens: float, completion_tokens: float) -> float:
        """The money ``prompt_tokens`` in and ``completion_tokens`` out cost."""
        return (prompt_tokens * self.input + completion_tokens * self.output) / 1_000_000


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
