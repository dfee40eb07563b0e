"""Anthropic's Message Batches as a ``JobClient``: one JSON request, results as JSONL.

``POST /v1/messages/batches`` takes the requests themselves (``custom_id``
and the Messages API ``params`` of each); ``GET /v1/messages/batches/{id}``
reads its ``processing_status`` (``in_progress``, ``canceling``, ``ended``)
and ``request_counts``; once it has ended, its ``results_url`` serves one
JSON line per request: ``succeeded`` (with the message), ``errored``,
``canceled`` or ``expired``. ``GET /v1/messages/batches?limit=&after_id=``
lists the workspace's batches (newest first), ``POST .../{id}/cancel``
cancels one. A line is one draw: the API has no ``n``.

A batch carries no metadata, so a batch created by a process that died
before recording its id is never taken on its size alone (``find``): a
batch of that many requests created since the intent, that the ledger does
not already hold, is ours only when its results (readable once it has
ended) name exactly our ``custom_ids``, which are our draw keys. While such
batches still run they cannot be told from a stranger's: ``find`` raises
``JobInDoubt`` naming them, and the runtime waits for them to end before it
looks again. ``jobs_of`` reads the ended batches the same way.
"""
from __future__ import annotations

import datetime
import json
from typing import Any, Iterable, Mapping, Sequence

import yarl

from outlines.backends.anthropic import AnthropicBackend
from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw
from outlines.backends.jobs.base import JobInDoubt, JobLimits, JobLine, JobStatus, LineResult
from outlines.backends.jobs.wire import CLOCK_SKEW, WireJobs, jsonl, mapping, number, path_segment
from outlines.backends.usage import WireUsage, wire_usage

__all__ = ["AnthropicJobs"]

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
PATH = "/v1/messages/batches"
#: Anthropic's error types, as the HTTP statuses they stand for (for the retry rules).
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
#: Bytes of the envelope around the requests: ``{"requests":[`` and ``]}``.
ENVELOPE = len(b'{"requests":[]}')


class AnthropicJobs(WireJobs):
    """Message Batches for an ``AnthropicBackend`` (its base URL, key and retries).

    Parameters
    ----------
    backend
        The backend whose draws the batches answer.
    max_requests, max_bytes
        Requests and bytes per batch (the provider's limits by default:
        100,000 requests, 256 MB).

    Examples
    --------
    >>> AnthropicJobs(AnthropicBackend("claude-haiku-4-5", api_key="sk-ant-x")).limits.requests
    100000
    """

    provider = "anthropic"
    jobs_path = PATH
    cursor = "after_id"

    def __init__(self, backend: AnthropicBackend, *, max_requests: int = MAX_REQUESTS,
                 max_bytes: int = MAX_BYTES) -> None:
        super().__init__(backend, JobLimits(max_requests, max_bytes, ENVELOPE))
        self.backend: AnthropicBackend = backend

    def lines(
        self, draws: Sequence[Draw], keys: Sequence[bytes], report: BatchReport | None = None
    ) -> list[JobLine]:
        """One line per distinct draw, its ``params`` the live request's body."""
        hex_keys = [key.hex() for key in keys]
        positions: dict[str, list[int]] = {}
        for position, key in enumerate(hex_keys):
            positions.setdefault(key, []).append(position)
        out = []
        for key, where in positions.items():
            draw = draws[where[0]]
            try:
                record = {"custom_id": key, "params": self.backend.request_body(draw)}
                out.append(self.line((key,), record, draw.prompt))
            except BackendError as error:  # this draw fails alone
                if report is None:
                    raise
                for position in where:
                    report.failure(position, error)
        return out

    async def create(
        self, lines: Sequence[JobLine], metadata: Mapping[str, str], report: BatchReport | None = None
    ) -> JobStatus:
        """Send ``lines`` as one batch; ``metadata`` only helps ``find`` (batches carry none)."""
        report = report or BatchReport()
        body = b'{"requests":[' + b",".join(line.data for line in lines) + b"]}"
        self.check(lines, len(body))
        return await self.start(lines, metadata, report, data=body)

    def parse(self, data: Mapping[str, Any]) -> JobStatus:
        job_id, processing = data.get("id"), data.get("processing_status")
        if not isinstance(job_id, str) or processing not in ("in_progress", "canceling", "ended"):
            raise self.backend.malformed("a message batch needs a string 'id' and a known 'processing_status'",
                                         data, PATH)
        counts = mapping(data, "request_counts")
        done = {name: number(counts, name) for name in ("processing", "succeeded", "errored", "canceled", "expired")}
        if processing == "in_progress":
            state = "in_progress"
        elif processing == "canceling":
            state = "cancelling"
        elif data.get("cancel_initiated_at"):
            state = "cancelled"
        else:
            state = "expired" if done["expired"] else "completed"
        results = data.get("results_url")
        if not isinstance(results, str) and processing == "ended":
            results = ""  # an ended batch without its URL: its results are still at the documented path
        return JobStatus(
            id=job_id, state=state, total=sum(done.values()), succeeded=done["succeeded"],
            failed=done["errored"] + done["canceled"] + done["expired"], created_at=_timestamp(data.get("created_at")),
            results=(self._results_path(job_id, results),) if isinstance(results, str) else (),
        )

    def _results_path(self, job_id: str, url: str) -> str:
        # The key goes only to our own base URL: a results_url elsewhere is read
        # at the documented path here instead.
        own, given = yarl.URL(self.backend.base_url), yarl.URL(url)
        if given.is_absolute() and given.origin() == own.origin() and given.path.startswith(own.path.rstrip("/")):
            return given.path[len(own.path.rstrip("/")):] + (f"?{given.query_string}" if given.query_string else "")
        return f"{PATH}/{path_segment(job_id)}/results"

    async def results(
        self, status: JobStatus, samples: Mapping[str, int], report: BatchReport | None = None
    ) -> list[LineResult]:
        """Read the results of an ended batch; see ``JobClient.results``."""
        report = report or BatchReport()
        if not status.finished or not status.results:
            raise BackendError(f"message batch {status.id} has not ended (it is {status.state})",
                               endpoint=self.backend.base_url + PATH, model=self.backend.model)
        content = await self.client.request("GET", status.results[0], report)
        found: dict[str, LineResult] = {}
        for custom_id, record in jsonl(content, f"message batch {status.id}", self.client):
            found[custom_id] = self._line(custom_id, record, report)
        return list(found.values())

    def _line(self, custom_id: str, record: Mapping[str, Any], report: BatchReport) -> LineResult:
        result = record.get("result")
        kind = result.get("type") if isinstance(result, dict) else None
        if kind in ("canceled", "expired"):
            return LineResult(custom_id, "cancelled" if kind == "canceled" else "expired")
        if kind == "errored":
            wrapper = result.get("error") if isinstance(result, dict) else None
            detail = wrapper.get("error", wrapper) if isinstance(wrapper, dict) else None
            if not isinstance(detail, dict):
                return self.line_error(custom_id, None, f"errored without an error: {json.dumps(record)[:200]}")
            status = ERROR_STATUS.get(str(detail.get("type")))
            return self.line_error(custom_id, status, f"{detail.get('type')}: {detail.get('message')}")
        message = result.get("message") if isinstance(result, dict) else None
        if kind != "succeeded" or not isinstance(message, dict):
            return self.line_error(custom_id, 200, f"malformed result {json.dumps(record)[:200]}", retryable=False)
        used = wire_usage(message.get("usage")) or WireUsage(0, 0)
        report.usage(*used)
        try:
            text = self.backend.text_of(message)
        except BackendError as error:
            return LineResult(custom_id, "errored", error=error)
        return LineResult(custom_id, "succeeded", (text,), usage=used)

    async def find(
        self, metadata: Mapping[str, str], requests: int, since: float, *, exclude: Iterable[str] = (),
        custom_ids: Iterable[str] = (), report: BatchReport | None = None,
    ) -> JobStatus | None:
        """The batch of ``requests`` requests since ``since`` whose results name exactly ``custom_ids``.

        Raises
        ------
        JobInDoubt
            When no ended batch is ours but batches of that size still run
            (they cannot be read yet), or ``custom_ids`` are not given.
        """
        ours = frozenset(custom_ids)
        candidates = [s for s in await self._recent(since, exclude, report) if s.total == requests]
        running = []
        for status in sorted(candidates, key=lambda s: s.created_at):
            if not status.finished or not ours:
                running.append(status)
            elif status.results and await self._custom_ids(status, report) == ours:
                return status
        if not running:
            return None
        names = ", ".join(s.id for s in running)
        raise JobInDoubt(
            f"anthropic message batch(es) {names} of {requests} request(s), created since the job was meant to "
            f"be, may be the one whose answer was lost; batches carry no metadata, so they are told apart by "
            f"their results once they end. Nothing is sent again meanwhile: run again once they have ended",
            [s.id for s in running], endpoint=self.backend.base_url + PATH, model=self.backend.model)

    async def jobs_of(
        self, run: str, since: float, lines: Sequence[JobLine], *, exclude: Iterable[str] = (),
        report: BatchReport | None = None,
    ) -> list[tuple[JobStatus, list[JobLine]]]:
        """The ended batches since ``since`` whose results name some of ``lines``' ``custom_ids``.

        Batches carry no metadata (``run`` cannot be checked), but a line's
        ``custom_id`` is its whole draw's key: a batch naming it asked for it.
        Batches still running cannot be read yet, nor larger ones be ours.
        """
        found = []
        for status in await self._recent(since, exclude, report):
            if status.finished and status.results and status.total <= len(lines):
                try:
                    named = await self._custom_ids(status, report)
                except BackendError:  # results gone (archived, deleted) or unreadable: nothing to tell by
                    continue
                held = [line for line in lines if line.custom_id in named]
                if held:
                    found.append((status, held))
        return found

    async def _recent(self, since: float, exclude: Iterable[str], report: BatchReport | None) -> list[JobStatus]:
        """The batches created since ``since`` (allowing for skew), newest first, but those in ``exclude``."""
        excluded = set(exclude)
        out: list[JobStatus] = []
        after = None
        while True:
            statuses, after = await self.page(after, report=report)
            out += [s for s in statuses if s.id not in excluded and s.created_at >= since - CLOCK_SKEW]
            if after is None or all(s.created_at < since - CLOCK_SKEW for s in statuses):
                return out

    async def _custom_ids(self, status: JobStatus, report: BatchReport | None) -> frozenset[str]:
        content = await self.client.request("GET", status.results[0], report or BatchReport())
        return frozenset(custom_id for custom_id, _ in jsonl(content, f"message batch {status.id}", self.client))


def _timestamp(value: Any) -> float:
    """Seconds since the epoch of an RFC 3339 time (0 when absent or unreadable)."""
    if not isinstance(value, str):
        return 0.0
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.timestamp()
