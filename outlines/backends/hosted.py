"""What every backend of a hosted API shares: options, the client, credentials, token counts.

``HostedBackend`` checks the model name, the base URL and the limits, builds
the ``http.HTTPClient`` that speaks to the service (sessions, retries, rate
limits, secrets), keeps a fingerprint of the credentials for equality only
(never in the identity, a cache key or a repr), and counts prompt tokens with
the user's tokenizer, tiktoken, or the estimate (``backends.usage``). A
subclass names its service with class attributes: the default base URL, the
environment variables that may set the URL and the key, and how the key is
sent. The OpenAI backends (``backends.openai``) and Anthropic's
(``backends.anthropic``) are its subclasses.
"""
from __future__ import annotations

import hmac
import os
from typing import Any, Mapping

from outlines.backends import retry, urls
from outlines.backends.base import Backend, BackendError, check_limit
from outlines.backends.http import HTTPClient, credential_fingerprint
from outlines.backends.usage import Price, estimate_tokens, tiktoken_counter, user_counter

__all__ = ["HostedBackend"]


class HostedBackend(Backend):
    """A backend that sends requests to a hosted API; see the module docstring.

    Parameters
    ----------
    model
        Model name sent to the service.
    base_url
        API root (default: the environment variable ``base_url_env``, else
        ``default_base_url``).
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
        ``(input_per_1M, output_per_1M)`` or a ``usage.Price``.
    """

    sends_requests = True
    default_base_url = ""
    base_url_env = ""
    api_key_env = ""
    #: How the key is sent: ``(header, template)`` (see ``http.HTTPClient``).
    key_header: tuple[str, str] = ("Authorization", "Bearer {key}")
    #: Headers every request carries that are not secret (an API version).
    static_headers: Mapping[str, str] = {}

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
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if base_url is not None:
            base_url = urls.check_base_url(base_url, "base_url")
        elif self.base_url_env and os.environ.get(self.base_url_env):
            base_url = urls.check_base_url(os.environ[self.base_url_env], self.base_url_env)
        else:
            base_url = self.default_base_url
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

    def _count(self, text: str) -> int:
        if self._tokenizer is not None:
            return user_counter(self._tokenizer)(text)
        counter = tiktoken_counter(self.model)
        return counter(text) if counter is not None else estimate_tokens(text)

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
