"""The one normalize-then-hash input of every key: the registry's rules, equal content equal bytes."""
from __future__ import annotations

import numpy as np
import pytest

from outlines.common.keys import canonical, normalize


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
