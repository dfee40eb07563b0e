"""The fake providers against the providers' own clients and specs.

The official ``openai`` and ``anthropic`` clients, with strict response
validation, talk to ``FakeOpenAI``/``FakeBatches``: every answer the fakes
give parses as the real API's types. The request checks
(``tests/fixtures/spec/validate.py``) refuse what the real APIs refuse, with
their status and error shape, and a refused request the test did not declare
fails it.
"""
from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from outlines.testing._live import Refusal
from outlines.testing._provider import read_openai_job_file
from tests.fixtures.fake_batches import FakeBatches, FakeClock
from tests.fixtures.spec import validate

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")

KEY = "sk-conformance"
CHAT = "/v1/chat/completions"
OBJECT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_700_000_000)


@pytest.fixture
def server(clock: FakeClock) -> Iterator[FakeBatches]:
    with FakeBatches(clock=clock, honour_constraints=True, shuffle=False) as fake:
        yield fake


@pytest.fixture
def client(server: FakeBatches) -> Iterator[Any]:
    with openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0,
                       _strict_response_validation=True) as made:
        yield made


@pytest.fixture
def claude(server: FakeBatches) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=server.anthropic_url, api_key=KEY, max_retries=0,
                             _strict_response_validation=True) as made:
        yield made


def chat_line(custom_id: str, content: str, model: str = "gpt-4o-mini", **fields: Any) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **fields}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}).encode() + b"\n"


# -- OpenAI ----------------------------------------------------------------------------------------------------


def test_chat_completions_with_samples_stop_and_seed_parse(client: Any, server: FakeBatches) -> None:
    answer = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        n=3, stop=["#1"], seed=7, temperature=0.5, max_completion_tokens=16)
    assert [c.message.content for c in answer.choices] == ["hi#0", "hi#1", "hi#2"]
    assert answer.usage is not None and answer.usage.prompt_tokens == 3
    assert not server.violations


def test_legacy_completions_with_a_list_of_prompts_parse(client: Any) -> None:
    answer = client.completions.create(model="gpt-3.5-turbo-instruct", prompt=["a", "b"], n=2, max_tokens=4,
                                       seed=1, stop="\n")
    assert [c.text for c in sorted(answer.choices, key=lambda c: c.index)] == ["a#0", "a#1", "b#0", "b#1"]


def test_structured_outputs_parse(client: Any) -> None:
    answer = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "who?"}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": OBJECT, "strict": True}})
    assert json.loads(answer.choices[0].message.content) == {"name": "x", "age": 0}


@pytest.mark.parametrize("kwargs, pattern", [
    ({"model": "gpt-5-mini", "max_tokens": 5}, r"Unsupported parameter: 'max_tokens'.*max_completion_tokens"),
    ({"model": "o3-mini", "temperature": 0.2}, r"'temperature' does not support 0.2"),
    ({"model": "o4-mini", "stop": ["x"]}, r"Unsupported parameter: 'stop'"),
    ({"model": "gpt-4o", "n": 129}, r"Invalid 'n': 129 is greater than the maximum of 128"),
    ({"model": "gpt-4o", "temperature": 2.5}, r"Invalid 'temperature'"),
    ({"model": "gpt-4o", "extra_body": {"guided_choice": ["a", "b"]}},
     r"Unrecognized request argument supplied: guided_choice"),
    ({"model": "gpt-4o", "response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "strict": True, "schema": {"type": "array", "items": {"type": "string"}}}}},
     r"schema must be a JSON Schema of 'type: \"object\"'"),
    ({"model": "gpt-4o", "response_format": {"type": "json_schema", "json_schema": {
        "name": "output", "strict": True, "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}},
     r"'additionalProperties' is required to be supplied and to be false"),
])
def test_what_openai_refuses_is_a_400_naming_the_field(client: Any, server: FakeBatches, kwargs: dict[str, Any],
                                                        pattern: str) -> None:
    server.expect_violations(pattern)
    with pytest.raises(openai.BadRequestError, match=pattern) as caught:
        client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **kwargs)
    assert caught.value.body["type"] == "invalid_request_error"
    assert len(server.violations) == 1


def test_a_vllm_server_takes_its_own_fields(server: FakeBatches) -> None:
    with FakeBatches(dialect="vllm", honour_constraints=True) as vllm, \
            openai.OpenAI(base_url=vllm.base_url, api_key=KEY, _strict_response_validation=True) as client:
        answer = client.completions.create(model="m", prompt="pick", extra_body={"guided_choice": ["up", "down"]})
        assert answer.choices[0].text == "up"
        vllm.expect_violations("guided_colour")
        with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: guided_colour"):
            client.completions.create(model="m", prompt="pick", extra_body={"guided_colour": "red"})


def test_a_batch_runs_through_the_official_client(client: Any, server: FakeBatches, clock: FakeClock) -> None:
    content = chat_line("a", "one", max_completion_tokens=5) + chat_line("b", "two", n=2)
    uploaded = client.files.create(file=("input.jsonl", content), purpose="batch")
    assert uploaded.bytes == len(content) and uploaded.purpose == "batch"
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h",
                                  metadata={"run": "conformance"})
    assert batch.status == "validating" and batch.metadata == {"run": "conformance"}
    assert [b.id for b in client.batches.list(limit=5).data] == [batch.id]
    clock.advance(60)
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 2
    assert done.output_file_id is not None and done.error_file_id is None
    lines = [json.loads(line) for line in client.files.content(done.output_file_id).content.splitlines()]
    assert [(r["custom_id"], [c["message"]["content"] for c in r["response"]["body"]["choices"]]) for r in lines] == [
        ("a", ["one#0"]), ("b", ["two#0", "two#1"])]
    second = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    assert client.batches.cancel(second.id).status == "cancelling"
    clock.advance(60)
    assert client.batches.retrieve(second.id).status == "cancelled"


def test_a_bad_line_fails_its_own_request_and_a_bad_file_fails_the_job(client: Any, server: FakeBatches,
                                                                        clock: FakeClock) -> None:
    server.expect_violations(r"line b\): Unsupported parameter: 'max_tokens'", "used more than once")
    mixed = chat_line("a", "fine", "gpt-5-mini") + chat_line("b", "old", "gpt-5-mini", max_tokens=5)
    bad_line = client.batches.create(input_file_id=client.files.create(file=("in.jsonl", mixed), purpose="batch").id,
                                     endpoint=CHAT, completion_window="24h")
    repeated = chat_line("a", "x") + chat_line("a", "y")
    bad_file = client.batches.create(input_file_id=client.files.create(file=("in.jsonl", repeated),
                                                                       purpose="batch").id,
                                     endpoint=CHAT, completion_window="24h")
    clock.advance(60)
    done = client.batches.retrieve(bad_line.id)
    assert done.status == "completed" and done.error_file_id is not None
    (error,) = [json.loads(line) for line in client.files.content(done.error_file_id).content.splitlines()]
    assert error["custom_id"] == "b" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "max_tokens"
    failed = client.batches.retrieve(bad_file.id)
    assert failed.status == "failed" and failed.errors is not None and "more than once" in failed.errors.data[0].message


def test_what_the_batch_api_refuses_at_upload_and_create(client: Any, server: FakeBatches) -> None:
    server.expect_violations("purpose 'batch'", "Invalid 'completion_window'")
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        client.files.create(file=("in.jsonl", chat_line("a", "x")), purpose="user_data")
    uploaded = client.files.create(file=("in.jsonl", chat_line("a", "x")), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="48h")  # type: ignore[arg-type]


@pytest.mark.parametrize("content, reason", [
    (chat_line("a", "x").replace(CHAT.encode(), b"/v1/completions"), "is not the batch's endpoint"),
    (chat_line("a", "x") + chat_line("b", "y").replace(b"gpt-4o-mini", b"gpt-4o"), "a batch's requests all use one"),
    (b'{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {}}\n', "Line 1: Invalid 'method'"),
    (chat_line("a", "x") + chat_line("b", "x") + chat_line("c", "x"), "must hold 1 to 2 requests"),
])
def test_an_input_file_is_read_as_the_batch_api_reads_it(content: bytes, reason: str) -> None:
    read = read_openai_job_file(content, CHAT, (2, 10**6))
    assert read.failure is not None and reason in read.failure.message


# -- Anthropic --------------------------------------------------------------------------------------------------


def test_a_message_parses(claude: Any) -> None:
    message = claude.messages.create(
        model="claude-sonnet-4-5", max_tokens=32, system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                  {"role": "user", "content": [{"type": "text", "text": "again", "cache_control": {"type": "ephemeral"}}]}],
        stop_sequences=["#"])
    assert message.content[0].text == "again" and message.stop_reason == "stop_sequence"


@pytest.mark.parametrize("extra, pattern", [
    ({"seed": 1}, "seed: Extra inputs are not permitted"),
    ({"n": 2}, "n: Extra inputs are not permitted"),
    ({"temperature": 0.5, "top_p": 0.9}, "cannot both be specified"),
    ({"temperature": 1.5}, "temperature: 1.5 is greater than the maximum of 1"),
])
def test_what_anthropic_refuses_is_a_400_naming_the_field(claude: Any, server: FakeBatches, extra: dict[str, Any],
                                                           pattern: str) -> None:
    server.expect_violations(pattern)
    with pytest.raises(anthropic.BadRequestError, match=pattern) as caught:
        claude.messages.create(model="claude-x", max_tokens=5, messages=[{"role": "user", "content": "hi"}],
                               extra_body=extra)
    assert caught.value.body["error"]["type"] == "invalid_request_error"


def test_a_message_batch_runs_through_the_official_client(claude: Any, server: FakeBatches, clock: FakeClock) -> None:
    params = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "one"}]}
    batch = claude.messages.batches.create(requests=[{"custom_id": "a", "params": params},
                                                     {"custom_id": "b", "params": {**params, "top_k": 3}}])
    assert batch.processing_status == "in_progress"
    assert [b.id for b in claude.messages.batches.list(limit=5).data] == [batch.id]
    clock.advance(60)
    assert claude.messages.batches.retrieve(batch.id).processing_status == "ended"
    results = {r.custom_id: r.result for r in claude.messages.batches.results(batch.id)}
    assert results["a"].type == "succeeded" and results["a"].message.content[0].text == "one#0"
    other = claude.messages.batches.create(requests=[{"custom_id": "c", "params": params}])
    assert claude.messages.batches.cancel(other.id).processing_status == "canceling"
    clock.advance(60)
    assert [r.result.type for r in claude.messages.batches.results(other.id)] == ["canceled"]


def test_a_message_batch_request_with_bad_params_ends_errored(claude: Any, server: FakeBatches,
                                                              clock: FakeClock) -> None:
    server.expect_violations(r"line b\): seed: Extra inputs")
    params = {"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "one"}]}
    batch = claude.messages.batches.create(requests=[{"custom_id": "a", "params": params},
                                                     {"custom_id": "b", "params": {**params, "seed": 3}}])
    clock.advance(60)
    results = {r.custom_id: r.result for r in claude.messages.batches.results(batch.id)}
    assert results["a"].type == "succeeded" and results["b"].type == "errored"
    assert "seed" in results["b"].error.error.message


@pytest.mark.parametrize("requests, pattern", [
    ([{"custom_id": "has space", "params": {}}], "custom_id: String should match"),
    ([{"custom_id": "a" * 65, "params": {}}], "custom_id: String should match"),
    ([{"custom_id": "a"}], "params: Field required"),
    ([{"custom_id": "a", "params": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}}] * 2,
     "is not unique"),
    ([], "must hold 1 to"),
])
def test_what_the_message_batches_api_refuses_at_create(claude: Any, server: FakeBatches, requests: list[Any],
                                                         pattern: str) -> None:
    server.expect_violations(pattern)
    with pytest.raises(anthropic.BadRequestError, match=pattern):
        claude.messages.batches.create(requests=requests)


# -- the ledger ----------------------------------------------------------------------------------------------------


def test_an_undeclared_violation_fails_the_test_and_a_declared_one_must_come(server: FakeBatches) -> None:
    server.ledger.record(Refusal("/v1/messages", "seed: Extra inputs are not permitted"))
    with pytest.raises(AssertionError, match="unexpected spec violation: /v1/messages: seed"):
        validate.check_ledgers()
    server.expect_violations("never sent")
    with pytest.raises(AssertionError, match="expected a violation matching 'never sent', none came"):
        validate.check_ledgers()
    validate.check_ledgers()  # each look sees only what came since the last one


def test_a_test_whose_request_is_refused_fails(tmp_path: Any) -> None:
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    (tmp_path / "conftest.py").write_text("from tests.conftest import _spec_violations, pytest_runtest_call\n")
    (tmp_path / "test_refused.py").write_text(
        "import json, urllib.error, urllib.request\n"
        "from tests.fixtures.fake_openai import FakeOpenAI\n"
        "def send(server, body):\n"
        "    request = urllib.request.Request(server.base_url + '/chat/completions', json.dumps(body).encode(),\n"
        "                                     {'Content-Type': 'application/json', 'Authorization': 'Bearer k'})\n"
        "    try:\n"
        "        urllib.request.urlopen(request).close()\n"
        "    except urllib.error.HTTPError as error:\n"
        "        error.close()\n"
        "BAD = {'model': 'gpt-5-mini', 'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 5}\n"
        "def test_undeclared():\n"
        "    with FakeOpenAI() as server:\n"
        "        send(server, BAD)\n"
        "def test_declared():\n"
        "    with FakeOpenAI() as server:\n"
        "        server.expect_violations('max_tokens')\n"
        "        send(server, BAD)\n"
        "def test_declared_but_never_sent():\n"
        "    with FakeOpenAI() as server:\n"
        "        server.expect_violations('max_tokens')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert "2 failed, 1 passed" in done.stdout, done.stdout
    assert "FAILED test_refused.py::test_undeclared" in done.stdout
    assert "FAILED test_refused.py::test_declared_but_never_sent" in done.stdout
    assert "unexpected spec violation: /chat/completions: Unsupported parameter: 'max_tokens'" in done.stdout
