"""OpenAI-compatible backends: chat completions and legacy completions.

Both speak JSON through ``http.HTTPClient``. Draws of one prompt are grouped
and sampled with ``n`` (at most ``MAX_N``); each group (chat) or list of
groups (completions: choice ``i`` belongs to prompt ``i // n``) is its own
request, reported to the batch's ``BatchReport`` as soon as it answers, and a
failed request fails only its own draws. Servers that refuse lists of prompts
(``transformers serve``: "prompt must be a string") or ignore ``n`` are
remembered per base URL (``backends.quirks``, in the cache file too), said
once in a log line and served one prompt, or one sample, per request; the one
answer of a server that ignored ``n`` is kept as the first sample.

The fields follow OpenAI's published spec (``openai/openai-openapi``); the
``dialect`` says what else a server speaks (``DIALECTS``). A field a server
may not know is learnt only from a probe (``_OpenAIBackend._probe``), noted
for the model in ``backends.quirks``.

Seeds: a group whose first draw number is ``d`` is sent with ``seed + d``
(sample ``j`` of a split group: ``+ j`` more), so draws fetched later or
separately are fresh samples, not replays; the spec marks chat's ``seed``
deprecated but takes it. Prompt cache: requests sharing a head of 1,024+
tokens go leader first (``backends.warmup``), and the cached part of each
prompt (``usage.prompt_tokens_details.cached_tokens``) reaches the report.
"""
from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import yarl

from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Constraint, Draw, GenerationParams
from outlines.backends import quirks
from outlines.backends.hosted import HostedBackend, check_range
from outlines.backends.http import gather_or_cancel
from outlines.backends.warmup import Turn, joined
from outlines.common.conversation import messages_of

__all__ = ["OpenAIChatBackend", "OpenAICompletionBackend", "PromptSamples", "sample_groups"]

logger = logging.getLogger("outlines.backends.openai")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: OpenAI's own API: it answers 401 to every request without a key (none is sent to it), and it
#: speaks the published spec and nothing else (``dialect="openai"``).
OPENAI_HOSTS = ("api.openai.com",)
#: ``"openai"``: the spec's fields only; ``"compatible"``: also the fields of vLLM and SGLang (``guided_*``).
DIALECTS = ("openai", "compatible")
#: Model names that reason (o-series, GPT-5 and later, with or without a ``provider/`` prefix): they
#: refuse ``max_tokens`` ("not compatible with o-series models", the spec), so never get it.
REASONING_MODELS = re.compile(r"^(?:[\w.-]+/)?(?:o\d|gpt-(?:[5-9]|\d{2,}))(?!\d)")
#: Settings reasoning models take only at their default ("Only the default (1) value is supported"); the
#: chat snapshots of the GPT-5 family (``gpt-5-chat-latest``) do not reason and take any.
REASONING_DEFAULTS = {"temperature": 1, "top_p": 1}
#: Reasoning models that refuse ``stop`` (the spec: "Not supported with latest reasoning models o3 and o4-mini").
NO_STOP_MODELS = re.compile(r"^(?:[\w.-]+/)?(?:o3|o4-mini)")
#: Base URLs whose completions endpoint refuses a list of prompts / ignores ``n``.
LISTS_REFUSED = quirks.Quirk(quirks.REFUSES_LISTS)
N_IGNORED = quirks.Quirk(quirks.IGNORES_N)
#: The most samples (``n``) one request may ask (OpenAI's spec: ``n`` is 1 to 128).
MAX_N = 128
#: The most stop sequences a request may carry (the spec's ``StopConfiguration``).
MAX_STOPS = 4
#: Documented ranges of the numeric parameters (``ModelResponseProperties``, ``CreateChatCompletionRequest``).
RANGES = {"temperature": (0, 2), "top_p": (0, 1), "presence_penalty": (-2, 2), "frequency_penalty": (-2, 2)}
#: The fields ``wire_constraint`` may send.
CONSTRAINT_FIELDS = ("response_format", "guided_choice", "guided_regex", "guided_json")
#: A probe's value of each field a server may not know (``quirks.FIELDS``): valid wherever the field is.
PROBES: dict[str, Any] = {
    "max_completion_tokens": 16,
    "response_format": {"type": "json_schema", "json_schema": {"name": "probe", "strict": True, "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}}},
    "guided_choice": ["OK"],
    "guided_regex": "OK",
    "guided_json": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
}
#: Probes in flight, shared by the requests of one loop that wait for the same answer.
_probing: dict[tuple[int, str, str], asyncio.Future[bool | None]] = {}
#: How servers word "send one prompt, not a list": transformers serve says
#: "prompt must be a string."; others name the type they wanted or got.
_LIST_REFUSAL = re.compile(
    r"prompt\W.{0,60}\b(strings?|str|lists?|arrays?|type)\b|\b(lists?|arrays?)\b.{0,60}\bprompt", re.IGNORECASE | re.DOTALL
)


class PromptSamples(NamedTuple):
    """Draws of one prompt in one ``generate`` call, sampled together with ``n``."""

    params: GenerationParams
    prompt: str
    n: int


#: Called with a group's position and its samples as soon as they arrive.
GroupDone = Callable[[int, list[str]], None]
#: Called with a group's position and the error of its request.
GroupFailed = Callable[[int, Exception], None]


class _NIgnored(Exception):
    """The server answered one choice per prompt although ``n > 1`` was asked: ``choices``, in prompt order."""

    def __init__(self, choices: list[Any]) -> None:
        super().__init__("the server ignored n")
        self.choices = choices


class _OpenAIBackend(HostedBackend):
    """What both OpenAI backends share: the service, grouping draws into requests, the client."""

    path = ""
    generation_extras = frozenset({"logit_bias", "presence_penalty", "frequency_penalty"})
    default_base_url = DEFAULT_BASE_URL
    base_url_env = "OPENAI_BASE_URL"
    api_key_env = "OPENAI_API_KEY"

    def _speak(self, dialect: str | None) -> None:
        """Set ``dialect`` (``None``: by host) and whether the model reasons; called by each constructor."""
        if dialect is None:
            dialect = "openai" if yarl.URL(self.base_url).host in OPENAI_HOSTS else "compatible"
        elif dialect not in DIALECTS:
            raise ValueError(f"{self.kind}({self.model!r}): dialect must be one of {', '.join(DIALECTS)}, "
                             f"got {dialect!r}")
        self.dialect = dialect
        self.reasoning = REASONING_MODELS.match(self.model) is not None

    def requests_for(self, draws: Sequence[Draw]) -> int:
        """Requests of one call: one per prompt and its samples, one per sample where ``n`` is ignored."""
        groups, _ = sample_groups(draws)
        ignores_n = quirks.IGNORES_N in self.known_quirks
        return sum(group.n if ignores_n else 1 for group in groups)

    def check_params(self, params: GenerationParams) -> None:
        """Refuse what the spec refuses: outside ``RANGES``, over ``MAX_STOPS``, ``REASONING_DEFAULTS`` changed
        on a reasoning model (not its ``-chat`` snapshots), ``stop`` on ``NO_STOP_MODELS``."""
        values = {"temperature": params.temperature, "top_p": params.top_p, **dict(params.extra)}
        if self.reasoning and "-chat" not in self.model:
            for name, default in REASONING_DEFAULTS.items():
                value = values.get(name)
                if value is not None and value != default:
                    raise ValueError(f"{name} must be {default} for {self.model} (OpenAI's reasoning models, o-series "
                                     f"and GPT-5, take only the default), got {value!r}")
        for name, (low, high) in RANGES.items():
            value = values.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                check_range(name, value, low, high, "OpenAI")
        if params.stop and NO_STOP_MODELS.match(self.model):
            raise ValueError(f"stop is not supported by {self.model} (OpenAI's spec: not by o3 and o4-mini)")
        if len(params.stop) > MAX_STOPS:
            raise ValueError(f"stop takes at most {MAX_STOPS} sequences for OpenAI (its API's documented limit), "
                             f"got {len(params.stop)}")

    @property
    def known_quirks(self) -> frozenset[str]:
        """What is known of this backend's server and model (``outlines.backends.quirks.known``)."""
        return quirks.known(self.base_url) | quirks.known(self.scope)

    @property
    def scope(self) -> str:
        """Where this backend's field quirks hold: its model at its server (``quirks.scope``)."""
        return quirks.scope(self.base_url, self.model)

    @property
    def refused_fields(self) -> frozenset[str]:
        """The request fields a probe found this server refuses for this model."""
        known = quirks.known(self.scope)
        return frozenset(field for field in quirks.FIELDS if quirks.refuses(field) in known)

    @property
    def tokens_field(self) -> str:
        """The field that bounds a completion: the spec's ``max_completion_tokens`` for chat, unless a
        compatible server refused it for a model that is not a reasoning model (then ``max_tokens``);
        ``max_tokens`` for ``/completions``."""
        if self.kind != "openai" or ("max_completion_tokens" in self.refused_fields and self._may_drop_tokens_field):
            return "max_tokens"
        return "max_completion_tokens"

    @property
    def _may_drop_tokens_field(self) -> bool:
        # OpenAI's API and reasoning models take only max_completion_tokens: never probed, never dropped.
        return self.kind == "openai" and self.dialect == "compatible" and not self.reasoning

    def constraint_field(self, constraint: Constraint, *, job: bool = False) -> str | None:
        """The field ``wire_constraint`` sends ``constraint`` in to this server, as things stand (``None``: none).

        ``job``: in a batch job's line, which carries the spec's fields only
        (``request_body(spec=True)``): ``response_format`` on chat, none on
        ``/completions``.
        """
        fields = (wire_constraint(constraint, chat=self.kind == "openai", dialect="openai") if job else
                  wire_constraint(constraint, chat=self.kind == "openai", dialect=self.dialect,
                                  refused=self.refused_fields))
        return next(iter(fields), None)

    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        if not self._has_key and yarl.URL(self.base_url).host in OPENAI_HOSTS:
            raise self._key_error(None)  # every request would be refused: none is sent, none retried
        groups, members = sample_groups(draws)
        out: list[str] = [""] * len(draws)
        errors: list[Exception] = []

        def done(position: int, samples: list[str]) -> None:
            # Each draw is handed to the scheduler as soon as its request is
            # done, so it is cached even if a sibling request fails later.
            for k, index in enumerate(members[position]):
                out[index] = samples[k % len(samples)]
                report.result(index, out[index])

        def failed(position: int, error: Exception) -> None:
            errors.append(error)
            for index in members[position]:
                report.failure(index, error)

        await self._sample_groups(groups, report, done, failed)
        if errors:
            raise errors[0]  # every draw is reported: this only tells direct callers
        return out

    async def _sample_groups(
        self, groups: list[PromptSamples], report: BatchReport, done: GroupDone, failed: GroupFailed
    ) -> None:
        """``group.n`` samples per group: ``done(i, samples)`` or ``failed(i, error)`` as each ends."""
        raise NotImplementedError

    def _payload(self, params: GenerationParams, n: int, spec: bool, **fields: Any) -> dict[str, Any]:
        """A request's body; ``spec``: the spec's fields only, whatever the server is known to take."""
        payload: dict[str, Any] = {"model": self.model, **fields, **params.to_dict()}
        payload.pop("constraint", None)
        tokens_field = ("max_completion_tokens" if self.kind == "openai" else "max_tokens") if spec else self.tokens_field
        if "max_tokens" in payload and tokens_field != "max_tokens":
            payload[tokens_field] = payload.pop("max_tokens")
        if params.constraint is not None:
            payload.update(wire_constraint(params.constraint, chat=self.kind == "openai",
                                           dialect="openai" if spec else self.dialect,
                                           refused=frozenset() if spec else self.refused_fields))
        if n > 1:
            payload["n"] = n
        return payload

    async def _post(
        self, build: Callable[[], dict[str, Any]], report: BatchReport, tokens: float,
        on_response: Callable[[], None] | None = None,
    ) -> Any:
        """POST the body ``build()`` makes, settling a refusal that names one of its fields.

        The field is probed (``_probe``): refused there too, the server does
        not know it (noted), and the body is built again in the form the
        server takes; taken there, the refusal was this request's own: a
        constraint's form is left out (the text is checked instead, said in
        a log line), anything else fails the request.
        """
        payload = build()
        for _ in range(len(quirks.FIELDS) + 1):  # each pass notes a new quirk or drops the constraint: bounded
            try:
                return await self.client.post_json(self.path, payload, report, tokens=tokens, on_response=on_response)
            except BackendError as error:
                if error.status == 401:
                    raise self._key_error(error) from None
                field = self._named_field(error, payload)
                if field is None:
                    raise
                taken = await self._probe(field, report)
                if taken is False:
                    payload = build()
                elif taken and field in CONSTRAINT_FIELDS:
                    logger.warning("%s refused this request's %s (%s); sending it without, checking the text instead",
                                   self.base_url, field, self.redact(error.body or ""))
                    payload = {k: v for k, v in payload.items() if k not in CONSTRAINT_FIELDS}
                else:
                    raise
        raise BackendError("the server kept refusing the request's fields", endpoint=self.base_url + self.path,
                           model=self.model)

    def _named_field(self, error: BackendError, payload: Mapping[str, Any]) -> str | None:
        """The probe-able field of ``payload`` a 400/422 names, if any."""
        if error.status not in (400, 422) or not error.body:
            return None
        for field in quirks.FIELDS:
            if field in payload and field in error.body:
                if field == "max_completion_tokens" and not self._may_drop_tokens_field:
                    continue  # the spec's field: a refusal of it is the request's
                return field
        return None

    async def _probe(self, field: str, report: BatchReport) -> bool | None:
        """Whether the server takes ``field`` for this model: ``True``, ``False`` (noted), ``None`` when unsure.

        Asked once per process per model and field (requests refused together
        wait for one probe): a request that carries nothing but the field,
        with a value valid wherever the field is known (``PROBES``).
        """
        where = self.scope
        if quirks.accepts(where, field):
            return True
        if field in self.refused_fields:
            return False
        key = (id(asyncio.get_running_loop()), where, field)
        running = _probing.get(key)
        if running is None:
            running = _probing[key] = asyncio.ensure_future(self._ask(field, report))
            running.add_done_callback(lambda _: _probing.pop(key, None))
        return await asyncio.shield(running)

    async def _ask(self, field: str, report: BatchReport) -> bool | None:
        prompt: dict[str, Any] = (
            {"messages": [{"role": "user", "content": "Say OK."}]} if self.kind == "openai" else {"prompt": "OK"}
        )
        tokens = {} if field == "max_completion_tokens" else {self.tokens_field: PROBES["max_completion_tokens"]}
        body = {"model": self.model, **prompt, **tokens, field: PROBES[field]}
        try:
            await self.client.post_json(self.path, body, report, tokens=32)
        except BackendError as error:
            if error.status in (400, 422) and field in (error.body or ""):
                if quirks.note(self.scope, quirks.refuses(field)):
                    instead = "sending max_tokens" if field == "max_completion_tokens" else "checking outputs instead"
                    logger.warning("%s refuses %s for %s; %s", self.base_url, field, self.model, instead)
                    await quirks.remember(self.scope, quirks.refuses(field))
                return False
            return None  # refused for another reason, or unreachable: nothing learned
        quirks.note_accepted(self.scope, field)
        return True

    def _key_error(self, refused: BackendError | None) -> BackendError:
        """Why the server wants a key, naming where to give one (401s are never retried)."""
        constructor = "models.openai" if self.kind == "openai" else "models.openai_completion"
        where = f"set OPENAI_API_KEY or pass api_key= to {constructor}({self.model!r}, ...)"
        if refused is None:
            message = f"no API key for {self.base_url}: {where}"
        elif self._has_key:
            message = f"the server refused the API key (HTTP 401): check OPENAI_API_KEY or api_key= of {constructor}"
        else:
            message = f"the server wants an API key (HTTP 401) and none was given: {where}"
        return BackendError(message, status=None if refused is None else 401, body=None if refused is None else
                            refused.body, endpoint=self.base_url + self.path, model=self.model)

    def _tokens(self, prompts: Sequence[str], params: GenerationParams, n: int) -> float:
        """A rough token estimate for the ``tpm`` budget (4 characters a token)."""
        return sum(len(p) for p in prompts) / 4 + (params.max_tokens or 256) * n * len(prompts)

    def request_body(self, group: PromptSamples, *, spec: bool = False) -> dict[str, Any]:
        """The JSON body of one request for ``group.n`` samples of ``group.prompt`` (live, or a job's line).

        ``spec``: the published spec's fields only (``dialect="openai"``,
        ``max_completion_tokens`` on chat, nothing a probe learnt): a job's
        line, which cannot be probed, and whose API is OpenAI's spec.
        """
        raise NotImplementedError

    def group_texts(self, data: Mapping[str, Any], n: int) -> list[str]:
        """The ``n`` texts of the answer ``data`` to ``request_body`` of one group."""
        raise NotImplementedError

    def _choices(self, data: Mapping[str, Any], expected: int, n: int) -> list[Any]:
        """The choices ordered by index, checked for count; ``_NIgnored`` when ``n`` was dropped."""
        choices = data.get("choices")
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            raise self.malformed("response has no list of 'choices'", data, self.path)
        if n > 1 and len(choices) == expected // n:
            raise _NIgnored(_in_order(choices))
        if len(choices) != expected:
            raise self.malformed(f"expected {expected} choices, got {len(choices)}", data, self.path)
        return _in_order(choices)

    async def _note_once(self, quirk: quirks.Quirk, message: str) -> None:
        if quirk.add(self.base_url):
            logger.warning("%s %s", self.base_url, message)
            await quirks.remember(self.base_url, quirk.name)


class OpenAICompletionBackend(_OpenAIBackend):
    """Legacy ``/completions``: many prompts per request, ``n`` samples each.

    Takes the options of ``hosted.HostedBackend`` (defaults: ``max_batch`` 128
    draws per request, whole prompts with all their samples, a prompt with
    more samples going in pieces of ``max_batch``, each with its own seed;
    ``max_concurrency`` 32 requests in flight, lowered for a while after a
    429; ``max_retries`` 3; ``timeout`` 600 s, ``connect_timeout`` 10 s,
    ``total_timeout`` ``None``; ``max_retry_after`` 60 s) and ``dialect``:
    ``"openai"`` (the spec's fields only) or ``"compatible"`` (also vLLM's and
    SGLang's ``guided_*``); default by host: ``"openai"`` for ``api.openai.com``.

    Examples
    --------
    >>> backend = OpenAICompletionBackend("tiny", base_url="http://127.0.0.1:8000/v1", api_key="sk-x")
    >>> backend
    OpenAICompletionBackend('tiny', 'http://127.0.0.1:8000/v1')
    """

    kind = "openai_completion"
    path = "/completions"

    def requests_for(self, draws: Sequence[Draw]) -> int:
        """One request per list of prompts asking the same ``n``; see ``_OpenAIBackend.requests_for``."""
        lists: dict[tuple[GenerationParams, int], int] = {}  # (params, n) -> prompts in that list
        for group in sample_groups(draws)[0]:
            lists[group.params, group.n] = lists.get((group.params, group.n), 0) + 1  # the buckets of _sample_groups
        known = self.known_quirks
        per_prompt, per_sample = quirks.REFUSES_LISTS in known, quirks.IGNORES_N in known
        return sum((prompts if per_prompt else 1) * (n if per_sample else 1) for (_, n), prompts in lists.items())

    def __init__(self, model: str, *, max_batch: int | None = 128, dialect: str | None = None, **options: Any) -> None:
        super().__init__(model, max_batch=max_batch, **options)
        self._speak(dialect)

    async def _sample_groups(
        self, groups: list[PromptSamples], report: BatchReport, done: GroupDone, failed: GroupFailed
    ) -> None:
        # Prompts that need the same number of samples, and wait for the same
        # leader of a shared head (``backends.warmup``), share one request.
        turns = self.warmup_turns([g.prompt for g in groups])
        buckets: dict[tuple[GenerationParams, int, int], list[int]] = {}
        for position, group in enumerate(groups):
            after = turns[position].after
            buckets.setdefault((group.params, group.n, 0 if after is None else id(after)), []).append(position)

        async def job(params: GenerationParams, n: int, positions: list[int]) -> None:
            leaders = [turns[p] for p in positions if turns[p].lead is not None]

            def started() -> None:
                for turn in leaders:
                    turn.started()

            try:
                await turns[positions[0]].ready()  # the bucket's members follow one leader, or none
                samples = await self._complete([groups[p].prompt for p in positions], params, n, report, started)
            except Exception as error:  # noqa: BLE001 - fails this request's draws only
                for position in positions:
                    failed(position, error)
                return
            finally:
                started()  # a leader that never got a response still releases its followers
            for position, sample in zip(positions, samples):
                done(position, sample)

        async with self.opening_connections([turns[positions[0]] for positions in buckets.values()]):
            await asyncio.gather(*(job(params, n, positions) for (params, n, _), positions in buckets.items()))

    async def _complete(
        self, prompts: list[str], params: GenerationParams, n: int, report: BatchReport,
        on_response: Callable[[], None] | None = None,
    ) -> list[list[str]]:
        if len(prompts) > 1 and self.base_url not in LISTS_REFUSED:
            try:
                return await self._request(prompts, params, n, report, on_response)
            except BackendError as error:
                if not _refuses_lists(error):
                    raise
                await self._note_once(LISTS_REFUSED, "refuses a list of prompts; sending one prompt per request")
        rows = await gather_or_cancel(self._request([p], params, n, report, on_response) for p in prompts)
        return [row[0] for row in rows]

    async def _request(
        self, prompts: list[str], params: GenerationParams, n: int, report: BatchReport,
        on_response: Callable[[], None] | None = None,
    ) -> list[list[str]]:
        """``n`` samples of each prompt, in as few requests as the server allows."""
        if n > 1 and self.base_url in N_IGNORED:
            return await self._per_sample(prompts, params, n, report, on_response=on_response)
        prompt: str | list[str] = prompts[0] if len(prompts) == 1 else prompts
        data = await self._post(lambda: self._payload(params, n, False, prompt=prompt), report,
                                self._tokens(prompts, params, n), on_response)
        try:
            choices = self._choices(data, len(prompts) * n, n)
        except _NIgnored as ignored:
            await self._note_once(N_IGNORED, "ignores n; sending one request per sample")
            first = [self._text(choice, data) for choice in ignored.choices]  # each prompt's sample 0: kept
            rest = await self._per_sample(prompts, params, n, report, start=1, on_response=on_response)
            return [[text, *more] for text, more in zip(first, rest)]
        texts = [self._text(choice, data) for choice in choices]
        return [texts[i * n : (i + 1) * n] for i in range(len(prompts))]

    def request_body(self, group: PromptSamples, *, spec: bool = False) -> dict[str, Any]:
        return self._payload(group.params, group.n, spec, prompt=group.prompt)

    def group_texts(self, data: Mapping[str, Any], n: int) -> list[str]:
        return [self._text(choice, data) for choice in self._choices(data, n, n)]

    async def _per_sample(
        self, prompts: list[str], params: GenerationParams, n: int, report: BatchReport, start: int = 0,
        on_response: Callable[[], None] | None = None,
    ) -> list[list[str]]:
        """Samples ``start`` to ``n - 1`` of each prompt, one request per sample (sample ``j``: seed ``+ j``)."""
        columns = await gather_or_cancel(
            self._request(prompts, _offset_seed(params, j), 1, report, on_response) for j in range(start, n)
        )
        return [[column[i][0] for column in columns] for i in range(len(prompts))]

    def _text(self, choice: Mapping[str, Any], data: Any) -> str:
        text = choice.get("text")
        if not isinstance(text, str):
            raise self.malformed("a choice has no 'text' string", data, self.path)
        return text


class OpenAIChatBackend(_OpenAIBackend):
    """Chat ``/chat/completions``: one request per prompt, ``n`` samples each.

    Takes the options of ``OpenAICompletionBackend`` (``max_batch`` default
    16 draws per ``generate`` call) and ``system_prompt``, a system message
    sent before each prompt (part of the identity: it changes the outputs).

    Examples
    --------
    >>> OpenAIChatBackend("gpt-4o-mini", api_key="sk-x", system_prompt="Be brief.").identity
    ('openai', 'gpt-4o-mini', 'https://api.openai.com/v1', 'Be brief.')
    """

    kind = "openai"
    path = "/chat/completions"

    def __init__(
        self, model: str, *, system_prompt: str | None = None, max_batch: int | None = 16, dialect: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(model, max_batch=max_batch, **options)
        self._speak(dialect)
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a string, got {type(system_prompt).__name__}")
        self.system_prompt = system_prompt

    @property
    def identity(self) -> tuple[Any, ...]:
        return (self.kind, self.model, self.base_url, self.system_prompt)

    def render_prompt(self, prompt: str) -> list[dict[str, Any]]:
        """The ``messages`` sent for ``prompt`` (the server applies its chat template to them)."""
        return messages_of(prompt, self.system_prompt)

    def count_tokens(self, prompt: str) -> int:
        """Prompt tokens of one chat request: its messages' contents.

        With a user ``tokenizer`` the contents are summed as they are (the
        tokenizer describes the server); with tiktoken or the estimate,
        OpenAI's chat format adds 3 tokens per message and 3 for the reply.
        """
        messages = messages_of(prompt, self.system_prompt)
        tokens = sum(self._count(str(m.get("content", ""))) for m in messages)
        return tokens if self._user_tokenizer else tokens + 3 * len(messages) + 3

    async def _sample_groups(
        self, groups: list[PromptSamples], report: BatchReport, done: GroupDone, failed: GroupFailed
    ) -> None:
        turns = self.warmup_turns([joined(messages_of(g.prompt, self.system_prompt)) for g in groups])

        async def one(position: int, group: PromptSamples, turn: Turn) -> None:
            try:
                await turn.ready()
                samples = await self._chat(group.prompt, group.params, group.n, report, turn.started)
            except Exception as error:  # noqa: BLE001 - fails this prompt's draws only
                failed(position, error)
                return
            finally:
                turn.started()  # a leader that never got a response still releases its followers
            done(position, samples)

        async with self.opening_connections(turns):
            await asyncio.gather(*(one(i, g, turns[i]) for i, g in enumerate(groups)))

    async def _chat(
        self, prompt: str, params: GenerationParams, n: int, report: BatchReport,
        on_response: Callable[[], None] | None = None,
    ) -> list[str]:
        if n > 1 and self.base_url in N_IGNORED:
            return await self._per_sample(prompt, params, n, report, on_response=on_response)
        group = PromptSamples(params, prompt, n)
        data = await self._post(lambda: self.request_body(group), report, self._tokens([prompt], params, n),
                                on_response)
        try:
            return self.group_texts(data, n)
        except _NIgnored as ignored:
            await self._note_once(N_IGNORED, "ignores n; sending one request per sample")
            first = self._content(ignored.choices[0], data)  # sample 0, asked with the same seed: kept
            return [first, *await self._per_sample(prompt, params, n, report, start=1, on_response=on_response)]

    def request_body(self, group: PromptSamples, *, spec: bool = False) -> dict[str, Any]:
        messages = messages_of(group.prompt, self.system_prompt)  # a Conversation sends its own messages
        return self._payload(group.params, group.n, spec, messages=messages)

    def group_texts(self, data: Mapping[str, Any], n: int) -> list[str]:
        return [self._content(choice, data) for choice in self._choices(data, n, n)]

    async def _per_sample(
        self, prompt: str, params: GenerationParams, n: int, report: BatchReport, start: int = 0,
        on_response: Callable[[], None] | None = None,
    ) -> list[str]:
        """Samples ``start`` to ``n - 1``, one request each (sample ``j``: seed ``+ j``)."""
        rows = await gather_or_cancel(
            self._chat(prompt, _offset_seed(params, j), 1, report, on_response) for j in range(start, n)
        )
        return [row[0] for row in rows]

    def _content(self, choice: Mapping[str, Any], data: Any) -> str:
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str):
            refusal = message.get("refusal") if isinstance(message, dict) else None
            reason = f"the model refused: {refusal!r:.200}" if isinstance(refusal, str) else "no message content"
            raise self.malformed(f"a choice has {reason}", data, self.path)
        return content


def wire_constraint(
    constraint: Constraint, *, chat: bool, dialect: str = "compatible", refused: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The request field asking a server to obey ``constraint``: its first form the server takes, or none.

    The forms, in order: on chat, a schema as the spec's ``response_format``
    (``json_schema``); then, for a ``"compatible"`` server, the guided-decoding
    field of vLLM and SGLang (``guided_choice``, ``guided_regex``,
    ``guided_json``); then, on chat, choices and patterns as
    ``response_format`` too (``Constraint.json_form``: a string ``enum`` or
    ``pattern`` in an object, unwrapped on reading). A form whose field is in
    ``refused`` is passed over. ``strict`` is set where the schema meets
    OpenAI's strict rules (an object root, every object closed, every
    property required). OpenAI's ``/completions`` takes none of these: there
    the text is only checked. Outputs are checked either way
    (``constraints.generate_valid``).

    Examples
    --------
    >>> from outlines.backends.constraints import make_constraint
    >>> wire_constraint(make_constraint(choices=["a", "b"]), chat=True, dialect="compatible")
    {'guided_choice': ['a', 'b']}
    >>> wire_constraint(make_constraint(choices=["a", "b"]), chat=True, dialect="openai")["response_format"]["type"]
    'json_schema'
    >>> wire_constraint(make_constraint(regex="[0-9]+"), chat=False, dialect="openai")
    {}
    """
    schema = constraint.json_form()
    spec: dict[str, Any] = {"name": "output", "schema": schema}
    if _strict_compatible(schema):
        spec["strict"] = True
    response_format = ("response_format", {"type": "json_schema", "json_schema": spec})
    guided = {"choices": ("guided_choice", constraint.choices), "regex": ("guided_regex", constraint.value),
              "json_schema": ("guided_json", constraint.schema)}[constraint.kind]
    forms: list[tuple[str, Any]] = []
    if chat and constraint.kind == "json_schema":
        forms.append(response_format)
    if dialect == "compatible":
        forms.append(guided)
    if chat and constraint.kind != "json_schema":
        forms.append(response_format)
    for field, value in forms:
        if field not in refused:
            return {field: value}
    return {}


def _strict_compatible(schema: Any) -> bool:
    """OpenAI's strict mode: every object closed and every property required."""
    if isinstance(schema, list):
        return all(_strict_compatible(s) for s in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        if schema.get("additionalProperties", True) is not False or set(schema.get("required", [])) != set(properties):
            return False
    return all(_strict_compatible(v) for k, v in schema.items() if k not in ("required", "enum", "const", "default"))


def sample_groups(draws: Sequence[Draw]) -> tuple[list[PromptSamples], list[list[int]]]:
    """The requests a batch of draws needs: one group per (params, prompt), and each group's draw positions.

    A group asks ``n`` samples (one when greedy: every draw is the same
    text; at most ``MAX_N``, the spec's limit, so a prompt with more samples
    is several groups) with the seed shifted by its first draw number
    (``_offset_seed``); the ``k``-th position of a group takes sample ``k``
    (modulo ``n``). Live requests and batch-job lines both come from here.
    """
    by_prompt: dict[tuple[GenerationParams, str], list[int]] = {}
    for index, draw in enumerate(draws):
        by_prompt.setdefault((draw.params, draw.prompt), []).append(index)
    groups, members = [], []
    for (params, prompt), indices in by_prompt.items():
        if params.deterministic:  # greedy draws are all the same text: ask once
            groups.append(PromptSamples(params, prompt, 1))
            members.append(indices)
            continue
        # The spec's most choices of one request: more samples go in pieces, each seeded from its first draw.
        for start in range(0, len(indices), MAX_N):
            piece = indices[start : start + MAX_N]
            first_draw = min(draws[i].draw for i in piece)
            groups.append(PromptSamples(_offset_seed(params, first_draw), prompt, len(piece)))
            members.append(piece)
    return groups, members


def _in_order(choices: list[Any]) -> list[Any]:
    """Choices sorted by their ``index`` when those number them ``0..len-1``, else as sent."""
    indices = [c.get("index") for c in choices]
    if sorted(i if type(i) is int else -1 for i in indices) == list(range(len(choices))):
        return sorted(choices, key=lambda c: c["index"])
    return choices


def _offset_seed(params: GenerationParams, offset: int) -> GenerationParams:
    """Shift a set seed so that draws sent in separate requests stay independent."""
    if params.seed is None or offset == 0:
        return params
    return params.merged(seed=params.seed + offset)


def _refuses_lists(error: BackendError) -> bool:
    """A 4xx that complains about the prompt's type: the server wants a string."""
    if error.status not in (400, 422) or not error.body:
        return False
    return _LIST_REFUSAL.search(error.body) is not None
