"""Model constructors and calls refuse unknown options when built, naming the closest valid one (issue 42)."""
from __future__ import annotations

import re
from typing import Any, Callable

import pytest

from outlines import models
from outlines.backends.anthropic import AnthropicBackend
from outlines.draws import Draw
from outlines.backends.transformers import TransformersBackend
from outlines.common.errors import GraphBuildError
from tests.fixtures.fake_openai import FakeOpenAI

echo = models.from_function(lambda prompt: prompt, name="echo")


@pytest.mark.parametrize("call, typo, meant", [
    (lambda: echo(["a", "b"], num_sample=5), "num_sample", "num_samples"),
    (lambda: echo("a", temprature=0.2), "temprature", "temperature"),
    (lambda: echo("a", max_token=3), "max_token", "max_tokens"),
    (lambda: echo("a", choice=["x"]), "choice", "choices"),
])
def test_a_misspelled_call_option_is_refused_when_built(call: Callable[[], Any], typo: str, meant: str) -> None:
    with pytest.raises(GraphBuildError, match=rf"Generate\[function:echo\]: unknown option '{typo}'; "
                                              rf"did you mean {meant}\?"):
        call()


@pytest.mark.parametrize("build, where, typo, meant", [
    (lambda: models.from_function(lambda p: p, name="f", temprature=1.0), "from_function('f')", "temprature",
     "temperature"),
    (lambda: models.from_function(lambda p: p, name="f", max_batchs=4), "from_function('f')", "max_batchs",
     "max_batch"),
    (lambda: models.openai("gpt-4o-mini", api_key="k", temprature=0.2), "models.openai", "temprature",
     "temperature"),
    (lambda: models.openai("gpt-4o-mini", api_key="k", max_concurency=2), "models.openai", "max_concurency",
     "max_concurrency"),
    (lambda: models.openai_completion("m", api_key="k", dialekt="openai"), "models.openai_completion",
     "dialekt", "dialect"),
    (lambda: models.anthropic("claude-haiku-4-5", api_key="k", top_kk=3), "models.anthropic", "top_kk", "top_k"),
    (lambda: models.transformers("/nowhere", temprature=0.2), "models.transformers", "temprature", "temperature"),
])
def test_a_misspelled_constructor_option_is_refused(build: Callable[[], Any], where: str, typo: str,
                                                    meant: str) -> None:
    with pytest.raises(TypeError, match=rf"{re.escape(where)}: unknown option '{typo}'; did you mean {meant}\?"):
        build()


def test_transformers_refuses_an_unknown_option_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(self: TransformersBackend) -> Any:
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(TransformersBackend, "load", load)
    llm = models.transformers("/nowhere", top_k=50, repetition_penalty=1.1, max_tokens=8)  # its own extras
    assert dict(llm.defaults.extra) == {"repetition_penalty": 1.1, "top_k": 50}
    with pytest.raises(GraphBuildError, match="unknown option 'temprature'; did you mean temperature"):
        llm("q", temprature=0.2)
    with pytest.raises(GraphBuildError, match="unknown option 'logit_bias'"):  # an OpenAI parameter
        llm("q", logit_bias={"1": 5})
    with pytest.raises(GraphBuildError, match="unknown option 'extra_body'"):  # no server to pass it to
        llm("q", extra_body={"x": 1})


def test_each_backend_takes_its_own_named_parameters() -> None:
    openai = models.openai("gpt-4o-mini", api_key="k", logit_bias={"1": 2}, presence_penalty=0.5)
    assert dict(openai.defaults.extra) == {"logit_bias": {"1": 2}, "presence_penalty": 0.5}
    with pytest.raises(TypeError, match="models.openai: unknown option 'top_k'"):
        models.openai("gpt-4o-mini", api_key="k", top_k=5)
    claude = models.anthropic("claude-haiku-4-5", api_key="k", top_k=5)
    assert dict(claude.defaults.extra) == {"top_k": 5}
    with pytest.raises(GraphBuildError, match="unknown option 'logit_bias'"):
        claude("q", logit_bias={"1": 2})


def test_extra_body_goes_to_the_server_as_given(fake_openai: FakeOpenAI) -> None:
    llm = models.openai("gpt-4o-mini", base_url=fake_openai.base_url, api_key="k",
                        extra_body={"metadata": {"run": "a"}})
    assert llm("hi", max_tokens=4, extra_body={"service_tier": "default"}).eval(cache=False)
    body = fake_openai.requests[0].body
    assert body["metadata"] == {"run": "a"} and body["service_tier"] == "default" and "extra_body" not in body
    claude = models.anthropic("claude-haiku-4-5", api_key="k", extra_body={"metadata": {"user_id": "u"}})
    (node,) = [claude("hi")]
    assert node.owner is not None
    assert AnthropicBackend.request_body(claude.backend, Draw("hi", node.owner.op.params))["metadata"] == {
        "user_id": "u"}


def test_extra_body_is_checked_for_what_it_must_not_hold() -> None:
    with pytest.raises(ValueError, match="extra_body holds 'temperature', an option of its own"):
        models.openai("gpt-4o-mini", api_key="k", extra_body={"temperature": 0.2})
    with pytest.raises(GraphBuildError, match="extra_body must be a dict"):
        models.openai("gpt-4o-mini", api_key="k")("q", extra_body=["x"])
    with pytest.raises(GraphBuildError, match="unknown option 'extra_body'"):
        echo("q", extra_body={"x": 1})


def test_an_explicit_num_samples_adds_the_sample_axis_even_at_one() -> None:
    import numpy as np

    import outlines

    assert echo(["a", "b"], num_samples=1).eval(cache=False, progress=False).shape == (2, 1)
    assert echo(["a", "b"], num_samples=3).eval(cache=False, progress=False).shape == (2, 3)
    scalar = echo("a", num_samples=1).eval(cache=False, progress=False)
    assert isinstance(scalar, np.ndarray) and scalar.shape == (1,) and scalar.tolist() == ["a"]
    # the default is one draw and adds no axis
    assert echo(["a", "b"]).eval(cache=False, progress=False).shape == (2,)
    assert echo("a").eval(cache=False, progress=False) == "a"

    @outlines.fn(signature="(n)->()", name="joined", pure=True)
    def joined(samples: Any) -> str:
        return "|".join(samples)

    # code written for k samples reduces per element at k = 1, not across the elements
    assert joined(echo(["a", "b"], num_samples=1)).eval(cache=False, progress=False).tolist() == ["a", "b"]
    assert joined(echo(["a", "b"], num_samples=2)).eval(cache=False, progress=False).tolist() == ["a|a", "b|b"]


def test_a_call_names_the_model_for_an_empty_choice_list_and_an_unknown_option() -> None:
    llm = models.from_function(lambda prompt: prompt.upper(), name="upper")
    with pytest.raises(GraphBuildError, match=r"^Generate\[function:upper\]: choices= is empty; give at least one"):
        llm("x", choices=[])
    with pytest.raises(TypeError, match=r"^Generate\[function:upper\]: unknown option 'num_sample'; did you mean "
                                        r"num_samples\?"):
        llm("x", num_sample=2)


def test_the_common_call_uses_the_models_defaults_of_the_moment() -> None:
    # the common call finds its op without hashing the params: it must still follow defaults set after a call
    # (models.fallback sets its defaults once the model is built)
    import outlines

    llm = models.from_function(lambda prompt: prompt, name="echo")
    first = llm(outlines.constant("q"))
    assert first.owner.op.params.max_tokens is None
    assert llm(outlines.constant("r")).owner.op is first.owner.op  # one op per (params, samples)
    llm.defaults = llm.defaults.merged(max_tokens=7)
    again = llm(outlines.constant("q"))
    assert again.owner.op.params.max_tokens == 7
    assert llm(outlines.string("s")).owner.op is again.owner.op
