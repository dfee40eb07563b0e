"""What every backend of a hosted API shares: options, the client, credentials, token counts.

``HostedBackend`` checks its options, builds the ``http.HTTPClient`` that
speaks to the service, keeps a fingerprint of the credentials for equality
only (never in the identity, a cache key or a repr), counts prompt tokens
(``backends.usage``) and plans the warm-up of the service's prompt cache
(``backends.warmup``), opening the followers' connections while they wait
(``opening_connections``). A subclass (``backends.openai``,
``backends.anthropic``) names its service with class attributes.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import os
from typing import Any, AsyncIterator, Mapping, Sequence

from outlines.backends import retry, urls
from outlines.backends.base import Backend, BackendError, check_limit
from outlines.backends.http import HTTPClient, credential_fingerprint
from outlines.backends.usage import Price, estimate_tokens, tiktoken_counter, user_counter
from outlines.backends.warmup import ALONE, Turn

__all__ = ["WARMUP_WAIT", "HostedBackend", "check_range"]

#: The most seconds the siblings of a shared head wait for their leader's response to start.
WARMUP_WAIT = 30.0


def check_range(name: str, value: Any, low: float, high: float, provider: str) -> None:
    """Refuse ``value`` (when set) outside ``[low, high]``, naming the provider's documented range.

    Examples
    --------
    >>> check_range("temperature", 3, 0, 2, "OpenAI")
    Traceback (most recent call last):
    ...
    ValueError: temperature must be between 0 and 2 for OpenAI (its API's documented range), got 3
    """
    if value is not None and not low <= float(value) <= high:
        raise ValueError(f"{name} must be between {low:g} and {high:g} for {provider} (its API's documented "
                         f"range), got {value!r}")


class HostedBackend(Backend):
    """A backend that sends requests to a hosted API; see the module docstring.

    Parameters
    ----------
    model
        Model name sent to the service.
    base_url
        API root with its version, ``https://api.openai.com/v1`` or
        ``https://api.anthropic.com/v1`` (default: the environment variable
        ``base_url_env``, else ``default_base_url``); a backend whose paths
        carry the version (``version_in_paths``) takes it without too.
    api_key
        Secret key (default: the environment variable ``api_key_env``);
        never shown, logged or cached.
    max_batch, max_concurrency, max_retries
        Draws per ``generate`` call, requests in flight, retries of a request.
    timeout, connect_timeout, total_timeout, rpm, tpm, max_retry_after, headers
        As ``http.HTTPClient``.
    tokenizer
        ``text -> tokens (or count)`` counting prompt tokens as the service does.
    price
        ``(input_per_1M, output_per_1M)`` or a ``usage.Price`` (with the
        prices of cached input and cache writes, and the batch discount).
    prefix_warmup
        Warm the service's prompt cache before sending the siblings of a
        shared head (default ``True``: followers wait at most
        ``WARMUP_WAIT`` seconds for their leader's response to start); a
        number of seconds sets that bound; ``False`` sends every request at once.
    """

    sends_requests = True
    takes_extra_body = True
    default_base_url = ""
    base_url_env = ""
    api_key_env = ""
    #: How the key is sent: ``(header, template)`` (see ``http.HTTPClient``).
    key_header: tuple[str, str] = ("Authorization", "Bearer {key}")
    #: Headers every request carries that are not secret (an API version).
    static_headers: Mapping[str, str] = {}
    #: The shortest prompt head the service caches, in its tokens (OpenAI: 1,024).
    cache_min_tokens = 1024
    #: The version segment the request paths start with (Anthropic's ``/v1/messages``), if any: a base
    #: URL ending in it (the convention: ``https://api.anthropic.com/v1``) is kept without it.
    version_in_paths = ""
    #: True when the cache hits only at boundaries the request marks (Anthropic's breakpoints).
    cache_boundaries_marked = False

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_batch: int | None = None,
        max_concurrency: int = 32,
        max_retries: int = 3,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        rpm: float | None = None,
        tpm: float | None = None,
        max_retry_after: float = retry.MAX_RETRY_AFTER,
        headers: Mapping[str, str] | None = None,
        total_timeout: float | None = None,
        tokenizer: Any = None,
        price: Any = None,
        prefix_warmup: bool | float = True,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if base_url is not None:
            base_url = urls.check_base_url(base_url, "base_url")
        elif self.base_url_env and os.environ.get(self.base_url_env):
            base_url = urls.check_base_url(os.environ[self.base_url_env], self.base_url_env)
        else:
            base_url = self.default_base_url
        if self.version_in_paths:  # the convention's /v1 is in the request paths: the other spelling is the same
            base_url = urls.without_version(base_url, self.version_in_paths)
        where = f"{self.kind}({model!r})"
        max_batch = check_limit("max_batch", max_batch, where=where)
        max_concurrency = check_limit("max_concurrency", max_concurrency, where=where) or 32
        if api_key is None:
            api_key = os.environ.get(self.api_key_env)
        self.model = model
        self.base_url = base_url
        self.max_batch = max_batch
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.client = HTTPClient(
            base_url,
            api_key=api_key,
            max_concurrency=max_concurrency,
            max_retries=max_retries,
            timeout=timeout,
            connect_timeout=connect_timeout,
            rpm=rpm,
            tpm=tpm,
            max_retry_after=max_retry_after,
            headers=headers,
            total_timeout=total_timeout,
            key_header=self.key_header,
            static_headers=self.static_headers,
        )
        # Not in ``identity`` (cache keys, reprs): only equality, so that models that
        # differ in credentials never share a batch, a session or a key.
        self._credentials = credential_fingerprint(api_key, headers)
        self._has_key = bool(api_key) or bool(headers)  # a header may carry the key (api-key: ...)
        # Token counting (``backends.usage``): the user's tokenizer, else tiktoken
        # when its encoding is on disk, else the estimate. Neither is in the identity.
        self.price = None if price is None else Price.of(price)
        if tokenizer is not None:
            user_counter(tokenizer)  # checks it is callable
        self._tokenizer = tokenizer  # kept as given (no closure): backends travel to Dask workers
        self._user_tokenizer = tokenizer is not None
        self.tokens_exact = tokenizer is not None or tiktoken_counter(model) is not None
        if prefix_warmup is True:
            self.prefix_warmup: float | None = WARMUP_WAIT
        elif prefix_warmup is False or prefix_warmup is None:
            self.prefix_warmup = None
        elif isinstance(prefix_warmup, (int, float)) and 0 < prefix_warmup < float("inf"):
            self.prefix_warmup = float(prefix_warmup)
        else:
            raise ValueError(f"{where}: prefix_warmup must be True, False or a positive number of seconds, "
                             f"got {prefix_warmup!r}")

    @property
    def prefix_min_head(self) -> int | None:  # type: ignore[override]  # read-only here: follows prefix_warmup
        """Characters a shared head needs before it can be cached (a token is at least one), or ``None`` when off."""
        return self.cache_min_tokens if self.prefix_warmup is not None else None

    def warmup_turns(self, texts: Sequence[str]) -> list[Turn]:
        """How each request of a batch goes (``backends.warmup``): ``texts`` are the requests' prompts, one text each.

        Must be called on the event loop that sends them (the plan is shared by
        every batch of that loop).
        """
        if self.prefix_warmup is None:
            return [ALONE] * len(texts)
        return self.client.warmup().turns(
            texts, lambda head: self._count(head) >= self.cache_min_tokens, min_chars=self.cache_min_tokens,
            wait=self.prefix_warmup, exact=self.cache_boundaries_marked,
        )

    @contextlib.asynccontextmanager
    async def opening_connections(self, turns: Sequence[Turn]) -> AsyncIterator[None]:
        """While the body runs, open one connection for each request of ``turns`` that waits for its leader.

        A follower released when its leader's response starts then only
        writes its request (``HTTPClient.preconnect``): the connects of a
        round's followers happen during the leader's latency instead of
        after it. ``turns``: one per request the batch sends.
        """
        waiting = [turn.after for turn in turns if turn.after is not None and not turn.after.ready.is_set()]
        if not waiting:
            yield
            return
        leaders = asyncio.gather(*(warm.wait() for warm in dict.fromkeys(waiting)))
        opening = asyncio.ensure_future(self.client.preconnect(len(waiting), leaders))
        try:
            yield
        finally:
            if not opening.done():  # the followers have gone or failed: pool what is held
                opening.cancel()
            leaders.cancel()  # only this call's wait on them; the leaders themselves go on
            await asyncio.wait([opening])  # it raises nothing: a failure only loses the head start

    def _count(self, text: str) -> int:
        if self._tokenizer is not None:
            return user_counter(self._tokenizer)(text)
        counter = tiktoken_counter(self.model)
        return counter(text) if counter is not None else estimate_tokens(text)

    def constraint_field(self, constraint: Any, *, job: bool = False) -> str | None:
        """The request field that carries ``constraint`` to the service: live, or in a batch job's lines (``job``).

        ``None`` (here): the service has no field for it, so the text is only
        checked (``constraints.generate_valid``) and a draw that breaks it is
        asked again at once; in job mode such draws run live
        (``runtime.jobs``), since a retry in a job would cost a new job.
        """
        return None

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens of one request (the user's tokenizer, tiktoken, or ``usage.estimate_tokens``)."""
        return self._count(prompt)

    @property
    def identity(self) -> tuple[Any, ...]:
        return (self.kind, self.model, self.base_url)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, HostedBackend)
            and self.identity == other.identity
            and hmac.compare_digest(self._credentials, other._credentials)
        )

    def __hash__(self) -> int:
        return hash((self.identity, self._credentials))

    def redact(self, text: str) -> str:
        """``text`` with this backend's API key and header values starred out."""
        return self.client.redact(text)

    async def aclose(self) -> None:
        await self.client.aclose()

    def malformed(self, message: str, data: Any, path: str = "") -> BackendError:
        """The error for a 2xx answer that does not hold what it should (quoted, key redacted)."""
        return BackendError(
            message,
            status=200,
            body=self.client.redact(repr(data)[:400]),
            endpoint=self.base_url + path,
            model=self.model,
        )
