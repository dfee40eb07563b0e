"""The live endpoints of the fake provider: OpenAI's chat and completions, on 127.0.0.1.

``FakeServer`` serves ``/v1/completions`` and ``/v1/chat/completions`` from
an aiohttp app on its own event loop in a background thread, so any client
(a plain script, ``asyncio.run``, ``.eval()``) can talk to it. Every request
is recorded and the peak of requests in flight tracked. ``server.script(
Status(429, {...}), OK)`` scripts the next requests; the others are answered
after ``latency`` seconds, echoing the prompt (``"<prompt>#<sample>"``) unless
``reply`` says otherwise. A request ``refusal`` refuses is answered as the
provider answers it and kept in ``refusals``.

Prompt cache: like OpenAI's, the server caches the head of every prompt it
has answered, in heads of 1,024 tokens and then 128-token steps; a prompt
that arrives once a cached head is there, and starts with it, is billed that
head as cached (``usage.prompt_tokens_details.cached_tokens``): requests sent
together all miss, as they do at OpenAI. A prompt's tokens are its words, or
what ``tokenizer`` gives when it returns a list (a count turns the cache off);
chat prompts are their messages' tokens, each tagged with its message's
position and role. ``GET /stats`` (``?reset=1``) reports the counts to a
client in another process.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import threading
import time
from typing import Any, Callable, Mapping, Protocol, Self, Sequence, Union

from aiohttp import web

__all__ = [
    "CACHE_MIN_TOKENS",
    "OK",
    "Action",
    "Close",
    "FakeServer",
    "Malformed",
    "NoChoices",
    "Redirect",
    "Refusal",
    "Stall",
    "Status",
    "Trickle",
    "Truncated",
    "anthropic_error",
    "openai_error",
    "pieces",
    "prompt_of",
]

Reply = Callable[[str, int, Mapping[str, Any]], str]
#: ``text -> tokens``: a count, or the tokens themselves (then the prompt cache works).
Tokenizer = Callable[[str], Union[int, Sequence[Any]]]
#: OpenAI's prompt cache: heads of at least 1,024 tokens, growing by 128.
CACHE_MIN_TOKENS = 1024
CACHE_STEP = 128
#: Where a live request keeps the heads cached when it arrived.
SEEN = web.RequestKey("prompt_cache_seen", frozenset)


def echo(prompt: str, sample: int, body: Mapping[str, Any]) -> str:
    """The default reply: the prompt and the sample's index."""
    return f"{prompt}#{sample}"


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A request the provider refuses: where, why (the provider's message), the field, and the line of a job."""

    route: str
    message: str
    param: str | None = None
    status: int = 400
    code: str | None = None
    custom_id: str | None = None

    def __str__(self) -> str:
        line = f" (line {self.custom_id})" if self.custom_id is not None else ""
        return f"{self.route}{line}: {self.message}"


def openai_error(refusal: Refusal) -> dict[str, Any]:
    """The body OpenAI answers a refused request with."""
    return {"error": {"message": refusal.message, "type": "invalid_request_error", "param": refusal.param,
                      "code": refusal.code}}


def anthropic_error(refusal: Refusal) -> dict[str, Any]:
    """The body Anthropic answers a refused request with."""
    kind = "request_too_large" if refusal.status == 413 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": refusal.message}}


@dataclasses.dataclass(frozen=True)
class Action:
    """Answer normally (the default behaviour)."""

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        return server.answer(request, body)


OK = Action()


@dataclasses.dataclass(frozen=True)
class Status(Action):
    """Answer with this status, headers and body (raw bytes, text, or JSON for other values)."""

    status: int = 500
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    body: Any = None

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        payload = self.body if self.body is not None else {"error": {"message": f"scripted {self.status}"}}
        if isinstance(payload, bytes):
            return web.Response(status=self.status, headers=dict(self.headers), body=payload)
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return web.Response(status=self.status, headers=dict(self.headers), text=text, content_type="application/json")


@dataclasses.dataclass(frozen=True)
class Stall(Action):
    """Wait ``seconds`` before answering (past a client's read timeout)."""

    seconds: float = 5.0

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        await asyncio.sleep(self.seconds)
        return server.answer(request, body)


@dataclasses.dataclass(frozen=True)
class Trickle(Action):
    """A 200 that sends one space every ``interval`` seconds for ``seconds``, then the answer.

    The connection is never idle long enough for a read timeout to fire.
    """

    interval: float = 0.05
    seconds: float = 30.0

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        end = loop.time() + self.seconds
        while loop.time() < end:
            await response.write(b" ")  # JSON allows leading whitespace
            await asyncio.sleep(self.interval)
        full = server.answer(request, body).body
        assert isinstance(full, bytes)
        await response.write(full)
        return response


@dataclasses.dataclass(frozen=True)
class Close(Action):
    """Drop the connection without answering."""

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError()


@dataclasses.dataclass(frozen=True)
class Malformed(Action):
    """A 200 whose body is not JSON (or is ``body`` when given)."""

    body: str = '{"choices": [{"text": "unterminated'

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        return web.Response(status=200, text=self.body, content_type="application/json")


@dataclasses.dataclass(frozen=True)
class NoChoices(Action):
    """A 200 with valid JSON but no ``choices``."""

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        return web.json_response({"id": "x", "object": "text_completion"})


@dataclasses.dataclass(frozen=True)
class Truncated(Action):
    """A 200 that promises more bytes than it sends, then closes."""

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        full = server.answer(request, body).body
        assert isinstance(full, bytes)
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.content_length = len(full)
        await response.prepare(request)
        await response.write(full[: len(full) // 2])
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError()


@dataclasses.dataclass(frozen=True)
class Redirect(Action):
    """Redirect to ``location`` with ``status`` (307 and 308 keep the method and body)."""

    location: str = ""
    status: int = 307

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        return web.Response(status=self.status, headers={"Location": self.location})


@dataclasses.dataclass
class Recorded:
    """One request as the server saw it."""

    path: str
    headers: dict[str, str]
    body: Any
    time: float
    method: str = "POST"


class Asked(Protocol):
    """What ``FakeServer.answer`` reads of a request: its path (an ``aiohttp`` request, or a job's line)."""

    @property
    def path(self) -> str: ...


class FakeServer:
    """An OpenAI-compatible fake server; see the module docstring.

    Parameters
    ----------
    latency
        Seconds each normal answer waits before it is sent.
    refuse_lists
        Answer 400 ``prompt must be a string.`` to a list of prompts, like
        ``transformers serve``.
    ignore_n
        Answer one choice per prompt whatever ``n`` asks.
    reply
        ``(prompt, sample, body) -> str`` making each choice's text.
    honour_constraints
        Answer a request carrying ``response_format`` (json_schema),
        ``guided_json`` or ``guided_choice`` with a text that obeys it (the
        smallest instance of the schema, the first choice) instead of ``reply``.
    record
        Keep every request (turn off for long benchmarks).
    tokenizer
        ``text -> token count`` (or the list of tokens) for the ``usage`` of
        each reply: prompt tokens are the prompts' (every message's content
        for chat), completion tokens the choices'. Default: prompt words, one
        token per choice.
    prompt_cache
        Simulate OpenAI's prompt cache (see the module docstring).
    """

    def __init__(
        self,
        *,
        latency: float = 0.0,
        refuse_lists: bool = False,
        ignore_n: bool = False,
        reply: Reply = echo,
        record: bool = True,
        honour_constraints: bool = False,
        tokenizer: Tokenizer | None = None,
        prompt_cache: bool = True,
    ) -> None:
        #: The requests refused so far, in arrival order (a job's refused lines too).
        self.refusals: list[Refusal] = []
        self.tokenizer = tokenizer
        self.prompt_cache = prompt_cache
        #: Heads answered so far: (model, hash of the head's tokens).
        self.cached_heads: set[tuple[str, int]] = set()
        #: Prompt tokens billed so far, and of those, the cached ones.
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.honour_constraints = honour_constraints
        self.latency = latency
        self.refuse_lists = refuse_lists
        self.ignore_n = ignore_n
        self.reply = reply
        self.record = record
        self.requests: list[Recorded] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.count = 0
        self._script: collections.deque[Action] = collections.deque()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """The base URL for OpenAI's clients (``models.openai(..., base_url=...)``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def refusal(self, route: str, body: Any, custom_id: str | None = None) -> Refusal | None:
        """Why the provider refuses ``body`` sent to ``route`` (a line ``custom_id`` of a job), if it does.

        The fake answers every live body it can read (``answer`` says 400 to
        one without a model); a subclass checks more, as the test suite does
        against the providers' published specs.
        """
        return None

    def keep(self, refusal: Refusal) -> Refusal:
        """Keep ``refusal`` in ``refusals``; return it."""
        with self._lock:
            self.refusals.append(refusal)
        return refusal

    def refused(self, refusal: Refusal) -> web.Response:
        """Record ``refusal`` and answer it as the provider does."""
        self.keep(refusal)
        return web.json_response(openai_error(refusal), status=refusal.status)

    def script(self, *actions: Action) -> None:
        """Queue behaviours for the next requests, in arrival order."""
        with self._lock:
            self._script.extend(actions)

    def reset(self) -> None:
        """Forget recorded requests, peaks, token counts, the prompt cache and any unused script."""
        with self._lock:
            self.requests.clear()
            self._script.clear()
            self.max_in_flight = self.in_flight
            self.count = 0
            self.cached_heads.clear()
            self.prompt_tokens = self.cached_tokens = 0

    def tokens(self, text: str) -> Sequence[Any] | None:
        """The tokens of ``text`` (words by default); ``None`` when the tokenizer only counts."""
        if self.tokenizer is None:
            return text.split()
        tokens = self.tokenizer(text)
        return None if isinstance(tokens, int) else tokens

    def billed(self, text: str) -> int:
        """Tokens ``text`` is billed."""
        if self.tokenizer is None:
            return len(text.split())
        tokens = self.tokenizer(text)
        return tokens if isinstance(tokens, int) else len(tokens)

    def cache_lookup(self, model: str, tokens: Sequence[Any] | None, seen: frozenset[Any] | None = None) -> int:
        """Tokens of ``tokens`` a cached head covers: the longest head an earlier answer stored.

        ``seen``: the heads cached when the request arrived (default: now).
        """
        if not self.prompt_cache or tokens is None:
            return 0
        hit = 0
        with self._lock:
            heads = self.cached_heads if seen is None else seen
            for length, digest in _heads(tokens):
                if (model, digest) not in heads:
                    break
                hit = length
        return hit

    def seen(self, request: Any) -> frozenset[Any] | None:
        """The heads that were cached when ``request`` arrived (``None``: not a live request)."""
        try:
            seen: frozenset[Any] | None = request.get(SEEN)
            return seen
        except AttributeError:
            return None

    def open_connections(self) -> int:
        """TCP connections open to the server now, idle ones included (a client may open them ahead of requests)."""
        if self._loop is None or self._runner is None or self._runner.server is None:
            return 0
        server = self._runner.server

        async def count() -> int:  # on the server's loop: its connection table is not shared with threads
            return len(server.connections)

        return asyncio.run_coroutine_threadsafe(count(), self._loop).result(10)

    def prompts(self) -> list[Any]:
        """The ``prompt`` (or last user message) of every recorded request."""
        return [prompt_of(r.body) for r in self.requests]

    def cache_store(self, model: str, tokens: Sequence[Any] | None) -> None:
        """Cache the heads of an answered prompt (1,024 tokens, then every 128 more)."""
        if not self.prompt_cache or tokens is None:
            return
        heads = {(model, digest) for _, digest in _heads(tokens)}
        with self._lock:
            self.cached_heads |= heads

    # -- serving -------------------------------------------------------------

    def answer(self, request: Asked, body: Any) -> web.Response:
        """The normal answer to a request body."""
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return web.json_response({"error": {"message": "model is required"}}, status=400)
        chat = request.path.endswith("/chat/completions")
        prompt = prompt_of(body)
        if isinstance(prompt, list) and (self.refuse_lists or chat):
            return web.json_response({"detail": "prompt must be a string."}, status=400)
        prompts = prompt if isinstance(prompt, list) else [prompt]
        if not all(isinstance(p, str) for p in prompts):
            return web.json_response({"error": {"message": "bad prompt"}}, status=400)
        n = 1 if self.ignore_n else int(body.get("n", 1))
        choices = []
        for i, text in enumerate(prompts):
            for j in range(n):
                out = self.reply(text, j, body)
                if self.honour_constraints:
                    out = _obeying(body, out)
                choice: dict[str, Any] = {"index": i * n + j, "finish_reason": "stop"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": out}
                else:
                    choice["text"] = out
                choices.append(choice)
        if chat:
            streams: list[Sequence[Any] | None] = [_tagged([(m.get("role"), m["content"]) for m in body["messages"]],
                                                           self.tokens)]
            words = sum(self.billed(m["content"]) for m in body["messages"])
        else:
            streams = [self.tokens(p) for p in prompts]
            words = sum(self.billed(p) for p in prompts)
        if self.tokenizer is None:
            completion = len(choices)
        else:
            completion = sum(self.billed(c["message"]["content"] if chat else c["text"]) for c in choices)
        cached = sum(self.cache_lookup(body["model"], stream, self.seen(request)) for stream in streams)
        for stream in streams:  # answered: its heads are cached for the requests that come after it
            self.cache_store(body["model"], stream)
        with self._lock:
            self.prompt_tokens += words
            self.cached_tokens += cached
        usage = {"prompt_tokens": words, "completion_tokens": completion, "total_tokens": words + completion,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        kind = "chat.completion" if chat else "text_completion"
        return web.json_response(
            {"id": f"fake-{self.count}", "object": kind, "created": int(time.time()), "model": body["model"],
             "choices": choices, "usage": usage}
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        refusal = self.refusal(request.path, body) if request.method == "POST" else None
        with self._lock:
            self.count += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if self.record:
                self.requests.append(
                    Recorded(request.path, dict(request.headers), body, time.monotonic(), request.method)
                )
            if self.prompt_cache:  # what it can read: the heads answered before it arrived
                request[SEEN] = frozenset(self.cached_heads)
            action = self._script.popleft() if self._script and refusal is None else None
        try:
            if refusal is not None:
                return self.refused(refusal)
            if action is not None:
                return await action.respond(self, request, body)
            if self.latency:
                await asyncio.sleep(self.latency)
            return self.answer(request, body)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _app(self) -> web.Application:
        # Providers take large bodies (OpenAI: batch input files up to 200 MB); aiohttp's default is 1 MB.
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/v1/elsewhere/completions", self._handle)
        app.router.add_post("/v1/elsewhere/chat/completions", self._handle)
        # A client that turns a redirected POST into a GET is recorded too (and answered 400).
        for path in ("/v1/completions", "/v1/chat/completions"):
            app.router.add_get(path, self._handle)
        app.router.add_get("/stats", self._stats)
        return app

    async def _stats(self, request: web.Request) -> web.Response:
        """Counts for a client in another process; ``?reset=1`` zeroes them after reading."""
        with self._lock:
            stats = {"count": self.count, "max_in_flight": self.max_in_flight, "prompt_tokens": self.prompt_tokens,
                     "cached_tokens": self.cached_tokens}
        if request.query.get("reset"):
            self.reset()
        return web.json_response(stats)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Self:
        """Serve on a free port of 127.0.0.1 from a background thread."""
        ready = threading.Event()

        def run() -> None:
            loop = self._loop = asyncio.new_event_loop()
            self._runner = web.AppRunner(self._app(), access_log=None, handler_cancellation=True)
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0, backlog=2048)
            loop.run_until_complete(site.start())
            self.port = self._runner.addresses[0][1]
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake provider did not start")
        return self

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def _obeying(body: Mapping[str, Any], text: str) -> str:
    """The text a server that honours the request's constraint would write."""
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        return json.dumps(_instance(response_format["json_schema"]["schema"]))
    if "guided_json" in body:
        return json.dumps(_instance(body["guided_json"]))
    if "guided_choice" in body:
        return str(body["guided_choice"][0])
    return text


def _instance(schema: Any) -> Any:
    """The smallest value following a simple JSON schema (types, enums, required properties)."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {name: _instance(schema["properties"][name]) for name in schema.get("required", [])}
    if kind == "array":
        return [_instance(schema["items"])] * int(schema.get("minItems", 0))
    return {"string": "x" * int(schema.get("minLength", 1)), "integer": 0, "number": 0.5, "boolean": True,
            "null": None}[kind]


def _heads(tokens: Sequence[Any]) -> list[tuple[int, int]]:
    """``(length, digest)`` of each head OpenAI may cache: 1,024 tokens, then every 128 more (chained hashes)."""
    if len(tokens) < CACHE_MIN_TOKENS:
        return []
    digest = hash(tuple(tokens[:CACHE_MIN_TOKENS]))
    out = [(CACHE_MIN_TOKENS, digest)]
    for length in range(CACHE_MIN_TOKENS + CACHE_STEP, len(tokens) + 1, CACHE_STEP):
        digest = hash((digest, tuple(tokens[length - CACHE_STEP : length])))
        out.append((length, digest))
    return out


def pieces(text: str, size: int = 4) -> list[str]:
    """``text`` cut into pieces of ``size`` characters: tokens as ``usage.estimate_tokens`` counts them."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tagged(parts: Sequence[tuple[Any, str]], tokens: Callable[[str], Sequence[Any] | None]) -> list[Any] | None:
    """The tokens of a chat prompt's messages in order, each tagged with its message's position and role."""
    out: list[Any] = []
    for position, (role, content) in enumerate(parts):
        found = tokens(content)
        if found is None:
            return None
        out.extend((position, role, token) for token in found)
    return out


def prompt_of(body: Any) -> Any:
    """The ``prompt`` of a completions body, or the last user message of a chat body."""
    if not isinstance(body, dict):
        return None
    if "messages" in body:
        users = [m.get("content") for m in body["messages"] if isinstance(m, dict) and m.get("role") == "user"]
        return users[-1] if users else None
    return body.get("prompt")
