"""Draw keys: pinned byte for byte, the same one by one and by the batch."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from outlines.draws import Draw, GenerationParams
from outlines.cache.keys import draw_key, draw_keys
from outlines.cache.sqlite import FORMAT
from outlines.common.keys import canonical


# Pinned when the format became 2 (16-byte BLAKE2b keys; format 1's SHA-256
# hex keys live in draws-v1 files, which this version never opens): a change
# to any of these is a format change and must bump FORMAT.
_PINNED = [
    (("function", "echo", "0123abcd", False), {}, "hi", 0, "8a381786c29a5d79629d825c0bc41557"),
    (("openai", "gpt-4o-mini", "https://api.openai.com/v1"),
     {"temperature": 1.0, "max_tokens": 16, "stop": ["\n"], "seed": 3}, "Q: é ✓\n", 7,
     "abfd5ce591f56659dcd6bfa5a224bc2a"),
    (("openai-chat", "m", None, "sys"),
     {"temperature": 0.7, "top_p": 0.95, "logit_bias": {"50256": -100.0, "1": 2}, "logprobs": True}, "x" * 50, 123456,
     "675c1708117cef7f912782b809177eea"),
    (("transformers", "/m", "auto", "auto"),
     {"temperature": np.float64(0.5), "response_format": {"type": "json_object"}, "n_extra": [1, 2.0, "a"]},
     "\u2028\x00", 2, "1eed869cfa311af3acf4cac7841ce10f"),
]


@pytest.mark.parametrize(("identity", "params", "prompt", "draw", "expected"), _PINNED)
def test_draw_keys_are_pinned_byte_for_byte(identity: tuple, params: dict, prompt: str, draw: int, expected: str) -> None:
    request = Draw(prompt, GenerationParams.create(**params), draw)
    assert draw_key(identity, request).hex() == expected
    # The documented recipe, spelled out without the shortcuts draw_key takes.
    shared = canonical(["outlines.draw", FORMAT, list(identity), request.params.to_dict()])
    recipe = hashlib.blake2b(shared + b"\0" + canonical([prompt, draw]), digest_size=16).hexdigest()
    assert recipe == expected


def test_draw_key_of_a_non_string_prompt_uses_canonical_text() -> None:
    params = GenerationParams.create(temperature=0.7)
    fast = draw_key(("f",), Draw("p", params, 3))
    assert draw_key(("f",), Draw(np.str_("p"), params, np.int64(3))) == fast  # type: ignore[arg-type]


def test_a_batch_of_keys_equals_the_keys_one_by_one() -> None:
    # Several params objects (equal and not) and non-str prompts in one batch.
    warm, cold = GenerationParams.create(temperature=0.7), GenerationParams.create(temperature=0.0)
    requests = [Draw("a", warm, 0), Draw("a", warm, 1), Draw("a", cold, 0), Draw("a", GenerationParams.create(temperature=0.7), 0),
                Draw(np.str_("b"), warm, np.int64(2)), Draw("a", warm, 0)]  # type: ignore[arg-type]
    keys = draw_keys(("f",), requests)
    assert keys == [draw_key(("f",), r) for r in requests]
    assert keys[0] == keys[3] == keys[5] and len({keys[0], keys[1], keys[2], keys[4]}) == 4
    assert draw_keys(("f",), []) == []
