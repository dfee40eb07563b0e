"""The one normalize-then-hash: the registry's rules, and draw keys pinned byte for byte."""
from __future__ import annotations

import numpy as np
import pytest

from outlines.backends.base import GenerationParams, Draw
from outlines.cache.keys import canonical, draw_key, normalize


def test_normalize_makes_equal_content_equal_data() -> None:
    assert normalize({"b": (1.0, 2.5), 3: [None, True]}) == {"b": [1, 2.5], "3": [None, True]}
    assert canonical({"b": 1, "a": 2}) == canonical({"a": 2.0, "b": 1}) == b'{"a":2,"b":1}'
    assert canonical(np.float64(0.5)) == canonical(0.5) and canonical(np.int64(3)) == b"3"
    assert canonical(np.array(2.0)) == b"2"  # a 0-d array is its scalar


def test_normalize_keeps_apart_what_differs() -> None:
    texts = {canonical(v) for v in (1, True, "1", [1], 1.5, None, {"1": 1})}
    assert len(texts) == 7
    one, two = np.array(["a", "b"], dtype=object), np.array([["a", "b"]], dtype=object)
    assert canonical(one) != canonical(two) != canonical(["a", "b"])


def test_normalize_names_what_it_cannot_key() -> None:
    with pytest.raises(TypeError, match="keys need JSON values; got object"):
        canonical({"a": object()})


def test_normalize_takes_new_types_through_its_registry() -> None:
    class Point:
        def __init__(self, x: float, y: float) -> None:
            self.x, self.y = x, y

    with pytest.raises(TypeError, match="got Point"):
        canonical(Point(1, 2))
    normalize.register(Point, lambda p: {"point": normalize([p.x, p.y])})  # a local class: the entry dies with it
    assert canonical(Point(1.0, 2)) == canonical({"point": [1, 2]})


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


# Computed by the implementation before the normaliser was unified (five
# normalisers, FORMAT 1): existing caches must keep hitting.
_PINNED = [
    (("function", "echo", "0123abcd", False), {}, "hi", 0,
     "b824e18c39e561f735984c2ad3e3c879fd8a17efb204fae80d4ee3d69ec3b4fc"),
    (("openai", "gpt-4o-mini", "https://api.openai.com/v1"),
     {"temperature": 1.0, "max_tokens": 16, "stop": ["\n"], "seed": 3}, "Q: é ✓\n", 7,
     "5dafc15a39fde729db57d25ab15e42ea1a4b67e756f5dec3683b3f04f8b69be7"),
    (("openai-chat", "m", None, "sys"),
     {"temperature": 0.7, "top_p": 0.95, "logit_bias": {"50256": -100.0, "1": 2}, "logprobs": True}, "x" * 50, 123456,
     "96eec02c3fbb8bfdb755e18c9aa59a8e302ab1af67112b40c9aa13d9b0e9fdc6"),
    (("transformers", "/m", "auto", "auto"),
     {"temperature": np.float64(0.5), "response_format": {"type": "json_object"}, "n_extra": [1, 2.0, "a"]},
     "\u2028\x00", 2, "231e5ea2fb664cf1287c64949e0d6e865d4c720590db56a10be47fffd831a589"),
]


@pytest.mark.parametrize(("identity", "params", "prompt", "draw", "expected"), _PINNED)
def test_draw_keys_are_byte_identical_to_the_previous_format(
    identity: tuple, params: dict, prompt: str, draw: int, expected: str
) -> None:
    assert draw_key(identity, Draw(prompt, GenerationParams.create(**params), draw)) == expected


def test_draw_key_of_a_non_string_prompt_uses_canonical_text() -> None:
    params = GenerationParams.create(temperature=0.7)
    fast = draw_key(("f",), Draw("p", params, 3))
    assert draw_key(("f",), Draw(np.str_("p"), params, np.int64(3))) == fast  # type: ignore[arg-type]
