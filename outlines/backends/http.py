"""A small JSON-over-HTTP client for backends: sessions, retries, limits, secrets.

``HTTPClient`` keeps one aiohttp ``ClientSession`` per event loop, created
lazily on the running loop and closed by ``aclose``, and an ``AIMDLimiter``
per loop that lowers the requests in flight after a 429. ``post_json`` and
``request`` (other methods and raw bodies: provider batch jobs) retry what
``retry.should_retry`` allows, spend the ``rpm``/``tpm`` budgets, report to the
batch's ``BatchReport`` and turn every failure into a ``BackendError`` that
never contains the API key. Redirects are followed here, not by aiohttp,
under ``outlines.backends.urls``'s policy.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

import aiohttp
import yarl

from outlines.backends import retry, urls
from outlines.backends.base import BackendError, BatchReport
from outlines.backends.ratelimit import AIMDLimiter, TokenBucket
from outlines.backends.usage import wire_usage
from outlines.backends.warmup import Warmup
from outlines.common.labels import hide_secrets

__all__ = ["HTTPClient", "Secret", "credential_fingerprint", "gather_or_cancel"]

logger = logging.getLogger("outlines.backends.http")
T = TypeVar("T")

#: The sleep used between retries and for rate limits (patched in tests).
sleep = asyncio.sleep

#: Failures of the transport, worth another try: refused or dropped
#: connections, read/connect timeouts, truncated bodies.
TRANSIENT_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)
#: Connections ``preconnect`` opens at once on a loop: a few, so that a request
#: sent meanwhile (a warm-up's leader) is not queued behind a burst of handshakes.
PRECONNECT_PARALLEL = 4


class Secret:
    """A string that does not show itself: repr and str print ``'***'``."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself, for the one place that sends it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __getstate__(self) -> str:
        return self._value

    def __setstate__(self, state: str) -> None:
        self._value = state


#: Keys the credential fingerprints; new in each process and never stored, so a
#: fingerprint cannot be checked against guessed keys outside this process.
_FINGERPRINT_SALT = os.urandom(32)


def credential_fingerprint(api_key: str | None, headers: Mapping[str, str] | None = None) -> str:
    """A digest that is equal for equal credentials (key and extra headers), in this process only.

    Backends compare it so that two models differing only in their key never
    share a batch (and so never send one's prompts with the other's key). It is
    an HMAC under a per-process random salt: not reversible, not comparable
    across processes, and never part of an identity, a cache key or a repr.
    """
    parts = [api_key or ""] + [f"{name}\0{value}" for name, value in sorted((headers or {}).items())]
    return hmac.new(_FINGERPRINT_SALT, "\0\0".join(parts).encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def _positive_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < float("inf")


def _seconds(name: str, value: Any, *, zero: bool = False) -> float:
    """A duration option, checked: a negative or zero one would silently mean something else."""
    if not isinstance(value, bool) and isinstance(value, (int, float)) and zero and value == 0:
        return 0.0
    if not _positive_number(value):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass
class _LoopState:
    session: aiohttp.ClientSession
    limiter: AIMDLimiter
    #: Bounds the connections ``preconnect`` opens at once, all its callers together.
    opening: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PRECONNECT_PARALLEL))
    #: Connections ``preconnect`` holds now (out of the pool, under the connector's limit).
    held: int = 0


@dataclass(frozen=True)
class _Wire:
    """What one request sends besides its path: the method and a JSON or raw body."""

    method: str
    payload: Mapping[str, Any] | None = None
    data: bytes | None = None
    content_type: str | None = None


@dataclass
class _FailedAttempt:
    reason: str
    error: BackendError
    retry_after: float | None = None


class HTTPClient:
    """JSON POSTs to one base URL, with retries, limits and one session per loop.

    Parameters
    ----------
    base_url
        API root, e.g. ``"https://api.openai.com/v1"``; paths are appended.
    api_key
        Sent as ``Authorization: Bearer ...``; never shown, logged or raised.
    max_concurrency
        Connections and requests in flight per event loop.
    max_retries
        Retries after the first attempt.
    timeout, connect_timeout
        Seconds allowed between bytes read, and to connect.
    total_timeout
        Seconds one request may take from start to last byte (``None``: no
        bound); a trickling server then times out instead of holding it.
    rpm, tpm
        Optional requests-per-minute and tokens-per-minute budgets.
    max_retry_after
        Longest Retry-After honoured; a longer one fails at once.
    headers
        Extra headers sent with every request (secret: hidden like the key;
        to the base URL's origin only: a redirect to another origin goes
        without them and without the API key; see ``outlines.backends.urls``).
    key_header
        ``(name, template)`` sending the key: ``("Authorization", "Bearer {key}")``
        by default, ``("x-api-key", "{key}")`` for Anthropic.
    static_headers
        Headers that are not secret (an API version), sent with every request.

    Notes
    -----
    Call ``aclose`` on every loop that used the client before that loop
    ends (the scheduler does, after each evaluation); a session cannot be
    closed from another loop, and aiohttp warns about one left open.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 32,
        max_retries: int = 3,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        rpm: float | None = None,
        tpm: float | None = None,
        max_retry_after: float = retry.MAX_RETRY_AFTER,
        headers: Mapping[str, str] | None = None,
        total_timeout: float | None = None,
        key_header: tuple[str, str] = ("Authorization", "Bearer {key}"),
        static_headers: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be a positive integer, got {max_concurrency!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.base_url = urls.check_base_url(base_url, "base_url")
        self.max_concurrency = int(max_concurrency)
        self.max_retries = int(max_retries)
        self.timeout = _seconds("timeout", timeout)
        self.connect_timeout = _seconds("connect_timeout", connect_timeout)
        self.total_timeout = None if total_timeout is None else _seconds("total_timeout", total_timeout)
        self.max_retry_after = _seconds("max_retry_after", max_retry_after, zero=True)
        for name, rate in (("rpm", rpm), ("tpm", tpm)):
            if rate is not None and not _positive_number(rate):
                raise ValueError(f"{name} must be a positive number or None (no limit), got {rate!r}")
        # Extra headers may carry secrets too (api-key, organization): hide their values.
        self._headers = {str(name): Secret(str(value)) for name, value in (headers or {}).items()}
        self._api_key = Secret(api_key) if api_key else None
        self.key_header = key_header
        self.static_headers = dict(static_headers or {})
        self.rpm = TokenBucket(rpm) if rpm is not None else None
        self.tpm = TokenBucket(tpm) if tpm is not None else None
        self._redirects_said: set[tuple[str, str]] = set()  # (from, to) origins already logged
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._states: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._warmups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Warmup] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_states"], state["_warmups"], state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_runtime()

    def state(self) -> _LoopState:
        """The session and limiter of the running loop, created on first use."""
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
            if state is None or state.session.closed:
                connector = aiohttp.TCPConnector(limit=self.max_concurrency, limit_per_host=self.max_concurrency)
                timeout = aiohttp.ClientTimeout(
                    total=self.total_timeout, sock_connect=self.connect_timeout, sock_read=self.timeout
                )
                session = aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False)
                state = self._states[loop] = _LoopState(session, AIMDLimiter(self.max_concurrency))
            return state

    def warmup(self) -> Warmup:
        """The prompt heads put in the service's cache from the running loop (``backends.warmup``)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            warmup = self._warmups.get(loop)
            if warmup is None:
                warmup = self._warmups[loop] = Warmup()
            return warmup

    async def preconnect(self, count: int, until: Awaitable[Any]) -> int:
        """Open up to ``count`` connections to the base URL, hold them until ``until`` is done, then pool them.

        Requests that must wait (a warm-up's followers, ``backends.warmup``)
        then find a connection open when they go, and only write: the
        connect (and TLS handshake) of each is paid while they wait, not
        after. The connections are held until then because an idle pooled
        one would be taken by the next connect, this one's own included.
        At most ``PRECONNECT_PARALLEL`` handshakes run at once on a loop,
        all callers together, and requests in flight plus connections held
        stay under ``max_concurrency``, so that a request sent meanwhile (the
        leader) neither queues behind a burst of handshakes nor waits for a
        connection.

        Parameters
        ----------
        count
            Connections wanted (one per waiting request).
        until
            When the waiting requests go (their leader's response started):
            no connection is opened after it, and the held ones are pooled.

        Returns
        -------
        int
            Connections opened. Any failure stops the opening quietly (a
            debug log line): the requests connect themselves, and report
            what fails.
        """
        state = self.state()
        session, connector = state.session, state.session.connector
        released = asyncio.ensure_future(until)
        held: list[Any] = []
        try:
            if connector is not None:
                await asyncio.sleep(0)  # requests scheduled with this call (the leader) start connecting first
                await self._open(state, connector, session, count, released, held)
            await released
        finally:
            released.cancel()
            state.held -= len(held)
            for connection in held:
                connection.release()  # idle in the pool, for the next requests to the same origin
        return len(held)

    async def _open(
        self, state: _LoopState, connector: aiohttp.BaseConnector, session: aiohttp.ClientSession, count: int,
        released: asyncio.Future[Any], held: list[Any],
    ) -> None:
        try:
            # aiohttp pools connections by origin: a bare request to the base URL
            # names the pool that the real requests, to paths under it, draw from.
            request = aiohttp.ClientRequest("POST", yarl.URL(self.base_url), loop=asyncio.get_running_loop(),
                                            session=session)
            while len(held) < count and not released.done():
                async with state.opening:
                    if released.done() or state.limiter.in_flight + state.held + 1 >= self.max_concurrency:
                        return
                    state.held += 1
                    try:
                        connection = await connector.connect(request, [], session.timeout)
                    except BaseException:
                        state.held -= 1
                        raise
                    held.append(connection)
        except Exception as exc:  # noqa: BLE001 - only a head start: the requests connect, and fail, themselves
            logger.debug("opening connections to %s ahead of requests failed: %s", self.base_url, exc)

    async def aclose(self) -> None:
        """Close the running loop's session (a no-op when there is none) and forget its warmed heads."""
        with self._lock:
            self._warmups.pop(asyncio.get_running_loop(), None)
            state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None and not state.session.closed:
            await state.session.close()

    def redact(self, text: str) -> str:
        """``text`` with every occurrence of the API key (or a header value) replaced by ``***``.

        A key shorter than ``labels.ANYWHERE_FROM`` characters is hidden only
        as a whole token, not inside a longer word.
        """
        secrets = [self._api_key, *self._headers.values()] if self._api_key else list(self._headers.values())
        # However short (a short key is still a key); a short one as a whole token (labels.hide_secrets).
        return hide_secrets(text, (secret.reveal() for secret in secrets))

    async def post_json(
        self,
        path: str,
        payload: Mapping[str, Any],
        report: BatchReport,
        *,
        tokens: float = 0.0,
        on_response: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """POST ``payload`` to ``base_url + path`` and return the decoded JSON object.

        Parameters
        ----------
        path
            Endpoint path, e.g. ``"/completions"``.
        payload
            JSON body; its ``"model"`` names the model in errors.
        report
            The batch's report: each attempt is a request (with its times),
            holds one of its request permits, and the usage is added to it.
        tokens
            Estimated tokens the request spends, for the ``tpm`` budget.
        on_response
            Called as soon as an attempt's response starts (status and
            headers arrived) or the attempt failed without one: a prompt
            cache warm-up releases the requests waiting for this one
            (``backends.warmup``).

        Returns
        -------
        dict
            The response body.

        Raises
        ------
        BackendError
            On a non-retryable status, when retries run out, when the server
            asks to wait longer than ``max_retry_after``, or on a body that is
            not a JSON object.
        """
        model = str(payload.get("model", "")) or None
        body = await self.request("POST", path, report, payload=payload, model=model, tokens=tokens,
                                  on_response=on_response)
        return self._decode(body, path, model, tokens, report)

    async def request(
        self,
        method: str,
        path: str,
        report: BatchReport,
        *,
        payload: Mapping[str, Any] | None = None,
        data: bytes | None = None,
        content_type: str | None = None,
        model: str | None = None,
        tokens: float = 0.0,
        retries: int | None = None,
        on_response: Callable[[], None] | None = None,
    ) -> bytes:
        """Send one request (retried like ``post_json``) and return the body of its 2xx answer.

        Parameters
        ----------
        method, path
            ``"GET"``, ``"POST"``...; the path is appended to ``base_url``.
        report
            Each attempt is one of its requests, holding one of its request permits.
        payload, data, content_type
            A JSON body, or raw bytes with their content type (a multipart
            upload); neither for a GET.
        model
            Named in errors.
        tokens
            Estimated tokens the request spends, for the ``tpm`` budget.
        retries
            Retries allowed (default ``max_retries``); 0 for a request that
            must not go twice before the caller has looked whether the first
            one took effect (creating a paid job).
        on_response
            As ``post_json``.

        Raises
        ------
        BackendError
            As ``post_json``.
        """
        state = self.state()
        wire = _Wire(method, payload, data, content_type)
        retries = self.max_retries if retries is None else retries
        attempt = 0
        while True:
            await self._throttle(tokens)
            outcome = await self._attempt(state, path, wire, model, report, on_response)
            if isinstance(outcome, bytes):
                return outcome
            error = outcome.error
            if not error.retryable:
                raise error
            if attempt >= retries:
                message = f"gave up after {attempt + 1} attempts; last: {outcome.reason}"
                raise self._error(message, path, model, status=error.status, body=error.body, retryable=True)
            delay = retry.retry_delay(attempt, outcome.retry_after, max_retry_after=self.max_retry_after)
            if delay is None:
                message = (f"server asked to retry after {outcome.retry_after:.3g}s, more than "
                           f"max_retry_after={self.max_retry_after:g}s; not waiting")
                raise self._error(message, path, model, status=error.status, body=error.body)
            logger.debug("retrying %s%s in %.2fs (attempt %d): %s", self.base_url, path, delay, attempt + 1, error)
            await sleep(delay)
            attempt += 1

    async def _attempt(
        self, state: _LoopState, path: str, wire: _Wire, model: str | None, report: BatchReport,
        on_response: Callable[[], None] | None = None,
    ) -> bytes | _FailedAttempt:
        """One request, reported with its times: the body of a 2xx, or why it failed."""
        async with report.request_permit():
            start = time.perf_counter()
            try:
                outcome = await self._attempt_once(state, path, wire, model, on_response)
            finally:
                if on_response is not None:  # no response came (a dropped connection): release anyway
                    on_response()
            report.request(start, time.perf_counter(), None if isinstance(outcome, bytes) else outcome.error)
        return outcome

    async def _attempt_once(
        self, state: _LoopState, path: str, wire: _Wire, model: str | None,
        on_response: Callable[[], None] | None = None,
    ) -> bytes | _FailedAttempt:
        try:
            async with state.limiter:
                status, headers, body = await self._send(state.session, path, wire, on_response)
                # Adjust the limit while this request still holds its slot: a 429
                # lowers it before the slot is freed, so no waiter is admitted
                # under the old limit.
                if 200 <= status < 300:
                    state.limiter.on_success()
                elif status == 429:
                    self._overloaded(state)
        except TRANSIENT_ERRORS as exc:
            reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return _FailedAttempt(reason, self._error(reason, path, model, retryable=True))
        except aiohttp.ClientError as exc:
            reason = f"{type(exc).__name__}: {exc}"
            return _FailedAttempt(reason, self._error(reason, path, model))
        except urls.RedirectRefused as exc:
            return _FailedAttempt(str(exc), self._error(str(exc), path, model, status=exc.status))
        if 200 <= status < 300:
            return body
        retryable = retry.should_retry(status, headers)
        reason = f"HTTP {status}"
        error = self._error(reason, path, model, status=status, body=body, retryable=retryable)
        return _FailedAttempt(reason, error, retry.parse_retry_after(headers))

    def _overloaded(self, state: _LoopState) -> None:
        before = state.limiter.limit
        state.limiter.on_overload()
        if state.limiter.limit < before:
            logger.debug("%s answered 429: at most %d requests in flight for now", self.base_url, state.limiter.limit)

    async def _send(
        self, session: aiohttp.ClientSession, path: str, wire: _Wire, on_response: Callable[[], None] | None = None
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request, following its 307/308 redirects (``urls.redirect_target``) itself.

        aiohttp would forward every header but ``Authorization`` to another
        host: the credentials and the user's headers go only to the base URL's origin.
        ``on_response`` is called once the final answer's status and headers are in.
        """
        headers = {name: value.reveal() for name, value in self._headers.items()}
        headers.update(self.static_headers)
        if self._api_key is not None:
            name, template = self.key_header
            headers[name] = template.format(key=self._api_key.reveal())
        if wire.content_type:
            headers["Content-Type"] = wire.content_type
        url = start = yarl.URL(self.base_url + path)
        for _ in range(urls.MAX_REDIRECTS + 1):
            async with session.request(wire.method, url, json=wire.payload, data=wire.data, headers=headers,
                                       allow_redirects=False) as response:
                if response.status not in urls.REDIRECTS:
                    if on_response is not None:  # status and headers are here; the body may take a while yet
                        on_response()
                    return response.status, response.headers, await response.read()
                location = response.headers.get("Location")
            target = urls.redirect_target(response.status, url, location)
            if not urls.same_origin(start, target):
                # and never back: a later hop to the first origin goes without them too
                headers = dict(self.static_headers)  # not secret (an API version): kept
                if wire.content_type:
                    headers["Content-Type"] = wire.content_type
                self._said_once(start, target)
            url = target
        last = f"more than {urls.MAX_REDIRECTS} redirects; the last one to {urls.redact(str(url))}"
        raise urls.RedirectRefused(last, response.status)

    def _said_once(self, start: yarl.URL, target: yarl.URL) -> None:
        pair = (str(start.origin()), str(target.origin()))
        if pair not in self._redirects_said:
            self._redirects_said.add(pair)
            logger.warning("%s redirects to another origin, %s: following it without the API key or any extra "
                           "header (set base_url to the new address if it needs them)", *pair)

    async def _throttle(self, tokens: float) -> None:
        if self.rpm is not None:
            await self.rpm.acquire(1, sleep=sleep)
        if self.tpm is not None and tokens > 0:
            await self.tpm.acquire(tokens, sleep=sleep)

    def json_object(self, body: bytes, path: str, model: str | None = None) -> dict[str, Any]:
        """The JSON object a 2xx ``body`` from ``path`` holds; a ``BackendError`` (not retryable) otherwise."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            raise self._error("malformed JSON in response", path, model, status=200, body=body) from None
        if not isinstance(data, dict):
            raise self._error("response is not a JSON object", path, model, status=200, body=body)
        return data

    def _decode(self, body: bytes, path: str, model: str | None, tokens: float, report: BatchReport) -> dict[str, Any]:
        data = self.json_object(body, path, model)
        used = wire_usage(data.get("usage"))
        if used is not None:
            report.usage(*used)
            if self.tpm is not None:
                self.tpm.refund(min(tokens, self.tpm.capacity) - used.prompt - used.completion)
        return data

    def _error(
        self,
        message: str,
        path: str,
        model: str | None,
        *,
        status: int | None = None,
        body: bytes | str | None = None,
        retryable: bool = False,
    ) -> BackendError:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        return BackendError(
            self.redact(message),
            status=status,
            body=self.redact(text[:400]) if text else None,
            endpoint=self.base_url + path,
            model=model,
            retryable=retryable,
        )


async def gather_or_cancel(awaitables: Iterable[Awaitable[T]]) -> list[T]:
    """Like ``asyncio.gather``, but the first failure cancels the others.

    Raises
    ------
    Exception
        The first exception raised by any of ``awaitables``.
    """
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    for task in tasks:
        # Siblings that fail too, or fail while we are cancelled, must not log
        # "Task exception was never retrieved" from a garbage collection.
        task.add_done_callback(_retrieve)
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        await _cancel(tasks)
    first = next((t.exception() for t in tasks if not t.cancelled() and t.exception() is not None), None)
    if first is not None:
        raise first
    return [task.result() for task in tasks]


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _cancel(tasks: Iterable[asyncio.Future[Any]]) -> None:
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
