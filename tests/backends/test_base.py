"""The values that cross the backend protocol (params, draws, their slots and batches of them), and what pictures ask of a backend."""
from __future__ import annotations

import pickle

import pytest

from outlines.backends.base import Draw, DrawBatch, GenerationParams, Slot

PARAMS = GenerationParams.create(temperature=0.5)


def test_a_draw_batch_is_a_sequence_of_draws_held_as_columns() -> None:
    draws = [Draw("a", PARAMS, 0), Draw("b", PARAMS, 2), Draw("a", GenerationParams(), 1)]
    batch = DrawBatch.of(draws)
    assert batch.prompts == ["a", "b", "a"] and batch.numbers == [0, 2, 1]
    assert list(batch) == draws and batch[1] == draws[1] and len(batch) == 3
    assert batch[1:] == draws[1:] and isinstance(batch[1:], DrawBatch)
    assert batch == draws and batch == DrawBatch.of(draws) and batch != draws[:2]
    assert DrawBatch.of(batch) is batch
    assert batch.take([2, 0]) == [draws[2], draws[0]]
    assert pickle.loads(pickle.dumps(batch)) == batch  # it crosses to Dask workers


def test_a_batch_splits_by_slot_in_the_order_of_each_slots_first_draw() -> None:
    one = DrawBatch(["a", "b"], [PARAMS, PARAMS], [3, 3])
    assert one.slot == Slot(PARAMS, 3) and one.by_slot() == [(Slot(PARAMS, 3), None)]
    mixed = DrawBatch(["a", "b", "a", "c"], [PARAMS, PARAMS, PARAMS, GenerationParams()], [1, 0, 0, 1])
    assert mixed.slot is None
    assert mixed.by_slot() == [(Slot(PARAMS, 1), [0]), (Slot(PARAMS, 0), [1, 2]), (Slot(GenerationParams(), 1), [3])]
    equal = GenerationParams.create(temperature=0.5)  # equal params, another object: the same slot
    assert DrawBatch(["a", "b"], [PARAMS, equal], [0, 0]).by_slot() == [(Slot(PARAMS, 0), None)]
    assert DrawBatch([], [], []).by_slot() == [] and DrawBatch([], [], []).slot is None


def test_params_hash_once_equal_params_hash_equal_and_pickle_without_their_hash() -> None:
    first = GenerationParams.create(temperature=0.5, stop=["\n"], logit_bias={"1": 2})
    second = GenerationParams.create(logit_bias={"1": 2}, stop="\n", temperature=0.5)
    assert first == second and hash(first) == hash(second)
    assert {first: 1}[second] == 1
    assert hash(first) != hash(GenerationParams.create(temperature=0.6, stop=["\n"], logit_bias={"1": 2}))
    copy = pickle.loads(pickle.dumps(first))
    assert copy == first and "_hash" not in pickle.loads(pickle.dumps(GenerationParams())).__dict__


def test_merged_without_overrides_is_the_same_params_and_with_them_a_validated_copy() -> None:
    base = GenerationParams.create(temperature=0.5, logit_bias={"1": 2})
    assert base.merged() is base and base.merged(max_tokens=None, stop=None) is base
    changed = base.merged(max_tokens=8, stop="x", presence_penalty=0.1)
    assert changed.max_tokens == 8 and changed.stop == ("x",) and changed.temperature == 0.5
    assert dict(changed.extra) == {"logit_bias": {"1": 2}, "presence_penalty": 0.1}
    assert base.max_tokens is None and dict(base.extra) == {"logit_bias": {"1": 2}}
    with pytest.raises(ValueError, match="max_tokens"):
        base.merged(max_tokens=0)


def test_generation_params_compare_by_canonical_text_and_keep_their_values() -> None:
    first = GenerationParams.create(logit_bias={"a": 1, "b": 2}, penalty=1.0)
    second = GenerationParams.create(logit_bias={"b": 2, "a": 1}, penalty=1)
    assert first == second and hash(first) == hash(second)
    assert GenerationParams.create(logprobs=True) != GenerationParams.create(logprobs=1)
    assert type(first.to_dict()["penalty"]) is float  # the wire gets the value as given
    assert GenerationParams.create(response_format={}).to_dict() == {"response_format": {}}
    values = {"a": [1]}
    params = GenerationParams.create(logit_bias=values)
    values["a"].append(2)  # the caller's dict is not the params' dict
    params.to_dict()["logit_bias"]["a"].append(3)
    assert params.to_dict() == {"logit_bias": {"a": [1]}}
    with pytest.raises(ValueError, match="generation parameter 'hook' must be JSON data"):
        GenerationParams.create(top_k=3, hook=object())


# -- what pictures ask of a backend (outlines.labels.Shown) -----------------------------
def test_every_backend_is_shown_by_a_label_without_its_url() -> None:
    from outlines.backends.function import FunctionBackend
    from outlines.backends.openai import OpenAIChatBackend, OpenAICompletionBackend
    from outlines.backends.transformers import TransformersBackend
    from outlines.labels import Shown, label_of

    url = "http://127.0.0.1:9/v1"
    backends = {
        OpenAIChatBackend("gpt-x", base_url=url, api_key="k"): "openai: gpt-x",
        OpenAICompletionBackend("tiny", base_url=url, api_key="k"): "openai_completion: tiny",
        TransformersBackend("/tmp/models/tiny-gpt2"): "transformers: tiny-gpt2",
        FunctionBackend(str.upper, name="upper", version="1"): "function: upper",
    }
    for backend, label in backends.items():
        assert isinstance(backend, Shown) and label_of(backend) == label
        assert "127.0.0.1" not in backend.label and "/tmp" not in backend.label


def test_a_backend_redacts_its_own_secrets_however_they_look() -> None:
    from outlines.backends.fallback import FallbackBackend
    from outlines.backends.function import FunctionBackend
    from outlines.backends.openai import OpenAIChatBackend

    url = "http://127.0.0.1:9/v1"
    first = OpenAIChatBackend("a", base_url=url, api_key="hunter2-not-key-shaped", headers={"X-Org": "org-swordfish"})
    second = OpenAIChatBackend("b", base_url=url, api_key="correct-horse")
    text = "sent hunter2-not-key-shaped, org-swordfish and correct-horse"
    assert first.redact(text) == "sent ***, *** and correct-horse"
    chain = FallbackBackend([first, second])
    assert chain.redact(text) == "sent ***, *** and ***" and chain.label == "fallback: a"
    assert FunctionBackend(str.upper, name="upper", version="1").redact(text) == text  # it holds no secret
