"""The fake provider: OpenAI's Batch API and Anthropic's Messages and Message Batches, on 127.0.0.1.

``FakeProvider`` extends ``FakeServer`` with live Anthropic Messages (and
Anthropic's prompt cache: breakpoints written once answered, read within 20
blocks of a breakpoint, heads under ``cache_min_tokens`` never cached), OpenAI
files and batches, and Anthropic message batches (the routes: ``ROUTES``,
``_app``; the states: ``FakeJob.state``, on the server's ``clock``). Requests
are read as the Batch APIs document them; a refused one is answered as the
provider answers it and kept in ``refusals`` (the test suite plugs the
published specs into ``refusal``). ``plan(JobPlan(...))`` scripts the next
jobs, ``script_route`` the next calls of a route; ``counts``, ``submitted``,
``paid()`` and ``stats()`` count what happened.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
import json
import random
import re
import threading
import time
from typing import Any, Awaitable, Callable, Mapping, cast

from aiohttp import web

from outlines.testing._live import OK, Action, FakeServer, Refusal, Stall, anthropic_error, openai_error

__all__ = [
    "ROUTES", "JobFile", "FakeClock", "FakeProvider", "JobPlan", "Lost", "Made", "ScaledClock", "read_anthropic_job",
    "read_openai_job_file",
]

ROUTES = (
    "files.create", "files.content", "batches.create", "batches.list", "batches.get", "batches.cancel",
    "message_batches.create", "message_batches.list", "message_batches.get", "message_batches.results",
    "message_batches.cancel",
)
#: Anthropic's error type for each HTTP status it uses.
ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                    504: "timeout_error", 529: "overloaded_error"}


class FakeClock:
    """Time that moves only when someone sleeps on it (or ``advance``): tests never really wait."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ScaledClock:
    """Real time running ``speed`` times faster (jobs of a client in another process)."""

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed
        self.start, self.origin = time.time(), time.monotonic()

    def time(self) -> float:
        return self.start + (time.monotonic() - self.origin) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)


@dataclasses.dataclass(frozen=True)
class Lost(Action):
    """Do what was asked (create the job...), then drop the connection: the client never hears of it."""

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        raise AssertionError("FakeProvider runs the route's handler first")


@dataclasses.dataclass(frozen=True)
class Made(Action):
    """Do what was asked (create the job...), then answer with ``answer`` (a 200 with an error body...)."""

    answer: Action = Action()

    async def respond(self, server: FakeServer, request: web.Request, body: Any) -> web.StreamResponse:
        raise AssertionError("FakeProvider runs the route's handler first")


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """How one job of a ``FakeProvider`` goes: ``provider.plan(JobPlan(...), ...)`` sets the next jobs'.

    ``None`` timings take the provider's. ``fail``: the job fails validation
    with this reason (OpenAI: ``failed``; Anthropic: the create answers 400).
    ``errors``: ``{custom_id: HTTP status}`` lines answered with that error
    (its text ``message``). ``malformed``: that many result lines cut in the
    middle. ``unreadable``: ``"empty"`` results, or ``"absent"`` (no output
    file, no ``results_url``). ``counts=False``: the job reports no request
    counts. ``expire_s`` before the job ends: it expires, keeping the lines
    done before.
    """

    validate_s: float | None = None
    run_s: float | None = None
    finalize_s: float | None = None
    expire_s: float | None = None
    fail: str | None = None
    errors: Mapping[str, int] = dataclasses.field(default_factory=dict)
    malformed: int = 0
    #: The message of the scripted error lines (default ``scripted {status}``): one echoing a key, say.
    message: str | None = None
    unreadable: str | None = None  # "empty" or "absent": results that cannot be read
    counts: bool = True  # False: the job reports no request counts


@dataclasses.dataclass
class Line:
    """One request of a job and, once run, its answer ``(status, body)``."""

    custom_id: str
    body: Any
    url: str = ""
    answer: tuple[int, Any] | None = None


@dataclasses.dataclass
class FakeJob:
    """One job: its lines, its plan with timings resolved, and what happened to it."""

    id: str
    protocol: str  # "openai" or "anthropic"
    created: float
    lines: list[Line]
    plan: JobPlan
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)
    endpoint: str = ""
    input_file_id: str = ""
    cancelled_at: float | None = None
    failure: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    results: bytes | None = None

    # -- the timeline ----------------------------------------------------------------
    @property
    def started(self) -> float:
        return self.created + float(self.plan.validate_s or 0)

    @property
    def processed(self) -> float:
        return self.started + float(self.plan.run_s or 0)

    @property
    def completes(self) -> float:
        return self.processed + float(self.plan.finalize_s or 0)

    def expires(self) -> float | None:
        if self.plan.expire_s is None:
            return None
        at = self.created + self.plan.expire_s
        return at if at < self.completes else None

    def state(self, now: float, cancel_s: float) -> str:
        if self.failure is not None:
            return "validating" if now < self.started else "failed"
        expires = self.expires()
        if self.cancelled_at is not None and (expires is None or self.cancelled_at < expires):
            return "cancelling" if now < self.cancelled_at + cancel_s else "cancelled"
        if expires is not None and now >= expires:
            return "expired"
        if now < self.started:
            return "validating"
        if now < self.processed:
            return "in_progress"
        return "finalizing" if now < self.completes else "completed"

    def done_at(self, index: int) -> float:
        return self.started + float(self.plan.run_s or 0) * (index + 1) / len(self.lines)

    def cutoff(self, now: float) -> float:
        """Lines done by this time have run; later ones never will."""
        if self.failure is not None:
            return float("-inf")
        stops = [now, self.processed]
        if self.cancelled_at is not None:
            stops.append(self.cancelled_at)
        expires = self.expires()
        if expires is not None:
            stops.append(expires)
        return min(stops)

    def done(self, now: float) -> list[int]:
        cutoff = self.cutoff(now)
        return [i for i in range(len(self.lines)) if self.done_at(i) <= cutoff]


class FakeProvider(FakeServer):
    """A fake of OpenAI's and Anthropic's APIs, batch jobs included, serving on 127.0.0.1.

    It runs an aiohttp server in a background thread, so a plain script, a
    notebook or a test talks to it as to a provider: give a model its
    ``base_url`` (OpenAI) or ``anthropic_url`` (Anthropic) and any API key.
    Live requests are answered at once; a batch job goes through the
    providers' states on the fake's clock, ``speed`` times faster than real
    time. Each line is answered once by ``reply`` (default: the prompt and
    the sample's index, ``"<prompt>#0"``).

    Parameters
    ----------
    clock
        The jobs' time (default: ``ScaledClock(speed)``).
    speed
        How much faster than real time the default clock runs: at the
        default timings (7 seconds a job), ``speed=100`` finishes a job in
        0.07 s of real time.
    validate_s, run_s, finalize_s, cancel_s, expire_s
        Default timings of a job, in the clock's seconds (``expire_s=None``:
        jobs never expire); ``plan`` sets them per job.
    shuffle
        Write results in a shuffled order (seeded by the job's id), as the
        providers may.
    openai_limits, anthropic_limits
        ``(requests, bytes)`` a job may hold (the providers': 50,000 and
        200 MB, 100,000 and 256 MB).
    cache_min_tokens
        The shortest head Anthropic's prompt cache takes (1,024 for most models).
    **options
        The live answers': ``reply`` (``(prompt, sample, body) -> str``),
        ``latency`` (seconds), ``tokenizer`` (``text -> tokens``),
        ``honour_constraints`` (answer a JSON schema with an instance of it),
        ``record`` (keep every live request in ``requests``).

    Attributes
    ----------
    base_url, anthropic_url
        Where OpenAI's clients and Anthropic's clients send their requests.
    count
        Live requests answered (chat, completions, messages).
    counts
        Calls of each batch route (``ROUTES``): ``counts["batches.create"]``
        is the jobs created at OpenAI, ``counts["message_batches.create"]``
        at Anthropic.
    submitted
        How many times each ``custom_id`` was sent in a job.
    jobs
        The jobs by id.
    refusals
        The requests the fake refused, and why.

    Examples
    --------
    >>> import outlines
    >>> from outlines import models
    >>> from outlines.backends.jobs import Backoff
    >>> from outlines.testing import FakeProvider
    >>> fast = outlines.Jobs(backoff=Backoff(first=0.01, cap=0.05))  # poll often: a job takes 7 ms here
    >>> with FakeProvider(speed=1000, reply=lambda prompt, sample, body: prompt.upper()) as provider:
    ...     llm = models.openai("gpt-4o-mini", base_url=provider.base_url, api_key="sk-fake", max_tokens=8)
    ...     word = outlines.string("word")
    ...     answers = outlines.eval(llm("say " + word), givens={word: ["yes", "no"]}, jobs=fast)
    ...     stats = provider.stats()
    >>> answers.tolist()
    ['SAY YES', 'SAY NO']
    >>> stats["jobs"], stats["paid"], stats["live"]
    (1, 2, 0)
    """

    def __init__(
        self,
        *,
        clock: Any = None,
        speed: float = 1.0,
        validate_s: float = 1.0,
        run_s: float = 5.0,
        finalize_s: float = 1.0,
        cancel_s: float = 1.0,
        expire_s: float | None = None,
        shuffle: bool = True,
        openai_limits: tuple[int, int] = (50_000, 200 * 1024 * 1024),
        anthropic_limits: tuple[int, int] = (100_000, 256 * 1024 * 1024),
        cache_min_tokens: int = 1024,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.cache_min_tokens = cache_min_tokens
        self.clock = clock if clock is not None else ScaledClock(speed)
        self.defaults = JobPlan(validate_s, run_s, finalize_s, expire_s)
        self.cancel_s = cancel_s
        self.shuffle = shuffle
        self.openai_limits = openai_limits
        self.anthropic_limits = anthropic_limits
        self.counts: collections.Counter[str] = collections.Counter()
        self.submitted: collections.Counter[str] = collections.Counter()
        self.jobs: dict[str, FakeJob] = {}
        self.deleted: list[FakeJob] = []
        self.files: dict[str, bytes] = {}
        self._plans: collections.deque[JobPlan] = collections.deque()
        self._route_scripts: dict[str, collections.deque[Action]] = collections.defaultdict(collections.deque)
        self._ids = 0
        self._answering = threading.RLock()  # each line is answered once, whoever asks first

    @property
    def anthropic_url(self) -> str:
        """The base URL for Anthropic's clients (``models.anthropic(..., base_url=...)``)."""
        return f"http://127.0.0.1:{self.port}"

    # -- knobs ---------------------------------------------------------------------------
    def plan(self, *plans: JobPlan) -> None:
        """How the next jobs go, one plan per job created, in order."""
        with self._lock:
            self._plans.extend(plans)

    def script_route(self, route: str, *actions: Action) -> None:
        """Answer the next calls of ``route`` (one of ``ROUTES``) with these actions."""
        if route not in ROUTES:
            raise ValueError(f"unknown route {route!r}; one of {ROUTES}")
        with self._lock:
            self._route_scripts[route].extend(actions)

    def paid(self) -> collections.Counter[str]:
        """Lines answered successfully so far, by ``custom_id`` (what the provider bills)."""
        now = self.clock.time()
        paid: collections.Counter[str] = collections.Counter()
        with self._lock:
            jobs = list(self.jobs.values()) + self.deleted
        for job in jobs:
            for index in job.done(now):
                status, _ = self._answer(job, index)
                if 200 <= status < 300:
                    paid[job.lines[index].custom_id] += 1
        return paid

    def job(self, job_id: str) -> FakeJob:
        """The job ``job_id``: its lines, plan and timeline."""
        return self.jobs[job_id]

    def stats(self) -> dict[str, Any]:
        """What happened so far, as numbers: live requests, route calls, lines sent and paid, jobs.

        ``paid_twice`` lists the ``custom_id`` of every line answered in more
        than one job (a client that paid for something twice).
        """
        paid = self.paid()
        with self._lock:
            return {"live": self.count, "counts": dict(self.counts), "submitted": sum(self.submitted.values()),
                    "paid": sum(paid.values()), "paid_twice": sorted(k for k, v in paid.items() if v > 1),
                    "jobs": len(self.jobs)}

    def delete(self, job_id: str) -> None:
        """Forget a job, as a provider that deleted it: every request about it answers 404 (it stays paid)."""
        with self._lock:
            self.deleted.append(self.jobs.pop(job_id))

    # -- live Anthropic ------------------------------------------------------------------
    def answer(self, request: Any, body: Any) -> web.Response:
        """The live answer to ``body``: Anthropic's for ``/v1/messages``, else OpenAI's."""
        if request.path.endswith("/v1/messages"):
            problem = _auth(request.headers, "anthropic")
            status, data = problem if problem is not None else self.anthropic_answer(body, self.seen(request))
            return web.json_response(data, status=status)
        return super().answer(request, body)

    def refusal(self, route: str, body: Any, custom_id: str | None = None) -> Refusal | None:
        """Why the provider refuses ``body`` sent to ``route`` (a line ``custom_id`` of a job), if it does.

        Here: what the fake needs to run a request (an upload's form, a job's
        endpoint and metadata, a message's shape); a subclass checks more.
        """
        if route == "/v1/files":
            return _upload_refusal(body)
        if route == "/v1/batches":
            return _job_create_refusal(body)
        if route.endswith("/v1/messages"):
            return _message_refusal(body, custom_id)
        return super().refusal(route, body, custom_id)

    def refused(self, refusal: Refusal) -> web.Response:
        """Record ``refusal`` and answer it as its provider does."""
        if refusal.route.startswith("/v1/messages"):
            self.keep(refusal)
            return web.json_response(anthropic_error(refusal), status=refusal.status)
        return super().refused(refusal)

    def anthropic_answer(self, body: Any, seen: frozenset[Any] | None = None) -> tuple[int, dict[str, Any]]:
        """``(status, body)`` the Messages API gives a valid ``body`` (``refusal``); ``seen``: the cache when it arrived."""
        parts = [(role, _text_blocks(content)) for role, content in
                 ([("system", body["system"])] if "system" in body else [])
                 + [(m["role"], m["content"]) for m in body["messages"]]]
        users = ["".join(b["text"] for b in blocks) for role, blocks in parts if role == "user"]
        prompt = users[-1] if users else ""
        text = self.reply(prompt, 0, body)
        reason, matched = "end_turn", None
        for stop in body.get("stop_sequences") or []:
            if stop in text:
                text, reason, matched = text[: text.index(stop)], "stop_sequence", stop
        prompt_tokens = sum(self.billed(b["text"]) for _, blocks in parts for b in blocks)
        completion_tokens = 1 if self.tokenizer is None else self.billed(text)
        read, written = self._anthropic_cache(body["model"], parts, seen)
        with self._lock:
            self._ids += 1
            number = self._ids
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += read
        return 200, {
            "id": f"msg_fake{number:06d}", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": reason, "stop_sequence": matched,
            "usage": {"input_tokens": prompt_tokens - read - written, "output_tokens": completion_tokens,
                      "cache_creation_input_tokens": written, "cache_read_input_tokens": read},
        }

    def _anthropic_cache(
        self, model: str, parts: list[tuple[str, list[dict[str, Any]]]], seen: frozenset[Any] | None
    ) -> tuple[int, int]:
        """``(tokens read, tokens written)`` of the prompt cache for one answered request.

        The head up to a block boundary is read if a request answered before
        this one arrived (``seen``) wrote it, looking back at most 20 blocks from each breakpoint; the head up to
        each breakpoint past what was read is written, if long enough.
        """
        stream: list[Any] = []
        ends: list[int] = []  # token position after each block
        marks: list[int] = []  # block indices with cache_control
        for position, (role, blocks) in enumerate(parts):
            for block in blocks:
                tokens = self.tokens(block["text"])
                if tokens is None or not self.prompt_cache:
                    return 0, 0
                stream.extend((position, role, token) for token in tokens)
                if "cache_control" in block:
                    marks.append(len(ends))
                ends.append(len(stream))
        if not marks:
            return 0, 0

        def key(length: int) -> tuple[str, int]:
            return "anthropic:" + model, hash(tuple(stream[:length]))

        looked = {ends[i] for mark in marks for i in range(max(0, mark - 19), mark + 1)}
        with self._lock:
            heads = self.cached_heads if seen is None else seen
            read = max((end for end in looked if end >= self.cache_min_tokens and key(end) in heads), default=0)
            written = 0
            for mark in marks:
                end = ends[mark]
                if end > read and end >= self.cache_min_tokens:
                    self.cached_heads.add(key(end))
                    written = end - read
        return read, written

    # -- serving ---------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = super()._app()
        app.router.add_post("/v1/messages", self._handle)
        routes: list[tuple[str, str, str, Callable[..., Awaitable[web.StreamResponse]]]] = [
            ("POST", "/v1/files", "files.create", self._file_create),
            ("GET", "/v1/files/{id}/content", "files.content", self._file_content),
            ("POST", "/v1/batches", "batches.create", self._openai_job_create),
            ("GET", "/v1/batches", "batches.list", self._openai_job_list),
            ("GET", "/v1/batches/{id}", "batches.get", self._openai_job_get),
            ("POST", "/v1/batches/{id}/cancel", "batches.cancel", self._openai_job_cancel),
            ("POST", "/v1/messages/batches", "message_batches.create", self._anthropic_job_create),
            ("GET", "/v1/messages/batches", "message_batches.list", self._anthropic_job_list),
            ("GET", "/v1/messages/batches/{id}", "message_batches.get", self._anthropic_job_get),
            ("GET", "/v1/messages/batches/{id}/results", "message_batches.results", self._anthropic_job_results),
            ("POST", "/v1/messages/batches/{id}/cancel", "message_batches.cancel", self._anthropic_job_cancel),
        ]
        for method, path, name, handler in routes:
            app.router.add_route(method, path, self._route(name, handler))
        app.router.add_get("/stats/batches", self._job_stats)
        return app

    def _route(self, name: str, handler: Callable[..., Awaitable[web.StreamResponse]]) -> Any:
        protocol = "anthropic" if name.startswith("message_batches") else "openai"

        async def handle(request: web.Request) -> web.StreamResponse:
            with self._lock:
                self.counts[name] += 1
                scripted = self._route_scripts[name]
                action = scripted.popleft() if scripted else None
            problem = _auth(request.headers, protocol)
            if problem is not None:
                return web.json_response(problem[1], status=problem[0])
            if action is not None and action is not OK:
                if isinstance(action, Lost):
                    await handler(request)
                    assert request.transport is not None
                    request.transport.abort()
                    raise asyncio.CancelledError()
                if isinstance(action, Made):
                    await handler(request)
                    return await action.answer.respond(self, request, None)
                if not isinstance(action, Stall):
                    return await action.respond(self, request, None)
                await asyncio.sleep(action.seconds)
            return await handler(request)

        return handle

    def _new_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}{self._ids:06d}"

    def _next_plan(self) -> JobPlan:
        with self._lock:
            plan = self._plans.popleft() if self._plans else JobPlan()
        defaults = self.defaults
        return dataclasses.replace(
            plan,
            validate_s=defaults.validate_s if plan.validate_s is None else plan.validate_s,
            run_s=defaults.run_s if plan.run_s is None else plan.run_s,
            finalize_s=defaults.finalize_s if plan.finalize_s is None else plan.finalize_s,
            expire_s=defaults.expire_s if plan.expire_s is None else plan.expire_s,
        )

    def _answer(self, job: FakeJob, index: int) -> tuple[int, Any]:
        """Line ``index``'s answer, made once (a reply with side effects runs once per line)."""
        line = job.lines[index]
        with self._answering:
            if line.answer is None:
                scripted = job.plan.errors.get(line.custom_id)
                message = job.plan.message or f"scripted {scripted}"
                if scripted is not None and job.protocol == "anthropic":
                    kind = ANTHROPIC_ERRORS.get(scripted, "api_error")
                    line.answer = (scripted, {"type": "error", "error": {"type": kind, "message": message}})
                elif scripted is not None:
                    line.answer = (scripted, {"error": {"message": message, "type": "server_error"}})
                elif job.protocol == "anthropic":
                    line.answer = self.anthropic_answer(line.body)
                else:
                    response = super().answer(_Path(line.url), line.body)
                    line.answer = (response.status, json.loads(cast(bytes, response.body)))  # a JSON response's body: bytes
            return line.answer

    def _register(self, job: FakeJob) -> None:
        with self._lock:
            self.jobs[job.id] = job
            self.submitted.update(line.custom_id for line in job.lines)

    # -- OpenAI files and batches ------------------------------------------------------------
    async def _file_create(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        fields = {name: value.file.read() if isinstance(value, web.FileField) else value for name, value in form.items()}
        refusal = self.refusal("/v1/files", fields)
        if refusal is not None:
            return self.refused(refusal)
        upload, content = form["file"], fields["file"]
        assert isinstance(upload, web.FileField) and isinstance(content, bytes)
        file_id = self._new_id("file-fake")
        with self._lock:
            self.files[file_id] = content
        return web.json_response({"id": file_id, "object": "file", "bytes": len(content), "purpose": "batch",
                                  "created_at": int(self.clock.time()), "filename": upload.filename,
                                  "status": "processed", "expires_at": None})

    async def _file_content(self, request: web.Request) -> web.StreamResponse:
        content = self.files.get(request.match_info["id"])
        if content is None:
            return _openai_error(404, f"No such File object: {request.match_info['id']}")
        return web.Response(body=content, content_type="application/octet-stream")

    async def _openai_job_create(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        refusal = self.refusal("/v1/batches", body)
        if refusal is not None:
            return self.refused(refusal)
        content = self.files.get(str(body.get("input_file_id")))
        if content is None:
            return _openai_error(400, f"No such File object: {body.get('input_file_id')}")
        endpoint, metadata = body["endpoint"], body.get("metadata") or {}
        plan = self._next_plan()
        lines, failure = self._openai_lines(content, endpoint)
        job = FakeJob(self._new_id("batch_fake"), "openai", self.clock.time(), lines, plan, dict(metadata),
                      endpoint, str(body["input_file_id"]))
        job.failure = plan.fail or failure
        if job.failure is not None:
            job.lines = []  # nothing of a job that fails validation runs
        self._register(job)
        return web.json_response(self._openai_job(job))

    async def _openai_job_get(self, request: web.Request) -> web.StreamResponse:
        job = self.jobs.get(request.match_info["id"])
        if job is None or job.protocol != "openai":
            return _openai_error(404, f"No batch found with id '{request.match_info['id']}'")
        return web.json_response(self._openai_job(job))

    async def _openai_job_list(self, request: web.Request) -> web.StreamResponse:
        page, more = self._page("openai", request.query.get("after"), int(request.query.get("limit", "20")))
        data = [self._openai_job(job) for job in page]
        return web.json_response({"object": "list", "data": data, "has_more": more,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})

    async def _openai_job_cancel(self, request: web.Request) -> web.StreamResponse:
        job = self.jobs.get(request.match_info["id"])
        if job is None or job.protocol != "openai":
            return _openai_error(404, f"No batch found with id '{request.match_info['id']}'")
        state = job.state(self.clock.time(), self.cancel_s)
        if state in ("completed", "expired", "failed", "cancelled"):
            return _openai_error(400, f"Cannot cancel a batch with status '{state}'.")
        if job.cancelled_at is None:
            job.cancelled_at = self.clock.time()
        return web.json_response(self._openai_job(job))

    def _openai_lines(self, content: bytes, endpoint: str) -> tuple[list[Line], str | None]:
        """The lines of an input file, or why it fails validation; a line whose body is refused answers 400."""
        read = read_openai_job_file(content, endpoint, self.openai_limits, self.refusal)
        if read.failure is not None:
            return [], self.keep(read.failure).message
        lines = []
        for record in read.lines:
            line = Line(record["custom_id"], record["body"], record["url"])
            refused = read.refused.get(line.custom_id)
            if refused is not None:
                line.answer = (refused.status, openai_error(self.keep(refused)))
            lines.append(line)
        return lines, None

    def _openai_job(self, job: FakeJob) -> dict[str, Any]:
        now = self.clock.time()
        state = job.state(now, self.cancel_s)
        done = job.done(now)
        succeeded = sum(1 for i in done if 200 <= self._answer(job, i)[0] < 300)
        failed = len(done) - succeeded
        if state in ("expired", "cancelled"):
            failed = len(job.lines) - succeeded
            self._openai_files(job)
        elif state == "completed":
            self._openai_files(job)
        errors = None
        if job.failure is not None and state == "failed":
            errors = {"object": "list", "data": [{"code": "invalid_request", "message": job.failure, "line": None}]}
        counts = {"total": len(job.lines), "completed": succeeded, "failed": failed}
        absent = job.plan.unreadable == "absent"
        return {
            "id": job.id, "object": "batch", "endpoint": job.endpoint, "errors": errors,
            "input_file_id": job.input_file_id, "completion_window": "24h", "status": state,
            "output_file_id": None if absent else job.output_file_id,
            "error_file_id": None if absent else job.error_file_id,
            "created_at": int(job.created), "metadata": job.metadata,
            "request_counts": counts if job.plan.counts else {"total": 0, "completed": 0, "failed": 0},
        }

    def _openai_files(self, job: FakeJob) -> None:
        """Write a finished job's output and error files (once)."""
        if job.output_file_id is not None or job.error_file_id is not None:
            return
        now = self.clock.time()
        state = job.state(now, self.cancel_s)
        done = set(job.done(now))
        output: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        for index, line in enumerate(job.lines):
            record: dict[str, Any] = {"id": f"batch_req_{job.id}_{index}", "custom_id": line.custom_id}
            if index in done:
                status, body = self._answer(job, index)
                record.update(response={"status_code": status, "request_id": f"req_{index}", "body": body},
                              error=None)
                (output if 200 <= status < 300 else errors).append(record)
            else:
                code = "batch_expired" if state == "expired" else "batch_cancelled"
                record.update(response=None, error={"code": code, "message": f"the batch was {state} first"})
                errors.append(record)
        encoded = [self._encode_results(job, output), self._encode_results(job, errors)]
        with self._lock:
            if output:
                job.output_file_id = self._new_file(encoded[0])
            if errors:
                job.error_file_id = self._new_file(encoded[1])

    def _new_file(self, content: bytes) -> str:
        file_id = f"file-fake-out{len(self.files):06d}"
        self.files[file_id] = content
        return file_id

    def _encode_results(self, job: FakeJob, records: list[dict[str, Any]]) -> bytes:
        if job.plan.unreadable == "empty":
            return b""
        if self.shuffle:
            random.Random(job.id + str(len(records))).shuffle(records)
        lines = [json.dumps(record).encode() for record in records]
        for i in range(min(job.plan.malformed, len(lines))):
            lines[i] = lines[i][: len(lines[i]) // 2]  # cut in the middle: not JSON
        return b"".join(line + b"\n" for line in lines)

    # -- Anthropic message batches ------------------------------------------------------------
    async def _anthropic_job_create(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        refusal, refused = read_anthropic_job(body, self.anthropic_limits, len(raw), self.refusal)
        if refusal is not None:
            return self.refused(refusal)
        plan = self._next_plan()
        if plan.fail is not None:
            return _anthropic_error(400, "invalid_request_error", plan.fail)
        lines = [Line(item["custom_id"], item["params"]) for item in body["requests"]]
        for line in lines:  # params are checked as the batch runs: a refused request ends errored
            if line.custom_id in refused:
                line.answer = (400, anthropic_error(self.keep(refused[line.custom_id])))
        job = FakeJob(self._new_id("msgbatch_fake"), "anthropic", self.clock.time(), lines, plan)
        self._register(job)
        return web.json_response(self._anthropic_job(job))

    async def _anthropic_job_get(self, request: web.Request) -> web.StreamResponse:
        job = self.jobs.get(request.match_info["id"])
        if job is None or job.protocol != "anthropic":
            return _anthropic_error(404, "not_found_error", f"no message batch {request.match_info['id']}")
        return web.json_response(self._anthropic_job(job))

    async def _anthropic_job_list(self, request: web.Request) -> web.StreamResponse:
        page, more = self._page("anthropic", request.query.get("after_id"), int(request.query.get("limit", "20")))
        data = [self._anthropic_job(job) for job in page]
        return web.json_response({"data": data, "has_more": more, "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})

    async def _anthropic_job_cancel(self, request: web.Request) -> web.StreamResponse:
        job = self.jobs.get(request.match_info["id"])
        if job is None or job.protocol != "anthropic":
            return _anthropic_error(404, "not_found_error", f"no message batch {request.match_info['id']}")
        if job.state(self.clock.time(), self.cancel_s) in ("completed", "expired", "cancelled"):
            return _anthropic_error(400, "invalid_request_error", "the batch has ended")
        if job.cancelled_at is None:
            job.cancelled_at = self.clock.time()
        return web.json_response(self._anthropic_job(job))

    async def _anthropic_job_results(self, request: web.Request) -> web.StreamResponse:
        job = self.jobs.get(request.match_info["id"])
        if job is None or job.protocol != "anthropic":
            return _anthropic_error(404, "not_found_error", f"no message batch {request.match_info['id']}")
        now = self.clock.time()
        state = job.state(now, self.cancel_s)
        if state not in ("completed", "expired", "cancelled"):
            return _anthropic_error(400, "invalid_request_error", "the batch has not ended")
        if job.results is None:
            done = set(job.done(now))
            records = []
            for index, line in enumerate(job.lines):
                if index not in done:
                    result: dict[str, Any] = {"type": "expired" if state == "expired" else "canceled"}
                else:
                    status, body = self._answer(job, index)
                    if 200 <= status < 300:
                        result = {"type": "succeeded", "message": body}
                    else:
                        result = {"type": "errored", "error": body}
                records.append({"custom_id": line.custom_id, "result": result})
            job.results = self._encode_results(job, records)
        return web.Response(body=job.results, content_type="application/binary")

    def _anthropic_job(self, job: FakeJob) -> dict[str, Any]:
        now = self.clock.time()
        state = job.state(now, self.cancel_s)
        done = job.done(now)
        succeeded = sum(1 for i in done if 200 <= self._answer(job, i)[0] < 300)
        counts = {"processing": len(job.lines) - len(done), "succeeded": succeeded,
                  "errored": len(done) - succeeded, "canceled": 0, "expired": 0}
        ended = state in ("completed", "expired", "cancelled")
        if ended:
            left = counts["processing"]
            counts["processing"] = 0
            counts["expired" if state == "expired" else "canceled"] = left
        processing = "ended" if ended else "canceling" if state == "cancelling" else "in_progress"
        if not job.plan.counts:
            counts = dict.fromkeys(counts, 0)
        return {
            "id": job.id, "type": "message_batch", "processing_status": processing, "request_counts": counts,
            "created_at": _rfc3339(job.created), "expires_at": _rfc3339(job.created + 86400),
            "ended_at": _rfc3339(now) if ended else None, "archived_at": None,
            "cancel_initiated_at": _rfc3339(job.cancelled_at) if job.cancelled_at is not None else None,
            "results_url": (f"{self.anthropic_url}/v1/messages/batches/{job.id}/results"
                            if ended and job.plan.unreadable != "absent" else None),
        }

    # -- both ----------------------------------------------------------------------------------
    def _page(self, protocol: str, after: str | None, limit: int) -> tuple[list[FakeJob], bool]:
        with self._lock:
            jobs = [job for job in self.jobs.values() if job.protocol == protocol]
        jobs.sort(key=lambda job: (job.created, job.id), reverse=True)  # newest first
        if after is not None:
            ids = [job.id for job in jobs]
            jobs = jobs[ids.index(after) + 1:] if after in ids else []
        return jobs[:limit], len(jobs) > limit

    async def _job_stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())


#: What refuses a body: ``(route, body, custom_id) -> Refusal | None`` (``FakeProvider.refusal``).
Refuse = Callable[[str, Any, "str | None"], "Refusal | None"]
#: An Anthropic ``custom_id`` (the Message Batches API's pattern).
CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: The fields of an input file's line (docs: batch/request-input).
JOB_LINE_FIELDS = ("custom_id", "method", "url", "body")


@dataclasses.dataclass
class JobFile:
    """An input file read as the Batch API reads it: its lines, why the job fails (if it does), each refused body."""

    lines: list[dict[str, Any]]
    failure: Refusal | None = None
    refused: dict[str, Refusal] = dataclasses.field(default_factory=dict)


def _line_problem(record: Any) -> str | None:
    """What breaks the Batch API's line format (``custom_id``, ``method``, ``url``, ``body``), if anything."""
    if not isinstance(record, dict):
        return "Invalid request: the line must be a JSON object."
    missing = [name for name in JOB_LINE_FIELDS if name not in record]
    if missing:
        return f"Invalid request: '{missing[0]}' is a required property"
    extra = sorted(set(record) - set(JOB_LINE_FIELDS))
    if extra:
        return f"Invalid request: Additional properties are not allowed ('{extra[0]}' was unexpected)"
    if not isinstance(record["custom_id"], str) or not record["custom_id"]:
        return "Invalid 'custom_id': a non-empty string is expected"
    if record["method"] != "POST":
        return f"Invalid 'method': 'POST' was expected, not {record['method']!r}"
    if not isinstance(record["url"], str):
        return "Invalid 'url': a string is expected"
    if not isinstance(record["body"], dict):
        return "Invalid 'body': an object is expected"
    return None


def read_openai_job_file(content: bytes, endpoint: str, limits: tuple[int, int],
                           refusal: Refuse | None = None) -> JobFile:
    """Read a batch input file: a format error fails the job, a body ``refusal`` refuses fails its line."""
    route = "batch input file"
    if len(content) > limits[1]:
        return JobFile([], Refusal(route, f"The input file exceeds the maximum size of {limits[1]} bytes."))
    out = JobFile([])
    models: set[str] = set()
    for number, raw in enumerate(content.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except ValueError:
            return JobFile([], Refusal(route, f"Line {number}: the line is not valid JSON."))
        problem = _line_problem(record)
        if problem is not None:
            return JobFile([], Refusal(route, f"Line {number}: {problem}"))
        if any(line["custom_id"] == record["custom_id"] for line in out.lines):
            return JobFile([], Refusal(route, f"Line {number}: the custom_id {record['custom_id']!r} is used"
                                         " more than once; each request needs a unique custom_id."))
        if record["url"] != endpoint:
            return JobFile([], Refusal(route, f"Line {number}: the url {record['url']!r} is not the batch's"
                                         f" endpoint {endpoint!r}."))
        models.add(str(record["body"].get("model")))
        refused = refusal(endpoint, record["body"], record["custom_id"]) if refusal is not None else None
        if refused is not None:
            out.refused[record["custom_id"]] = refused
        out.lines.append(record)
    if len(models) > 1:
        return JobFile([], Refusal(route, f"The input file holds requests for {len(models)} models"
                                     f" ({', '.join(sorted(models))}); a batch's requests all use one model."))
    if not out.lines or len(out.lines) > limits[0]:
        return JobFile([], Refusal(route, f"The input file must hold 1 to {limits[0]} requests, it holds"
                                     f" {len(out.lines)}."))
    return out


def read_anthropic_job(body: Any, limits: tuple[int, int], size: int = 0,
                       refusal: Refuse | None = None) -> tuple[Refusal | None, dict[str, Refusal]]:
    """Why ``POST /v1/messages/batches`` refuses ``body`` (``size``: its bytes), and each request ``refusal`` refuses.

    The envelope is checked at once (a 400); each request's ``params`` when
    the batch runs: such a request ends ``errored``, its siblings run.
    """
    route = "/v1/messages/batches"
    if size > limits[1]:
        return Refusal(route, f"the batch exceeds {limits[1]} bytes", status=413), {}
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not 1 <= len(requests) <= limits[0]:
        return Refusal(route, f"requests: must hold 1 to {limits[0]} requests", "requests"), {}
    unknown = sorted(set(body) - {"requests"})
    if unknown:
        return Refusal(route, f"{unknown[0]}: Extra inputs are not permitted", unknown[0]), {}
    seen: set[str] = set()
    refused: dict[str, Refusal] = {}
    for index, item in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(item, dict):
            return Refusal(route, f"{where}: Input should be an object", where), {}
        extra = sorted(set(item) - {"custom_id", "params"})
        if extra:
            return Refusal(route, f"{where}.{extra[0]}: Extra inputs are not permitted", extra[0]), {}
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID.match(custom_id):
            return Refusal(route, f"{where}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'",
                           "custom_id"), {}
        if custom_id in seen:
            return Refusal(route, f"{where}.custom_id: custom_id {custom_id!r} is not unique in the batch",
                           "custom_id"), {}
        seen.add(custom_id)
        if not isinstance(item.get("params"), dict):
            return Refusal(route, f"{where}.params: Field required", "params"), {}
        found = refusal("/v1/messages", item["params"], custom_id) if refusal is not None else None
        if found is not None:
            refused[custom_id] = found
    return None, refused


def _upload_refusal(fields: Any) -> Refusal | None:
    """Why ``POST /v1/files`` refuses a multipart form (``{name: text, or bytes for a file}``) for a batch."""
    if fields.get("purpose") != "batch":
        return Refusal("/v1/files", f"a batch's input file is uploaded with purpose 'batch', not"
                       f" {fields.get('purpose')!r}", "purpose")
    if not isinstance(fields.get("file"), bytes):
        return Refusal("/v1/files", "'file' must be a file part of the form", "file")
    return None


def _job_create_refusal(body: Any) -> Refusal | None:
    """Why ``POST /v1/batches`` refuses ``body``: what the fake runs, and metadata's documented limits."""
    if not isinstance(body, dict) or not isinstance(body.get("input_file_id"), str):
        return Refusal("/v1/batches", "Missing required parameter: 'input_file_id'.", "input_file_id")
    if body.get("endpoint") not in ("/v1/chat/completions", "/v1/completions"):
        return Refusal("/v1/batches", f"this fake runs jobs of chat and completions only, not {body.get('endpoint')}",
                       "endpoint")
    if body.get("completion_window") != "24h":
        return Refusal("/v1/batches", "Invalid 'completion_window': only '24h' is supported.", "completion_window",
                       code="invalid_value")
    metadata = body.get("metadata") or {}
    # The Metadata schema's description: at most 16 pairs, keys of 64 characters, values of 512.
    if len(metadata) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in metadata.items()):
        return Refusal("/v1/batches", "Invalid 'metadata': at most 16 keys of at most 64 characters, with values"
                       " of at most 512 characters.", "metadata", code="invalid_value")
    return None


def _message_refusal(body: Any, custom_id: str | None) -> Refusal | None:
    """Why the Messages API refuses ``body``, as far as the fake must know to answer it (a model, messages)."""
    route = "/v1/messages"
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return Refusal(route, "model: Field required", "model", custom_id=custom_id)
    if not isinstance(body.get("max_tokens"), int):
        return Refusal(route, "max_tokens: Field required", "max_tokens", custom_id=custom_id)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return Refusal(route, "messages: at least one message is required", "messages", custom_id=custom_id)
    contents = [body["system"]] if "system" in body else []
    contents += [m.get("content") if isinstance(m, dict) else None for m in messages]
    for content in contents:
        blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else None
        if blocks is None or not all(isinstance(b, str) or (isinstance(b, dict) and "type" in b) for b in blocks):
            return Refusal(route, "messages: each content is a string or a list of blocks", "messages",
                           custom_id=custom_id)
    return None


@dataclasses.dataclass(frozen=True)
class _Path:
    """What ``FakeServer.answer`` reads of a request: its path."""

    path: str


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """The text blocks of a (valid) system or message content: a string is one block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [block for block in content if block.get("type") == "text"]


def _auth(headers: Mapping[str, str], protocol: str) -> tuple[int, dict[str, Any]] | None:
    """The 401 (or 400) a provider gives a request without its key (or version header)."""
    if protocol == "anthropic":
        # The key goes in x-api-key, or (anthropic SDK 2.x) as a bearer token.
        if not headers.get("x-api-key") and not str(headers.get("Authorization", "")).startswith("Bearer "):
            return 401, {"type": "error", "error": {"type": "authentication_error", "message": "x-api-key required"}}
        if not headers.get("anthropic-version"):
            return 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                    "message": "anthropic-version header is required"}}
        return None
    if not str(headers.get("Authorization", "")).startswith("Bearer "):
        return 401, {"error": {"message": "You didn't provide an API key.", "type": "invalid_request_error"}}
    return None


def _openai_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def _anthropic_error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


async def _json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        return None


def _rfc3339(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")
