"""Elementwise machinery shared by every op: ``broadcast_map`` and its guards."""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from outlines.common.errors import Failure
from outlines.graph.basic import Apply, Constant
from outlines.graph.ops import all_text, broadcast_map


def _failure(exc: BaseException) -> Failure:
    return Failure.from_exception("f#1", "f", exc)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-5, 5), max_size=40), bad=st.sets(st.integers(-5, 5), max_size=3))
def test_a_guarded_map_calls_each_element_once_and_only_the_raising_ones_fail(values: list[int], bad: set[int]) -> None:
    calls: list[int] = []

    def fn(x: int, y: int) -> int:
        calls.append(x)
        if x in bad:
            raise ValueError(f"bad {x}")
        return x * y

    array = np.empty(len(values), dtype=object)
    array[:] = values
    out = broadcast_map(fn, [array, 3], on_error=_failure, on_failed_input=lambda f: f.skipped("f#1", "f"))
    assert calls == values  # each element once, in order, whatever raised before it
    for value, result in zip(values, out.tolist()):
        if value in bad:
            assert isinstance(result, Failure) and f"bad {value}" in result.message
        else:
            assert result == value * 3


def test_a_failed_input_skips_its_element_and_the_others_still_run() -> None:
    failed = _failure(RuntimeError("upstream"))
    array = np.empty(3, dtype=object)
    array[:] = ["a", failed, "c"]
    seen: list[Any] = []
    out = broadcast_map(lambda x: seen.append(x) or x.upper(), [array], on_error=_failure,
                        on_failed_input=lambda f: f.skipped("g#2", "g"))
    assert seen == ["a", "c"] and out[0] == "A" and out[2] == "C"
    assert isinstance(out[1], Failure) and out[1].node == "g#2"


def test_all_text_holds_for_exact_str_only() -> None:
    class Text(str):
        pass

    assert all_text(["a", "b" * 10_000, ""]) and all_text(()) and all_text(("x",))
    for odd in (None, 1, b"a", ["a"], 1.5, Text("b")):  # a subclass: the caller looks closer
        assert not all_text(["a", odd, "b"])
