"""Structured outputs: constraint validation, cache keys, validate-and-retry, HTTP fields, local masks."""
from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.backends.base import BatchReport
from outlines.draws import Constraint, Draw, GenerationParams
from outlines.backends.constraints import RETRY_STRIDE, ConstraintError, Parse, generate_valid, make_constraint
from outlines.backends.openai import wire_constraint
from outlines.cache import draw_key
from outlines.common.errors import Failure, GraphBuildError
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.recording import RecordingBackend

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


# -- building ----------------------------------------------------------------------------------


def test_canonical_forms() -> None:
    assert make_constraint() is None
    assert make_constraint(choices=["b", "a", "b"]) == Constraint("choices", '["b","a"]')
    assert make_constraint(regex=r"\d+") == Constraint("regex", r"\d+")
    reordered = {"required": ["name", "age"], "properties": SCHEMA["properties"], "type": "object",
                 "additionalProperties": False}
    assert make_constraint(json_schema=SCHEMA) == make_constraint(json_schema=reordered)
    assert make_constraint(json_schema=json.dumps(SCHEMA)) == make_constraint(json_schema=SCHEMA)
    # The one key normaliser (outlines.common.keys.canonical) writes the text: 1.0 is 1.
    assert make_constraint(json_schema={"type": "number", "maximum": 1.0}) == \
        make_constraint(json_schema={"maximum": 1, "type": "number"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"choices": []}, "choices= is empty"),
        ({"choices": "yes"}, "choices= must be a list"),
        ({"choices": ["a", 3]}, "choices= must hold non-empty strings"),
        ({"regex": "[a-"}, "regex= '\\[a-' is not a valid pattern"),
        ({"json_schema": {"type": "frobnicate"}}, "json_schema= is not a valid JSON schema"),
        ({"json_schema": 42}, "json_schema= must be a dict"),
        ({"regex": "(?=a)a"}, "regex= cannot be compiled for constrained decoding"),
        ({"choices": ["a"], "regex": "a"}, "at most one of choices=, regex=, json_schema=; got choices, regex"),
        ({"choices": ["a"], "stop": "\n"}, "cannot be combined with choices="),
    ],
)
def test_bad_constraints_fail_at_build_time_naming_the_argument(kwargs: dict[str, Any], message: str) -> None:
    model = models.from_function(lambda p: p, name="bad_constraints")
    with pytest.raises(GraphBuildError, match=message):
        model("x", **kwargs)


def test_the_constraint_is_part_of_the_cache_key() -> None:
    identity = ("function", "f")
    plain = Draw("p", GenerationParams(), 1)
    yes_no = Draw("p", GenerationParams(constraint=make_constraint(choices=["yes", "no"])), 1)
    no_yes = Draw("p", GenerationParams(constraint=make_constraint(choices=["no", "yes"])), 1)
    again = Draw("p", GenerationParams.create(constraint=make_constraint(choices=["yes", "no"])), 1)
    keys = [draw_key(identity, r) for r in (plain, yes_no, no_yes)]
    assert len(set(keys)) == 3
    assert draw_key(identity, again) == keys[1] and again.params == yes_no.params
    assert GenerationParams().merged(constraint=yes_no.params.constraint) == yes_no.params  # a field, not an extra


def test_parse_presents_itself_in_pictures() -> None:
    constraint = make_constraint(json_schema=SCHEMA)
    assert constraint is not None
    shown = Parse(constraint).describe()
    assert shown["kind"] == "op" and shown["title"] == "Parse[json]" and "JSON (json_schema)" in shown["lines"][0]


def test_check_and_parse() -> None:
    choice, pattern, schema = (make_constraint(choices=["yes", "no"]), make_constraint(regex=r"\d{3}"),
                               make_constraint(json_schema=SCHEMA))
    assert choice is not None and pattern is not None and schema is not None
    assert choice.is_valid("yes") and not choice.is_valid("yes ")
    assert pattern.is_valid("123") and not pattern.is_valid("1234")
    assert schema.parse('{"name": "Ada", "age": 36}') == {"name": "Ada", "age": 36}
    with pytest.raises(ValueError, match="does not follow the schema"):
        schema.parse('{"name": "Ada"}')
    with pytest.raises(ValueError, match="is not JSON"):
        schema.parse("{")


def test_length_limited_json_strings_exclude_control_characters() -> None:
    pytest.importorskip("xgrammar")
    from outlines.backends.constraints import _grammar

    constraint = make_constraint(json_schema=SCHEMA)  # "name" has maxLength: xgrammar's loose character class
    assert constraint is not None
    rules = str(_grammar(constraint))
    assert r"[^\0-\x1f" in rules and r'[^\"\\\r\n]' not in rules


# -- every backend: validate, retry, fail ------------------------------------------------------


def test_a_backend_that_ignores_the_constraint_is_retried_then_fails_that_draw_only() -> None:
    calls: list[str] = []

    def flaky(prompt: str) -> str:
        calls.append(prompt)
        if prompt == "good":
            return "yes"
        if prompt == "late":  # valid at the third attempt
            return "no" if calls.count("late") == 3 else "nope"
        return "gibberish"

    model = models.from_function(flaky, name="flaky_constraint")
    out = outlines.eval(model(["good", "late", "bad"], choices=["yes", "no"]), cache=False, errors="return",
                        progress=False)
    assert list(out[:2]) == ["yes", "no"]
    assert isinstance(out[2], Failure) and "'gibberish' is not one of the choices" in out[2].message
    assert calls.count("good") == 1 and calls.count("late") == 3 and calls.count("bad") == 4  # 1 + 3 retries
    with pytest.raises(Exception, match="broke its choices constraint after 4 attempts"):
        outlines.eval(model("bad", choices=["yes", "no"]), cache=False, progress=False)


def test_generate_valid_reports_valid_draws_and_fails_exhausted_ones_on_the_report() -> None:
    answers = {"good": "yes", "bad": "maybe", "free": "anything"}
    backend = RecordingBackend(lambda p: answers[p.split("@")[0]], name="generate_valid", usage=True)
    backend.max_retries = 2
    seen: list[Draw] = []

    async def generate(backend: Any, draws: list[Draw], report: BatchReport) -> tuple[list[str], Any]:
        seen.extend(draws)
        return await backend.generate(draws, report), "worker"

    choices = GenerationParams(constraint=make_constraint(choices=["yes", "no"]))
    draws = [Draw("good", choices, 5), Draw("bad", choices, 5), Draw("free", GenerationParams(), 0)]
    report = BatchReport()
    texts, worker = asyncio.run(generate_valid(generate, backend, draws, report))
    assert worker == "worker" and len(texts) == 3
    assert report.results == {0: "yes", 2: "anything"}
    assert list(report.failures) == [1] and isinstance(report.failures[1], ConstraintError)
    assert "'maybe' is not one of the choices" in str(report.failures[1])
    # The bad draw alone is asked again, with draw d + attempt * 2**20.
    assert [(d.prompt, d.draw) for d in seen[3:]] == [("bad", 5 + RETRY_STRIDE), ("bad", 5 + 2 * RETRY_STRIDE)]
    assert RETRY_STRIDE == 1 << 20
    assert report.tokens == [3 * 5, 5, 0, 0]  # usage of every attempt reaches the batch's report


def test_a_failure_the_backend_reports_is_not_retried() -> None:
    class Failing(RecordingBackend):
        async def generate(self, draws: Any, report: BatchReport) -> list[str]:
            self.batches.append([d.prompt for d in draws])
            report.failure(0, RuntimeError("wire failed"))
            return ["", "yes"]

    backend = Failing(name="generate_valid_failing")
    choices = GenerationParams(constraint=make_constraint(choices=["yes", "no"]))
    report = BatchReport()

    async def generate(backend: Any, draws: list[Draw], report: BatchReport) -> tuple[list[str], Any]:
        return await backend.generate(draws, report), None

    asyncio.run(generate_valid(generate, backend, [Draw("a", choices, 0), Draw("b", choices, 0)], report))
    assert str(report.failures[0]) == "wire failed" and report.results == {1: "yes"}
    assert backend.batches == [["a", "b"]]


def test_json_schema_outputs_are_parsed_and_keep_the_shape(tmp_path) -> None:
    import pydantic

    class Person(pydantic.BaseModel):
        name: str
        age: int

    texts = iter(['{"name": "A", "age": 1}', '{"name": "B", "age": 2}'] * 4)
    model = models.from_function(lambda p: next(texts), name="json_people", version="1")  # an iterator of canned replies
    people = model(["p", "q"], json_schema=Person)
    values = outlines.eval(people, cache=False, progress=False)
    assert values.shape == (2,) and all(isinstance(v, Person) for v in values)
    dicts = outlines.eval(model(["p", "q"], json_schema=SCHEMA, num_samples=2), cache=False, progress=False)
    assert dicts.shape == (2, 2) and dicts[0, 0] == {"name": "A", "age": 1}


def test_the_cache_stores_text_and_replays_parsed_values(tmp_path) -> None:
    from outlines import cache

    calls: list[str] = []

    def person(prompt: str) -> str:
        calls.append(prompt)
        return json.dumps({"name": prompt, "age": 3})

    model = models.from_function(person, name="cached_people")
    cache.enable(str(tmp_path / "cache"))
    try:
        first = outlines.eval(model(["a", "b"], json_schema=SCHEMA), progress=False)
        second = outlines.eval(model(["a", "b"], json_schema=SCHEMA), progress=False)
        plain = outlines.eval(model(["a", "b"]), progress=False)  # another key: not replayed from the constrained
    finally:
        cache.disable()
    assert list(first) == list(second) == [{"name": "a", "age": 3}, {"name": "b", "age": 3}]
    assert list(plain) == [json.dumps({"name": p, "age": 3}) for p in "ab"]
    assert len(calls) == 4


# -- the token boundary -----------------------------------------------------------------------


def test_a_spaced_constraint_may_start_with_a_space_that_is_stripped_unless_wanted() -> None:
    labels = make_constraint(choices=["food", "sport"])
    assert labels is not None and not labels.leading_space
    spaced = labels.spaced()
    assert spaced.leading_space and spaced != labels and spaced.to_dict() == labels.to_dict()
    assert draw_key(("k",), Draw("p", GenerationParams(constraint=spaced))) == \
        draw_key(("k",), Draw("p", GenerationParams(constraint=labels)))  # decoding only: the same cache key
    assert spaced.unspaced(" food") == "food" and spaced.unspaced("food") == "food"
    assert labels.unspaced(" food") == " food"  # an unspaced row is left as it is (and then fails its check)
    wanted = make_constraint(choices=[" food", "sport"]).spaced()  # type: ignore[union-attr]
    assert wanted.unspaced(" food") == " food" and wanted.unspaced("  food") == " food"
    pattern = make_constraint(regex=r"[0-9]{3}").spaced()  # type: ignore[union-attr]
    assert pattern.unspaced(" 123") == "123" and pattern.unspaced(" 12") == " 12"
    schema = make_constraint(json_schema=SCHEMA)
    assert schema is not None and schema.spaced() is schema  # a JSON value starts at its first character


def test_a_spaced_grammar_accepts_one_leading_space() -> None:
    pytest.importorskip("xgrammar")
    from outlines.backends.constraints import _grammar

    spaced = _grammar(make_constraint(choices=["food", "sport"]).spaced())  # type: ignore[union-attr]
    text = str(spaced)
    assert '" "' in text and '"food"' in text and '"sport"' in text


# -- HTTP -------------------------------------------------------------------------------------


def test_wire_fields() -> None:
    schema = make_constraint(json_schema=SCHEMA)
    assert schema is not None
    chat = wire_constraint(schema, chat=True)
    assert chat["response_format"]["json_schema"]["strict"] is True
    assert chat["response_format"]["json_schema"]["schema"] == SCHEMA  # an object root goes as it is
    loose = make_constraint(json_schema={"type": "object", "properties": {"a": {"type": "string"}}})
    assert loose is not None and "strict" not in wire_constraint(loose, chat=True)["response_format"]["json_schema"]
    assert wire_constraint(schema, chat=False) == {"guided_json": SCHEMA}
    assert wire_constraint(make_constraint(choices=["a", "b"]), chat=False) == {"guided_choice": ["a", "b"]}  # type: ignore[arg-type]
    assert wire_constraint(make_constraint(regex="a+"), chat=True) == {"guided_regex": "a+"}  # type: ignore[arg-type]


def _strict(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "output", "strict": True, "schema": {
        "type": "object", "properties": {"value": value}, "required": ["value"], "additionalProperties": False}}}


@pytest.mark.parametrize("kind, value, chat, dialect, refused, sent", [
    # OpenAI's own server: the spec's response_format only, a value that is not an object wrapped in one
    ("choices", ["a", "b"], True, "openai", (), {"response_format": _strict({"type": "string", "enum": ["a", "b"]})}),
    ("regex", "[0-9]+", True, "openai", (), {"response_format": _strict({"type": "string", "pattern": "^(?:[0-9]+)$"})}),
    ("json_schema", {"type": "array", "items": {"type": "integer"}}, True, "openai", (),
     {"response_format": _strict({"type": "array", "items": {"type": "integer"}})}),
    ("choices", ["a", "b"], False, "openai", (), {}),  # /completions has no such field in the spec: checked only
    # a compatible server: its guided field first, then the spec's form where it refused that
    ("choices", ["a", "b"], True, "compatible", ("guided_choice",),
     {"response_format": _strict({"type": "string", "enum": ["a", "b"]})}),
    ("json_schema", SCHEMA, True, "compatible", ("response_format",), {"guided_json": SCHEMA}),
    ("regex", "a+", False, "compatible", ("guided_regex",), {}),
])
def test_each_constraint_goes_in_the_first_form_the_server_takes(
    kind: str, value: Any, chat: bool, dialect: str, refused: tuple[str, ...], sent: dict[str, Any]
) -> None:
    constraint = make_constraint(**{kind: value})
    assert constraint is not None
    assert wire_constraint(constraint, chat=chat, dialect=dialect, refused=frozenset(refused)) == sent


@pytest.mark.parametrize("kind, value, answer, text", [
    ("choices", ["yes", "no"], '{"value": "no"}', "no"),
    ("regex", "[0-9]+", '{"value":"42"}', "42"),
    ("json_schema", {"type": "array", "items": {"type": "integer"}}, '{"value": [1, 2]}', "[1, 2]"),
    ("choices", ['{"value": "no"}', "no"], '{"value": "no"}', '{"value": "no"}'),  # valid as it is: kept
    ("json_schema", SCHEMA, '{"value": 1}', '{"value": 1}'),  # an object root is never wrapped
])
def test_an_answer_in_the_wrapped_form_is_read_back(kind: str, value: Any, answer: str, text: str) -> None:
    constraint = make_constraint(**{kind: value})
    assert constraint is not None and constraint.unwrap(answer) == text


def test_a_server_that_honours_response_format_is_asked_once() -> None:
    with FakeOpenAI(honour_constraints=True, dialect="vllm") as server:  # guided_choice is vLLM's
        model = models.openai("fake", base_url=server.base_url, api_key="sk-test", temperature=0.7)
        out = outlines.eval(model(["a", "b"], json_schema=SCHEMA), cache=False, progress=False)
        assert list(out) == [{"name": "x", "age": 0}] * 2
        assert server.count == 2
        assert server.requests[0].body["response_format"]["json_schema"]["schema"] == SCHEMA
        completion = models.openai_completion("fake", base_url=server.base_url, api_key="sk-test")
        server.reset()
        out = outlines.eval(completion(["a", "b"], choices=["up", "down"]), cache=False, progress=False)
        assert list(out) == ["up", "up"] and server.count == 1
        assert server.requests[0].body["guided_choice"] == ["up", "down"]


def test_a_server_that_ignores_response_format_gets_bounded_retries() -> None:
    with FakeOpenAI() as server:  # echoes "<prompt>#<sample>": never JSON
        model = models.openai("fake", base_url=server.base_url, api_key="sk-test", max_retries=2)
        out = outlines.eval(model(["a", "b"], json_schema=SCHEMA), cache=False, errors="return", progress=False)
        assert all(isinstance(v, Failure) and "'a#0' is not JSON" in out[0].message for v in out)
        assert server.count == 2 * 3  # two draws, 1 + 2 retries each
        draws = sorted(r.body.get("seed", 0) for r in server.requests)
        assert len(draws) == 6


@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_a_greedy_draw_that_breaks_its_constraint_fails_at_once(constructor: Any) -> None:
    # vLLM's dialect: the model on 127.0.0.1 is "compatible" and sends guided_* without a probe, so the
    # counts are the draws' requests only. It echoes "<prompt>#<sample>": never JSON, never a choice.
    with FakeOpenAI(dialect="vllm") as server:
        model = constructor("fake", base_url=server.base_url, api_key="sk-test", temperature=0, max_retries=3)
        calls = [model(["a", "b", "c"], json_schema=SCHEMA), model(["a", "b", "c"], choices=["yes", "no"])]
        schema, choice = outlines.eval(*calls, cache=False, errors="return", progress=False)
        assert server.count == (6 if constructor is models.openai else 2)  # one request per prompt (chat) or call
        assert all(isinstance(v, Failure) for v in [*schema, *choice])
        assert "'a#0' is not JSON" in schema[0].message and "'b#0' is not one of the choices" in choice[1].message
        assert "not asked again: at temperature=0 every attempt writes the same text" in choice[1].message
        sampled = constructor("fake", base_url=server.base_url, api_key="sk-test", temperature=0.5, max_retries=3)
        server.reset()
        outlines.eval(sampled("a", choices=["yes", "no"]), cache=False, errors="return", progress=False)
        assert server.count == 4  # a sampled draw may come out differently: 1 + 3 retries


def test_a_server_that_refuses_a_field_is_probed_then_remembered_per_model() -> None:
    from outlines.backends import quirks

    with FakeOpenAI(reply=lambda prompt, sample, body: "yes") as server:  # it refuses guided_* as OpenAI does
        server.expect_violations("Unrecognized request argument supplied: guided_choice")
        model = models.openai_completion("fake", base_url=server.base_url, api_key="sk-test")
        assert outlines.eval(model("a", choices=["yes", "no"]), cache=False, progress=False) == "yes"
        probe = server.requests[1].body
        assert probe["guided_choice"] == ["OK"] and probe["prompt"] == "OK" and probe["max_tokens"] == 16
        assert server.count == 3 and "guided_choice" not in server.requests[2].body
        assert quirks.known(quirks.scope(server.base_url, "fake")) == {"refuses_guided_choice"}
        assert quirks.known(server.base_url) == frozenset()  # the server's other models are not judged
        assert outlines.eval(model("b", choices=["yes", "no"]), cache=False, progress=False) == "yes"
        assert server.count == 4 and "guided_choice" not in server.requests[3].body
        other = models.openai_completion("other", base_url=server.base_url, api_key="sk-test")
        assert outlines.eval(other("c", choices=["yes", "no"]), cache=False, progress=False) == "yes"
        assert server.requests[4].body["guided_choice"] == ["yes", "no"]
    quirks.forget()


def test_a_refusal_of_what_one_request_held_is_never_a_quirk(caplog: pytest.LogCaptureFixture) -> None:
    """A strict schema the server refuses: the probe finds response_format taken, so only that request goes without."""
    from outlines.backends import quirks
    from tests.fixtures.fake_openai import Status

    invalid = Status(400, body={"error": {"message": "Invalid schema for response_format 'output': In context=(), "
                                          "'minimum' is not permitted.", "param": "response_format"}})
    answer = json.dumps({"name": "x", "age": 3})
    with FakeOpenAI(reply=lambda prompt, sample, body: answer) as server:
        server.script(invalid)
        model = models.openai("fake", base_url=server.base_url, api_key="sk-test", dialect="openai")
        assert outlines.eval(model("a", json_schema=SCHEMA), cache=False, progress=False) == {"name": "x", "age": 3}
        first, probe, again = (r.body for r in server.requests)
        assert "response_format" in first and probe["response_format"]["json_schema"]["name"] == "probe"
        assert "response_format" not in again and "refused this request's response_format" in caplog.text
        assert quirks.known(quirks.scope(server.base_url, "fake")) == frozenset()
        server.reset()
        assert outlines.eval(model("b", json_schema=SCHEMA), cache=False, progress=False) == {"name": "x", "age": 3}
        assert server.count == 1 and server.requests[0].body["response_format"]["json_schema"]["schema"] == SCHEMA
    quirks.forget()


def test_on_openais_server_choices_and_patterns_go_as_strict_json_schema_never_guided() -> None:
    """No guided_* probed first: one request each, its answer unwrapped from the object it was asked in."""
    def reply(prompt: str, sample: int, body: Any) -> str:
        return json.dumps({"value": "no" if prompt == "choose" else "1234"})

    with FakeOpenAI(reply=reply) as server:
        model = models.openai("fake", base_url=server.base_url, api_key="sk-test", dialect="openai", temperature=0.5)
        chosen, number = outlines.eval(model("choose", choices=["yes", "no"]), model("count", regex="[0-9]+"),
                                       cache=False, progress=False)
        assert (chosen, number) == ("no", "1234") and server.count == 2
        bodies = {r.body["messages"][-1]["content"]: r.body for r in server.requests}
        assert bodies["choose"]["response_format"] == _strict({"type": "string", "enum": ["yes", "no"]})
        assert bodies["count"]["response_format"] == _strict({"type": "string", "pattern": "^(?:[0-9]+)$"})
        assert not any(k.startswith("guided_") for body in bodies.values() for k in body)


def test_a_schema_whose_root_is_not_an_object_is_wrapped_and_unwrapped() -> None:
    array = {"type": "array", "items": {"type": "integer"}, "minItems": 2}
    with FakeOpenAI(honour_constraints=True) as server:
        model = models.openai("fake", base_url=server.base_url, api_key="sk-test")
        assert outlines.eval(model("a", json_schema=array), cache=False, progress=False) == [0, 0]
        (request,) = server.requests
        assert request.body["response_format"] == _strict(array)  # strict: OpenAI takes an object root only


# -- local models: masks ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_model_path: str) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("xgrammar")
    return models.transformers(tiny_model_path, device="cpu", max_tokens=24, seed=7)


def test_mixed_constraints_in_one_batch_are_all_valid(tiny: Any) -> None:
    recording = RecordingBackend(inner=tiny.backend)
    wrapped = recording.model(**tiny.defaults.to_dict())
    prompts = [f"item {i}:" for i in range(5)]
    small = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                              "tag": {"type": "string", "maxLength": 6}},
             "required": ["n", "tag"], "additionalProperties": False}
    picked, coded, records, free = outlines.eval(
        wrapped(prompts, choices=["red", "green", "blue"]), wrapped(prompts, regex=r"[0-9]{2}-[a-z]{2}"),
        wrapped(prompts, json_schema=small), wrapped(prompts), cache=False, progress=False,
    )
    assert set(picked) <= {"red", "green", "blue"}
    assert all(re.fullmatch(r"[0-9]{2}-[a-z]{2}", c) for c in coded)
    assert all(isinstance(r, dict) and set(r) == {"n", "tag"} and 0 <= r["n"] <= 99 for r in records)
    assert recording.sizes == [20]  # one backend call, four kinds of rows
    alone = outlines.eval(tiny(prompts), cache=False, progress=False)
    assert list(alone) == list(free)  # unconstrained rows are untouched by their neighbours' masks


def test_same_seed_same_constrained_outputs_alone_and_in_a_batch(tiny: Any) -> None:
    prompts = [f"q{i}" for i in range(4)]
    batched = outlines.eval(tiny(prompts, regex=r"[a-z]{3}[0-9]"), cache=False, progress=False)
    alone = [outlines.eval(tiny(p, regex=r"[a-z]{3}[0-9]"), cache=False, progress=False) for p in prompts]
    assert list(batched) == alone
    assert all(re.fullmatch(r"[a-z]{3}[0-9]", t) for t in alone)
    greedy = outlines.eval(tiny(prompts, choices=["alpha", "beta"], temperature=0), cache=False, progress=False)
    assert set(greedy) <= {"alpha", "beta"}
    samples = outlines.eval(tiny("q0", regex=r"[a-z]{3}[0-9]", num_samples=6), cache=False, progress=False)
    assert samples.shape == (6,) and len(set(samples)) > 1  # draws are still independent samples
    assert np.all([re.fullmatch(r"[a-z]{3}[0-9]", t) for t in samples])


def test_text_function_with_a_schema_parser_constrains_the_model() -> None:
    seen: list[Any] = []

    class Recorder:
        def __call__(self, prompt: Any, **kwargs: Any) -> Any:
            seen.append(kwargs)
            return model(prompt, **kwargs)

    model = models.from_function(lambda p: '{"name": "Z", "age": 9}', name="text_function_schema")

    @outlines.prompt
    def describe(who):
        """Describe {{ who }} as JSON."""

    extract = outlines.text.function(describe, Recorder(), SCHEMA)
    out = outlines.eval(extract(np.array(["a", "b"], dtype=object)), cache=False, progress=False)
    assert out.shape == (2,) and list(out) == [{"name": "Z", "age": 9}] * 2
    assert seen == [{"json_schema": SCHEMA}]


def test_explain_and_the_run_put_mixed_constraints_in_one_batch() -> None:
    def answer(prompt: str) -> str:
        return "yes" if prompt.startswith("c") else "12" if prompt.startswith("r") else "free"

    backend = RecordingBackend(answer, name="mixed_batch")
    model = backend.model()
    outputs = (model(["c1", "c2"], choices=["yes", "no"]), model(["r1"], regex=r"\d+"), model(["f1"]))
    plan = outlines.explain(*outputs)
    assert "requests: 1" in str(plan)
    values = outlines.eval(*outputs, cache=False, progress=False)
    assert [list(v) for v in values] == [["yes", "yes"], ["12"], ["free"]]
    assert len(backend.batches) == 1 and sorted(backend.batches[0]) == ["c1", "c2", "f1", "r1"]
