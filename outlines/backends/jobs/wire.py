"""What both providers' job clients share on the wire: paths, paging, cancelling, creating once.

``WireJobs`` is the part of a ``JobClient`` that only differs by names: the
jobs' path and the list's cursor parameter. Status, page and cancel requests
go through the backend's ``http.HTTPClient`` (its base URL, key, retries);
``start`` creates a job without paying twice (``create_once``); ``line``
makes a request's line (or refuses one no job can take), ``line_error`` an
errored line's result. A subclass reads the provider's job object
(``parse``), builds lines, finds lost jobs and reads results. The small
readers here (``jsonl``, ``mapping``, ``number``, ``path_segment``) turn
provider answers into the values of ``jobs.base``, quoting what they cannot
read. Whatever a provider says that is kept or shown (a job's reason, a
line's error) passes the client's ``redact`` where it is read: a key the
provider echoes goes no further.
"""
from __future__ import annotations

import json
import time
from typing import Any, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence

import yarl

from outlines.backends import http
from outlines.backends.base import BackendError, BatchReport
from outlines.backends.hosted import HostedBackend
from outlines.backends.http import HTTPClient
from outlines.backends.jobs.base import JobLimits, JobLine, JobStatus, LineResult
from outlines.backends.retry import retry_delay, should_retry
from outlines.common.labels import shorten

__all__ = ["CLOCK_SKEW", "WireJobs", "create_once", "get_json", "jsonl", "mapping", "number", "path_segment"]


class WireJobs:
    """The requests a job client sends whatever its provider; see the module docstring."""

    provider = ""
    #: Where the jobs are, below the base URL: ``/batches``, ``/v1/messages/batches``.
    jobs_path = ""
    #: The list's cursor parameter: ``after`` (OpenAI), ``after_id`` (Anthropic).
    cursor = ""

    def __init__(self, backend: HostedBackend, limits: JobLimits) -> None:
        self.backend = backend
        self.client = backend.client
        self.limits = limits

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.backend!r})"

    def parse(self, data: Mapping[str, Any]) -> JobStatus:
        """The status a provider's job object says (a ``BackendError`` when it cannot be read)."""
        raise NotImplementedError

    async def find(
        self, metadata: Mapping[str, str], requests: int, since: float, *, exclude: Iterable[str] = (),
        custom_ids: Iterable[str] = (), report: BatchReport | None = None,
    ) -> JobStatus | None:
        raise NotImplementedError

    def line(self, keys: tuple[str, ...], record: Mapping[str, Any], prompt: str) -> JobLine:
        """The line sending ``record`` for the draws of ``keys``, its ``custom_id`` the first.

        Raises
        ------
        BackendError
            Naming ``prompt`` (not retryable), for a request no job can take:
            one holding a lone surrogate (UTF-8 has none: the upload would be
            refused, the whole job with it) or larger than a job may be. The
            caller fails that line's draws alone; the rest of the job goes.
        """
        try:
            data = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        except UnicodeEncodeError:
            at = next((i for i, c in enumerate(prompt) if "\ud800" <= c <= "\udfff"), None)
            where = f"its prompt holds a lone surrogate ({prompt[at]!r} at character {at})" if at is not None \
                else "its request holds a lone surrogate"
            raise BackendError(f"the request for the prompt {shorten(prompt, 30)!r} cannot go in a job: {where}, "
                               "which no provider accepts; fix the text's encoding", retryable=False) from None
        size = len(data) + 1  # its newline (OpenAI's JSONL) or comma (Anthropic's list of requests)
        if size + self.limits.envelope > self.limits.bytes:
            raise BackendError(f"the request for the prompt {shorten(prompt, 30)!r} takes {size} bytes, more than one "
                               f"{self.provider} job may hold ({self.limits.bytes} bytes)", retryable=False)
        return JobLine(keys[0], keys, data, size)

    def check(self, lines: Sequence[JobLine], size: int) -> None:
        """Refuse a job over the limits before anything is sent (``jobs.split`` makes them fit)."""
        if not lines or len(lines) > self.limits.requests or size > self.limits.bytes:
            raise ValueError(f"a job holds 1 to {self.limits.requests} requests and at most {self.limits.bytes} "
                             f"bytes; got {len(lines)} requests, {size} bytes (split them: jobs.split)")

    async def start(
        self, lines: Sequence[JobLine], metadata: Mapping[str, str], report: BatchReport, *,
        payload: Mapping[str, Any] | None = None, data: bytes | None = None,
    ) -> JobStatus:
        """POST the job (a JSON ``payload`` or raw JSON ``data``) once, looking for it before any retry."""
        since = time.time()

        async def send() -> JobStatus:
            answer = await self.client.request("POST", self.jobs_path, report, payload=payload, data=data,
                                               content_type="application/json" if data is not None else None,
                                               retries=0)
            return self.parse(self.client.json_object(answer, self.jobs_path))

        async def look() -> JobStatus | None:
            return await self.find(metadata, len(lines), since, custom_ids=[line.custom_id for line in lines],
                                   report=report)

        return await create_once(send, look, self.client.max_retries)

    async def status(self, job_id: str, report: BatchReport | None = None) -> JobStatus:
        return self.parse(await get_json(self.client, f"{self.jobs_path}/{path_segment(job_id)}", report))

    async def page(
        self, after: str | None = None, limit: int = 100, report: BatchReport | None = None
    ) -> tuple[list[JobStatus], str | None]:
        query = {"limit": str(limit)} | ({self.cursor: after} if after else {})
        data = await get_json(self.client, str(yarl.URL(self.jobs_path).with_query(query)), report)
        items = data.get("data")
        if not isinstance(items, list):
            raise self.backend.malformed("a list of jobs has no 'data' list", data, self.jobs_path)
        statuses = [self.parse(item) for item in items if isinstance(item, dict)]
        more = data.get("has_more") is True and bool(statuses)
        return statuses, (statuses[-1].id if more else None)

    async def cancel(self, job_id: str, report: BatchReport | None = None) -> JobStatus:
        path = f"{self.jobs_path}/{path_segment(job_id)}/cancel"
        answer = await self.client.request("POST", path, report or BatchReport())
        return self.parse(self.client.json_object(answer, path))

    async def aclose(self) -> None:
        await self.backend.aclose()

    def line_error(
        self, custom_id: str, status: int | None, message: str, *, retryable: bool | None = None
    ) -> LineResult:
        """An ``errored`` result, retryable by the shared rules (``retry.should_retry``) unless told.

        ``message`` quotes the provider, who may echo the key ("Incorrect API
        key provided: sk-..."): it is redacted here, where the answer is read,
        so no ledger, cache, ``Failure`` or trace downstream ever holds it.
        """
        if retryable is None:
            retryable = status is not None and should_retry(status)
        error = BackendError(f"request {custom_id} failed in its job: {self.client.redact(message)}", status=status,
                             retryable=retryable)
        return LineResult(custom_id, "errored", error=error)


def jsonl(body: bytes, where: str, client: HTTPClient) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(custom_id, record)`` of each line of a results file.

    Raises
    ------
    BackendError
        For a line that is not a JSON object naming a ``custom_id``, quoting it
        (``client.redact`` hides any secret in it).
    """
    for number, raw in enumerate(body.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):
            record = None
        custom_id = record.get("custom_id") if isinstance(record, dict) else None
        if not isinstance(custom_id, str) or not isinstance(record, dict):
            text = client.redact(raw[:200].decode("utf-8", "replace"))
            raise BackendError(f"malformed line {number} in the results of {where}: {text!r}", status=200)
        yield custom_id, record


#: Seconds a provider's clock may run behind ours when ``find`` compares creation times.
CLOCK_SKEW = 600.0


async def create_once(
    send: Callable[[], Awaitable[JobStatus]], find: Callable[[], Awaitable[JobStatus | None]], retries: int
) -> JobStatus:
    """Create a job with ``send`` (which must not retry), looking with ``find`` before each new try.

    A create that timed out or lost its connection (or answered 5xx) may
    have made the job anyway: sending it again at once could pay twice, so
    the job is looked for first, and only a create that made nothing goes again
    (``retries`` times, with the shared backoff).
    """
    attempt = 0
    while True:
        try:
            return await send()
        except BackendError as error:
            if not error.retryable:
                raise
            found = await find()
            if found is not None:
                return found
            if attempt >= retries:
                raise
        await http.sleep(retry_delay(attempt) or 0.0)
        attempt += 1


async def get_json(client: HTTPClient, path: str, report: BatchReport | None) -> dict[str, Any]:
    """GET ``path`` (retried) and return the JSON object it answers."""
    return client.json_object(await client.request("GET", path, report or BatchReport()), path)


def mapping(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """``data[name]`` when it is a JSON object, else an empty one."""
    value = data.get(name)
    return value if isinstance(value, dict) else {}


def number(data: Mapping[str, Any], name: str) -> int:
    """``data[name]`` when it is an int, else 0 (counts in a provider's answer)."""
    value = data.get(name)
    return value if type(value) is int else 0


def path_segment(identifier: str) -> str:
    """An id as one path segment: a provider's id never holds '/', and a damaged one must not lead elsewhere."""
    if not identifier or any(c in identifier for c in "/?#%\\") or identifier in (".", ".."):
        raise ValueError(f"not a provider id: {identifier!r:.80}")
    return identifier
