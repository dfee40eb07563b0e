"""What the library sends, checked against the providers' published specs, scenario by scenario.

Each scenario runs the library as a user would against the validating fakes
(``tests/fixtures/spec/validate.py``): live chat and completions with
samples, stop and seed, structured outputs with object and non-object roots,
reasoning-model names, Anthropic live and multi-turn with prompt-cache
breakpoints, and job mode on both providers with samples over 128 and
``choices=``/``regex=``. A request the real provider would refuse fails the
scenario (``tests/conftest.py``); none of these declares a violation.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pytest

import outlines
from outlines import chat, models
from outlines.backends.jobs import Backoff
from outlines.cache import Cache
from outlines.runtime.jobs import Jobs
from tests.fixtures.fake_batches import FakeBatches, FakeClock

KEY = "sk-scenario"
OBJECT = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
ARRAY = {"type": "array", "items": {"type": "string"}, "minItems": 1}
#: A head long enough for Anthropic's prompt cache (1,024 tokens for most models).
HEAD = " ".join(f"w{i % 89}" for i in range(1100)) + " "


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(clock: FakeClock) -> Iterator[FakeBatches]:
    with FakeBatches(clock=clock, honour_constraints=True) as fake:
        yield fake


def jobs(clock: FakeClock) -> Jobs:
    return Jobs(clock=clock, backoff=Backoff(first=1.0, cap=5.0))


def openai(server: FakeBatches, model: str = "gpt-4o-mini", **defaults: Any) -> Any:
    """A chat model as a user of OpenAI's server builds it: the fake plays api.openai.com on 127.0.0.1."""
    return models.openai(model, base_url=server.base_url, api_key=KEY, dialect="openai", **defaults)


def completion(server: FakeBatches, **defaults: Any) -> Any:
    """A ``/completions`` model as a user of OpenAI's server builds it."""
    return models.openai_completion("gpt-3.5-turbo-instruct", base_url=server.base_url, api_key=KEY,
                                    dialect="openai", **defaults)


def claude(server: FakeBatches, **defaults: Any) -> Any:
    return models.anthropic("claude-sonnet-4-5", base_url=server.anthropic_url, api_key=KEY, **defaults)


def obey(server: FakeBatches, constraint: dict[str, Any]) -> None:
    """Answers that keep ``constraint`` (the fake's own honouring writes no text for a pattern), wrapped in an
    object where the request asked for a json_schema."""
    text = "42" if "regex" in constraint else "yes"
    server.honour_constraints = False
    server.reply = lambda prompt, sample, body: json.dumps({"value": text}) if "response_format" in body else text


# -- live -----------------------------------------------------------------------------------------------------


def test_live_chat_with_samples_stop_and_seed(server: FakeBatches) -> None:
    value = openai(server)("q", num_samples=3, stop=["END"], seed=7, temperature=0.7, max_tokens=16).eval(cache=False)
    assert len(value) == 3 and len(server.requests) == 1


def test_live_completions_with_samples(server: FakeBatches) -> None:
    model = completion(server)
    value = outlines.eval(model(["a", "b"], num_samples=2, temperature=0.7, max_tokens=8, stop=["\n"]), cache=False,
                          progress=False)
    assert value.shape == (2, 2)


def test_live_structured_output_with_an_object_root(server: FakeBatches) -> None:
    assert openai(server)("who?", json_schema=OBJECT).eval(cache=False) == {"name": "x", "age": 0}


def test_live_structured_output_with_an_array_root(server: FakeBatches) -> None:
    assert openai(server)("list them", json_schema=ARRAY).eval(cache=False) == ["x"]


def test_live_completions_with_a_json_schema(server: FakeBatches) -> None:
    """The spec's /completions has no constraint field: the schema is only checked here."""
    server.reply = lambda prompt, sample, body: '{"name": "x", "age": 0}'
    assert completion(server)("who?", json_schema=OBJECT).eval(cache=False) == {"name": "x", "age": 0}
    (body,) = (r.body for r in server.requests)
    assert not {"response_format", "guided_json"} & body.keys()


@pytest.mark.parametrize("name", ["gpt-5-mini", "o3-mini"])
def test_live_chat_to_a_reasoning_model(server: FakeBatches, name: str) -> None:
    assert openai(server, name, max_tokens=32)("q").eval(cache=False) == "q#0"


@pytest.mark.parametrize("constraint", [{"choices": ["yes", "no"]}, {"regex": "[0-9]+"}])
def test_live_choices_and_regex_to_openai(server: FakeBatches, constraint: dict[str, Any]) -> None:
    """Choices as a strict enum, a regex as a strict string pattern, in response_format: no guided_* probe."""
    obey(server, constraint)
    openai(server)("q", **constraint).eval(cache=False)
    (body,) = (r.body for r in server.requests)
    value = body["response_format"]["json_schema"]["schema"]["properties"]["value"]
    assert value == ({"type": "string", "enum": ["yes", "no"]} if "choices" in constraint else
                     {"type": "string", "pattern": "^(?:[0-9]+)$"})


def test_live_anthropic_multi_turn_with_breakpoints(server: FakeBatches) -> None:
    conversation = chat.system("You grade essays.") + chat.user(HEAD + "Grade this.") + chat.assistant("Grade:")
    model = claude(server, max_tokens=16)
    outlines.eval(*[model(conversation + chat.user(f"and {i}?")) for i in range(3)], cache=False, progress=False)
    marked = [r.body for r in server.requests if "cache_control" in json.dumps(r.body)]
    assert marked, "the siblings share a head: they carry a breakpoint"


def test_live_anthropic_with_temperature(server: FakeBatches) -> None:
    claude(server, temperature=0.5, max_tokens=16)("q").eval(cache=False)


# -- job mode -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_batch_samples_over_128(server: FakeBatches, clock: FakeClock, tmp_path: Path, provider: str) -> None:
    model = openai(server) if provider == "openai" else claude(server)
    out = model("q", num_samples=150, temperature=0.7, max_tokens=8)
    value = outlines.eval(out, jobs=jobs(clock), cache=Cache(tmp_path / "cache"))
    assert len(value) == 150


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("constraint", [{"choices": ["yes", "no"]}, {"regex": "[0-9]+"}])
def test_batch_choices_and_regex(server: FakeBatches, clock: FakeClock, tmp_path: Path, provider: str,
                                 constraint: dict[str, Any]) -> None:
    obey(server, constraint)
    model = openai(server) if provider == "openai" else claude(server)
    out = model(outlines.string("q"), max_tokens=8, **constraint)
    outlines.eval(out, givens={"q": ["a", "b", "c"]}, jobs=jobs(clock), cache=Cache(tmp_path / "cache"))
    lines = [line.body for job in server.jobs.values() for line in job.lines]
    if provider == "openai":  # the spec's form in every line
        assert len(lines) == 3 and all("response_format" in body and "max_completion_tokens" in body
                                       and not any(k.startswith("guided_") for k in body) for body in lines)
    else:  # Anthropic's job requests cannot carry it: live, checked here
        assert not lines and server.count == 3


def test_batch_structured_output_with_an_array_root(server: FakeBatches, clock: FakeClock, tmp_path: Path) -> None:
    out = openai(server)(outlines.string("q"), json_schema=ARRAY, max_tokens=8)
    value = outlines.eval(out, givens={"q": ["a", "b"]}, jobs=jobs(clock), cache=Cache(tmp_path / "cache"))
    assert list(value) == [["x"], ["x"]]


def test_batch_to_a_reasoning_model(server: FakeBatches, clock: FakeClock, tmp_path: Path) -> None:
    out = openai(server, "gpt-5-mini")(outlines.string("q"), max_tokens=8)
    outlines.eval(out, givens={"q": ["a", "b"]}, jobs=jobs(clock), cache=Cache(tmp_path / "cache"))
