"""Generation parameters (``outlines.draws.params``): hashing once, merging, canonical comparison."""
from __future__ import annotations

import pickle

import pytest

from outlines.draws import GenerationParams


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
