"""Anthropic's Messages API as a backend: ``POST /v1/messages``, one request per draw.

The service speaks its own dialect: the key goes in ``x-api-key`` with an
``anthropic-version`` header, the system prompt is a top-level ``system``
field (a conversation's system messages join it), ``max_tokens`` is required
(``DEFAULT_MAX_TOKENS`` when a call sets none), stops are ``stop_sequences``,
temperatures run from 0 to 1, and there is neither ``n`` nor ``seed``: each
sample is its own request, told apart by its draw number (part of its cache
key), and a ``seed`` stays in the key but is not sent. Usage is read by
``usage.wire_usage``; retries follow ``backends.retry`` (529 "overloaded" is
a 5xx, ``retry-after`` and ``x-should-retry`` are honoured).

Prompt cache: requests of a batch that share a head of at least
``CACHE_MIN_TOKENS`` carry a ``cache_control`` breakpoint where it ends and go
leader first, as Anthropic's documentation advises (``backends.warmup``;
``prefix_warmup=False`` turns both off). Structured outputs are not sent (no
field holds a choice list or a pattern): the text is checked and the draw
asked again (``constraints.generate_valid``). ``request_body`` and ``text_of``
are the one body builder and parser, shared with Message Batches (``backends.jobs``).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw, GenerationParams
from outlines.backends.hosted import HostedBackend, check_range
from outlines.backends.warmup import Turn, joined
from outlines.common.conversation import messages_of

__all__ = ["API_VERSION", "CACHE_MIN_TOKENS", "DEFAULT_MAX_TOKENS", "AnthropicBackend", "cache_min_tokens",
           "with_breakpoints"]

DEFAULT_BASE_URL = "https://api.anthropic.com"
API_VERSION = "2023-06-01"
#: ``max_tokens`` sent when a call sets none (the API requires one).
DEFAULT_MAX_TOKENS = 1024
#: The shortest prompt head each model caches, by model-name prefix, from Anthropic's
#: prompt-caching documentation; models not listed cache from 1,024 tokens.
CACHE_MIN_TOKENS = (
    ("claude-opus-4-5", 4096), ("claude-opus-4-6", 4096), ("claude-opus-4-7", 4096),
    ("claude-haiku-4-5", 4096), ("claude-sonnet-4-6", 2048),
    ("claude-3-5-haiku", 2048), ("claude-3-haiku", 2048),
)
#: Models that refuse every sampling parameter (400 "`temperature` is deprecated for this model"):
#: Claude Opus 4.7 and later, and the fifth generation. The SDK's types for API version 2026-10-21
#: have no ``temperature``, ``top_p`` or ``top_k`` at all; this backend speaks ``API_VERSION``,
#: under which earlier models still take them.
NO_SAMPLING_PARAMETERS = ("claude-opus-4-7", "claude-opus-4-8", "claude-mythos", "claude-fable", "claude-opus-5",
                          "claude-sonnet-5", "claude-haiku-5")
#: A breakpoint: the prompt cache may end after this block.
EPHEMERAL = {"type": "ephemeral"}


def cache_min_tokens(model: str) -> int:
    """The shortest prompt head ``model`` caches (``CACHE_MIN_TOKENS``; 1,024 for others).

    Examples
    --------
    >>> cache_min_tokens("claude-haiku-4-5-20251001"), cache_min_tokens("claude-sonnet-4-5")
    (4096, 1024)
    """
    return next((tokens for prefix, tokens in CACHE_MIN_TOKENS if model.startswith(prefix)), 1024)


class AnthropicBackend(HostedBackend):
    """Claude models through the Messages API; one request per draw.

    Takes the options of ``hosted.HostedBackend`` (``max_batch`` default 16
    draws per ``generate`` call, ``max_concurrency`` 32 requests in flight,
    ``max_retries`` 3...) and ``system_prompt``, sent as ``system`` (part of
    the identity: it changes the outputs). The key comes from ``api_key`` or
    ``ANTHROPIC_API_KEY``, the base URL from ``base_url``,
    ``ANTHROPIC_BASE_URL`` or ``https://api.anthropic.com/v1``: the API root
    with its version, as for ``models.openai``; the ``anthropic`` SDK's
    spelling without ``/v1`` is the same URL (the backend keeps the root
    without it, so its requests go to ``/v1/messages`` and its cache keys
    stay as they were).

    Examples
    --------
    >>> AnthropicBackend("claude-haiku-4-5", api_key="sk-ant-x", system_prompt="Be brief.").identity
    ('anthropic', 'claude-haiku-4-5', 'https://api.anthropic.com', 'Be brief.')
    """

    kind = "anthropic"
    generation_extras = frozenset({"top_k"})
    path = "/v1/messages"
    cache_boundaries_marked = True
    default_base_url = DEFAULT_BASE_URL
    base_url_env = "ANTHROPIC_BASE_URL"
    api_key_env = "ANTHROPIC_API_KEY"
    key_header = ("x-api-key", "{key}")
    static_headers = {"anthropic-version": API_VERSION}
    version_in_paths = "v1"

    def __init__(
        self, model: str, *, system_prompt: str | None = None, max_batch: int | None = 16, **options: Any
    ) -> None:
        super().__init__(model, max_batch=max_batch, **options)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string, got {type(system_prompt).__name__}")
        self.system_prompt = system_prompt
        self.cache_min_tokens = cache_min_tokens(model)

    @property
    def identity(self) -> tuple[Any, ...]:
        return (self.kind, self.model, self.base_url, self.system_prompt)

    def check_params(self, params: GenerationParams) -> None:
        """Anthropic's documented ranges: ``temperature`` 0 to 1, ``top_p`` 0 to 1, not both; ``top_k`` >= 1.

        Newer Claude models refuse ``temperature`` and ``top_p`` together, and
        those of ``NO_SAMPLING_PARAMETERS`` refuse every sampling parameter.
        """
        top_k = dict(params.extra).get("top_k")
        given = [name for name, value in (("temperature", params.temperature), ("top_p", params.top_p),
                                          ("top_k", top_k)) if value is not None]
        if given and self.model.startswith(NO_SAMPLING_PARAMETERS):
            raise ValueError(f"{self.model} takes no {', '.join(given)} (Anthropic refuses sampling parameters "
                             "for this model): leave them out")
        check_range("temperature", params.temperature, 0, 1, "Anthropic")
        check_range("top_p", params.top_p, 0, 1, "Anthropic")
        if params.temperature is not None and params.top_p is not None:
            raise ValueError("give temperature or top_p, not both: newer Claude models refuse the two together")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 for Anthropic, got {top_k!r}")

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens of one request: its messages' contents and the system prompt."""
        return sum(self._count(str(m.get("content", ""))) for m in messages_of(prompt, self.system_prompt))

    def requests_for(self, draws: Sequence[Draw]) -> int:
        """One request per distinct draw (greedy draws of a prompt are one draw)."""
        return len({(d.params, d.prompt, d.draw) for d in draws})

    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        positions: dict[tuple[GenerationParams, str, int], list[int]] = {}
        for index, draw in enumerate(draws):
            positions.setdefault((draw.params, draw.prompt, draw.draw), []).append(index)
        out: list[str] = [""] * len(draws)
        errors: list[Exception] = []
        requests = [Draw(prompt, params, number) for params, prompt, number in positions]
        bodies: list[dict[str, Any] | Exception] = []
        for draw in requests:
            try:
                bodies.append(self.request_body(draw))
            except BackendError as error:
                bodies.append(error)
        turns = self.warmup_turns([_joined(b) if isinstance(b, dict) else "" for b in bodies])

        async def one(body: dict[str, Any] | Exception, indices: list[int], turn: Turn) -> None:
            try:
                if isinstance(body, Exception):
                    raise body
                await turn.ready()
                text = await self._message(with_breakpoints(body, turn.heads), report, turn.started)
            except Exception as error:  # noqa: BLE001 - fails this draw only
                errors.append(error)
                for index in indices:
                    report.failure(index, error)
                return
            finally:
                turn.started()  # a leader that never got a response still releases its followers
            for index in indices:
                out[index] = text
                report.result(index, text)  # cached at once, whatever its siblings do

        async with self.opening_connections(turns):
            await asyncio.gather(*(one(body, indices, turn)
                                   for body, indices, turn in zip(bodies, positions.values(), turns)))
        if errors:
            raise errors[0]  # every draw is reported: this only tells direct callers
        return out

    async def _message(
        self, body: dict[str, Any], report: BatchReport, on_response: Callable[[], None] | None = None
    ) -> str:
        tokens = len(_joined(body)) / 4 + body["max_tokens"]
        data = await self.client.post_json(self.path, body, report, tokens=tokens, on_response=on_response)
        return self.text_of(data)

    def request_body(self, draw: Draw) -> dict[str, Any]:
        """The Messages API body asking for one sample of ``draw`` (live, or a batch's ``params``).

        Raises
        ------
        BackendError
            For parameters the API cannot take (``check_params``), naming them.
        """
        params = draw.params
        messages = messages_of(draw.prompt, self.system_prompt)  # a Conversation sends its own messages
        system = [m["content"] for m in messages if m["role"] == "system"]
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": [m for m in messages if m["role"] != "system"],
        }
        if system:
            body["system"] = "\n\n".join(system)
        try:  # checked when the call was built; a fallback chain's draws carry another model's params
            self.check_params(params)
        except ValueError as exc:
            raise BackendError(str(exc), endpoint=self.base_url + self.path, model=self.model) from None
        if params.temperature is not None:
            body["temperature"] = params.temperature
        if params.top_p is not None:
            body["top_p"] = params.top_p
        if params.stop:
            body["stop_sequences"] = list(params.stop)
        wire = params.to_dict()
        for name in ("max_tokens", "temperature", "top_p", "stop", "seed", "constraint"):
            wire.pop(name, None)
        body.update(wire)  # further parameters (top_k, metadata...) as given
        return body

    def text_of(self, data: Mapping[str, Any]) -> str:
        """The text of a Messages API answer: its text blocks, joined.

        Raises
        ------
        BackendError
            When ``data`` holds no list of content blocks, or no text and no
            reason to end (a refusal is named as one).
        """
        content = data.get("content")
        if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
            raise self.malformed("response has no list of 'content' blocks", data, self.path)
        texts = [block.get("text") for block in content if block.get("type") == "text"]
        if not all(isinstance(text, str) for text in texts):
            raise self.malformed("a text block has no 'text' string", data, self.path)
        reason = data.get("stop_reason")
        if reason == "refusal":
            raise self.malformed("the model refused", data, self.path)
        if not texts and reason not in ("end_turn", "max_tokens", "stop_sequence"):
            raise self.malformed("response has no text block", data, self.path)
        return "".join(texts)


def _parts(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The body's texts in the order the cache reads them: the system text, then each message (as ``request_body`` makes them)."""
    system = [{"role": "system", "content": body["system"]}] if "system" in body else []
    return system + list(body["messages"])


def _joined(body: Mapping[str, Any]) -> str:
    """The request as one text (``warmup.joined``): what its prompt cache sees, in order."""
    return joined(_parts(body))


def with_breakpoints(body: dict[str, Any], heads: Sequence[int]) -> dict[str, Any]:
    """``body`` with a ``cache_control`` breakpoint where each head of its joined text ends.

    ``heads`` are offsets in ``_joined(body)`` (``warmup.Turn.heads``). A head
    ending inside a text splits it into two text blocks, the first marked; one
    ending between texts marks the text before. The system text becomes a list
    of blocks when marked, a message its ``content`` list. Returns ``body``
    itself when there is nothing to mark.

    Examples
    --------
    >>> body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Long header. Q: 1?"}]}
    >>> with_breakpoints(body, [len("\x1euser\x1f") + 12])["messages"][0]["content"]
    [{'type': 'text', 'text': 'Long header.', 'cache_control': {'type': 'ephemeral'}}, {'type': 'text', 'text': ' Q: 1?'}]
    """
    if not heads:
        return body
    parts = _parts(body)
    cuts: dict[int, set[int]] = {}  # part -> offsets in its text
    start = 0
    for index, part in enumerate(parts):
        opening = start + len(f"\x1e{part['role']}\x1f")  # where its text starts
        end = opening + len(part["content"])
        for head in heads:
            if opening < head <= end:
                cuts.setdefault(index, set()).add(head - opening)
            elif start < head <= opening and index > 0:  # in the role marker: the previous text ends the head
                cuts.setdefault(index - 1, set()).add(len(parts[index - 1]["content"]))
        start = end
    if not cuts:
        return body
    out = dict(body)
    out["messages"] = list(body["messages"])
    first_message = 1 if "system" in body else 0
    for index, offsets in cuts.items():
        blocks = _blocks(parts[index]["content"], sorted(offsets))
        if index < first_message:
            out["system"] = blocks
        else:
            out["messages"][index - first_message] = {**parts[index], "content": blocks}
    return out


def _blocks(text: str, offsets: list[int]) -> list[dict[str, Any]]:
    """``text`` as text blocks cut at ``offsets``, each block ending at a cut marked as a breakpoint.

    A cut that would leave a block of whitespace only (the API refuses one) moves to the text's end or goes.
    """
    blocks: list[dict[str, Any]] = []
    start = 0
    for offset in offsets:
        if not text[offset:].strip():
            offset = len(text)
        if offset <= start or not text[start:offset].strip():
            continue
        blocks.append({"type": "text", "text": text[start:offset], "cache_control": EPHEMERAL})
        start = offset
    if start < len(text):
        blocks.append({"type": "text", "text": text[start:]})
    return blocks
