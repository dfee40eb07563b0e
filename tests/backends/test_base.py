"""The values that cross the backend protocol: generation parameters, and what pictures ask of a backend."""
from __future__ import annotations

import pytest

from outlines.backends.base import GenerationParams


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

