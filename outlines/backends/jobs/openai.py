"""OpenAI's Batch API as a ``JobClient``: a JSONL file of requests, one job, two result files.

A job is made in two steps: ``POST /files`` uploads the lines (multipart,
``purpose=batch``), ``POST /batches`` starts the job on that file (its
``endpoint``, ``completion_window`` "24h" and ``metadata`` naming the run).
``GET /batches/{id}`` reads its status; once it has finished, the output and
error files (``GET /files/{id}/content``) hold one JSON line per request,
in any order, each naming its ``custom_id``. ``GET /batches?limit=&after=``
lists the account's jobs (newest first) and ``POST /batches/{id}/cancel``
cancels one. A job's metadata names its run and intent, and its input file
(``input_file_id``) lists its requests: ``find`` and ``jobs_of`` recognise a
job the ledger never heard of (or lost) by them. Servers that speak the same protocol (Azure, Groq, Together,
OpenRouter, vLLM) work the same way through ``base_url``.

Each line asks for the ``n`` samples of one prompt with the body the live
backend sends (``OpenAIChatBackend.request_body``, seeds shifted the same
way), and its answer is read by the live parser (``group_texts``), so batch
and live draws are the same requests. A line cannot be probed, so it carries
the spec's fields only, whatever the backend's ``dialect``
(``request_body(spec=True)``): ``max_completion_tokens`` on chat, a
constraint as ``response_format`` (``json_schema``: ``enum`` for choices,
a string ``pattern`` for a regex, wrapped in an object); ``/completions``
has no constraint field, so its constrained draws run live
(``runtime.jobs``).
"""
from __future__ import annotations

import json
import uuid
from typing import Any, AsyncIterator, Iterable, Mapping, Sequence

import yarl

from outlines.backends.base import BackendError, BatchReport
from outlines.draws import Draw
from outlines.backends.jobs.base import STATES, JobLimits, JobLine, JobStatus, LineResult
from outlines.backends.jobs.wire import CLOCK_SKEW, WireJobs, jsonl, mapping, number, path_segment
from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend, sample_groups
from outlines.backends.usage import WireUsage, wire_usage

__all__ = ["OpenAIJobs"]

#: The provider's limits on one job's input file.
MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
#: Line-level error codes that mean "never ran", and those worth another try.
NOT_RUN = {"batch_expired": "expired", "batch_cancelled": "cancelled"}
TRANSIENT_CODES = frozenset({"server_error", "rate_limit_exceeded", "timeout", "internal_error"})


class OpenAIJobs(WireJobs):
    """Batch jobs for an OpenAI chat or completions backend (its base URL, key, retries).

    Parameters
    ----------
    backend
        The backend whose draws the jobs answer.
    max_requests, max_bytes
        Lines and bytes per job's file (the provider's limits by default: 50,000
        requests, 200 MB).
    completion_window
        How long the provider may take (``"24h"``, the only window it offers).

    Examples
    --------
    >>> from outlines.backends.openai import OpenAIChatBackend
    >>> jobs = OpenAIJobs(OpenAIChatBackend("gpt-4o-mini", api_key="sk-x"), max_requests=1000)
    >>> jobs.endpoint, jobs.limits.requests
    ('/v1/chat/completions', 1000)
    """

    provider = "openai"
    jobs_path = "/batches"
    cursor = "after"

    def __init__(
        self,
        backend: OpenAIChatBackend | OpenAICompletionBackend,
        *,
        max_requests: int = MAX_REQUESTS,
        max_bytes: int = MAX_BYTES,
        completion_window: str = "24h",
    ) -> None:
        super().__init__(backend, JobLimits(max_requests, max_bytes))
        self.backend: OpenAIChatBackend | OpenAICompletionBackend = backend
        self.completion_window = completion_window
        # The batch names its endpoint by path from the host: "/v1/chat/completions".
        self.endpoint = yarl.URL(backend.base_url).path.rstrip("/") + backend.path

    def lines(
        self, draws: Sequence[Draw], keys: Sequence[bytes], report: BatchReport | None = None
    ) -> list[JobLine]:
        """One line per prompt (and params): its distinct draws are its ``n`` samples."""
        hex_keys = [key.hex() for key in keys]
        first: dict[str, int] = {}
        for position, key in enumerate(hex_keys):
            first.setdefault(key, position)
        positions = list(first.values())
        groups, members = sample_groups([draws[p] for p in positions])
        out = []
        for group, member in zip(groups, members):
            line_keys = tuple(hex_keys[positions[m]] for m in member)
            try:
                record = {"custom_id": line_keys[0], "method": "POST", "url": self.endpoint,
                          "body": self.backend.request_body(group, spec=True)}
                out.append(self.line(line_keys, record, group.prompt))
            except BackendError as error:  # this prompt's draws fail alone
                if report is None:
                    raise
                for position in (p for p, key in enumerate(hex_keys) if key in line_keys):
                    report.failure(position, error)
        return out

    async def create(
        self, lines: Sequence[JobLine], metadata: Mapping[str, str], report: BatchReport | None = None
    ) -> JobStatus:
        """Upload ``lines`` as one JSONL file and start a job on it; see ``JobClient.create``."""
        report = report or BatchReport()
        content = b"".join(line.data + b"\n" for line in lines)
        self.check(lines, len(content))
        file_id = await self._upload(content, report)
        body = {"input_file_id": file_id, "endpoint": self.endpoint,
                "completion_window": self.completion_window, "metadata": dict(metadata)}
        return await self.start(lines, metadata, report, payload=body)

    async def _upload(self, content: bytes, report: BatchReport) -> str:
        # A repeated upload leaves an unused file, which costs nothing: it may retry.
        boundary = f"outlines-{uuid.uuid4().hex}"
        data = b"".join([
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'.encode(),
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="outlines-batch.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n".encode(),
            content,
            f"\r\n--{boundary}--\r\n".encode(),
        ])
        answer = await self.client.request("POST", "/files", report, data=data,
                                           content_type=f"multipart/form-data; boundary={boundary}")
        uploaded = self.client.json_object(answer, "/files")
        if not isinstance(uploaded.get("id"), str):
            raise self.backend.malformed("the uploaded file has no 'id'", uploaded, "/files")
        return str(uploaded["id"])

    def parse(self, data: Mapping[str, Any]) -> JobStatus:
        job_id, state = data.get("id"), data.get("status")
        if not isinstance(job_id, str) or state not in STATES:
            raise self.backend.malformed("a batch needs a string 'id' and a known 'status'", data, "/batches")
        counts, metadata = mapping(data, "request_counts"), mapping(data, "metadata")
        errors = mapping(data, "errors").get("data")
        reasons = [_reason(e) for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []
        files = tuple(data[k] for k in ("output_file_id", "error_file_id") if isinstance(data.get(k), str))
        return JobStatus(
            id=job_id, state=str(state), total=number(counts, "total"), succeeded=number(counts, "completed"),
            failed=number(counts, "failed"), created_at=float(number(data, "created_at")),
            metadata={str(k): str(v) for k, v in metadata.items()},
            reason=self.client.redact("; ".join(reasons)) or None,  # it may quote the key: hidden before it is kept
            results=files, input=data["input_file_id"] if isinstance(data.get("input_file_id"), str) else None,
        )

    async def results(
        self, status: JobStatus, samples: Mapping[str, int], report: BatchReport | None = None
    ) -> list[LineResult]:
        """Read the output and error files of a finished job; see ``JobClient.results``."""
        report = report or BatchReport()
        if status.state == "failed":
            raise BackendError(f"batch job {status.id} failed: {status.reason or 'no reason given'}",
                               endpoint=self.backend.base_url + "/batches", model=self.backend.model)
        if not status.finished:
            raise BackendError(f"batch job {status.id} has not finished (it is {status.state})")
        found: dict[str, LineResult] = {}
        for file_id in status.results:
            path = f"/files/{path_segment(file_id)}/content"
            content = await self.client.request("GET", path, report)
            for custom_id, record in jsonl(content, f"batch job {status.id}", self.client):
                result = self._line(custom_id, record, samples, report)
                if found.get(custom_id) is None or result.outcome == "succeeded":
                    found[custom_id] = result
        return list(found.values())

    def _line(
        self, custom_id: str, record: Mapping[str, Any], samples: Mapping[str, int], report: BatchReport
    ) -> LineResult:
        error, response = record.get("error"), record.get("response")
        if isinstance(error, dict):
            code = str(error.get("code") or "")
            if code in NOT_RUN:
                return LineResult(custom_id, NOT_RUN[code])
            return self.line_error(custom_id, None, _reason(error), retryable=code in TRANSIENT_CODES)
        if not isinstance(response, dict) or not isinstance(response.get("status_code"), int):
            return self.line_error(custom_id, 200, f"malformed result {json.dumps(record)[:200]}", retryable=False)
        body = response.get("body")
        status_code = int(response["status_code"])
        if not 200 <= status_code < 300:
            detail = body.get("error") if isinstance(body, dict) else None
            message = _reason(detail) if isinstance(detail, dict) else str(body)[:200]
            return self.line_error(custom_id, status_code, f"HTTP {status_code}: {message}")
        if not isinstance(body, dict):
            return self.line_error(custom_id, status_code, f"the answer is not a JSON object: {str(body)[:200]}",
                                   retryable=False)
        used = wire_usage(body.get("usage")) or WireUsage(0, 0)
        report.usage(*used)
        try:
            n = samples.get(custom_id) or len(body.get("choices") or ()) or 1
            texts = self.backend.group_texts(body, n)
        except Exception as exc:  # noqa: BLE001 - a malformed answer fails its own line
            return self.line_error(custom_id, status_code, str(exc) or f"expected {samples.get(custom_id)} choices",
                                   retryable=False)
        return LineResult(custom_id, "succeeded", tuple(texts), usage=used)

    async def find(
        self, metadata: Mapping[str, str], requests: int, since: float, *, exclude: Iterable[str] = (),
        custom_ids: Iterable[str] = (), report: BatchReport | None = None,
    ) -> JobStatus | None:
        """The job whose metadata holds all of ``metadata`` (the run and the intent name it)."""
        excluded = set(exclude)
        async for status in self._since(since, report):
            if status.id not in excluded and all(status.metadata.get(k) == v for k, v in metadata.items()):
                return status
        return None

    async def jobs_of(
        self, run: str, since: float, lines: Sequence[JobLine], *, exclude: Iterable[str] = (),
        report: BatchReport | None = None,
    ) -> list[tuple[JobStatus, list[JobLine]]]:
        """The jobs whose metadata names ``run`` and whose input files hold some of ``lines``' requests."""
        excluded = set(exclude)
        ours = {line.custom_id: line for line in lines}
        found = []
        async for status in self._since(since, report):
            if (status.id in excluded or status.metadata.get("outlines_run") != run or status.input is None
                    or status.state == "failed" or status.created_at < since - CLOCK_SKEW):
                continue
            try:
                content = await self.client.request("GET", f"/files/{path_segment(status.input)}/content",
                                                    report or BatchReport())
                # The same custom_id with another n (or body) is another request: only the very line counts.
                named = {custom_id for custom_id, record in jsonl(content, f"the input of batch job {status.id}",
                                                                  self.client)
                         if custom_id in ours and record == json.loads(ours[custom_id].data)}
            except (BackendError, ValueError):  # an input file deleted or unreadable: nothing to tell by
                continue
            held = [line for line in lines if line.custom_id in named]
            if held:
                found.append((status, held))
        return found

    async def _since(self, since: float, report: BatchReport | None) -> AsyncIterator[JobStatus]:
        """The account's jobs, newest first, down to those created before ``since`` (allowing for skew)."""
        after = None
        while True:
            statuses, after = await self.page(after, report=report)
            for status in statuses:
                yield status
            if after is None or all(s.created_at < since - CLOCK_SKEW for s in statuses):
                return


def _reason(error: Mapping[str, Any]) -> str:
    message = str(error.get("message") or error.get("code") or "unknown error")
    line = error.get("line")
    return f"line {line}: {message}" if isinstance(line, int) else message
