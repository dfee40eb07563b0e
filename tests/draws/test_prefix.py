"""Prefix groups: the radix cut of a batch's prompts, checked against brute force, and its speed."""
from __future__ import annotations

import os
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outlines.draws.prefix import common_prefix_length, prefix_groups


def brute_force(prompts: list, min_head: int) -> list[tuple[int, list[int]]]:
    """Groups by definition: connected by pairwise heads >= min_head; head = all members' common head."""
    def lcp(a, b) -> int:  # noqa: ANN001
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    groups: list[list[int]] = []
    for index, prompt in enumerate(prompts):
        for group in groups:
            if lcp(prompts[group[0]], prompt) >= min_head:
                group.append(index)
                break
        else:
            groups.append([index])
    out = []
    for group in groups:
        head = min(lcp(prompts[group[0]], prompts[m]) for m in group) if len(group) > 1 else 0
        out.append((head, group))
    return out


def test_groups_follow_shared_heads_not_one_common_prefix() -> None:
    a, b = "Few-shot A: 1+1=2. 2+2=4. ", "Few-shot B: 3*3=9. 4*4=16. "
    prompts = [a + "Q: 5+5?", b + "Q: 5*5?", "unrelated", a + "Q: 6+6?", b + "Q: 6*6?", a + "Q: 5+5?"]
    found = prefix_groups(prompts, min_head=12)
    assert list(found.groups()) == [(len(a) + 3, [0, 3, 5]), (len(b) + 3, [1, 4]), (0, [2])]
    assert found.order == [0, 3, 5, 1, 4, 2] and found.sizes == [3, 2, 1]


def test_identical_prompts_share_all_of_themselves_and_short_ones_nothing() -> None:
    assert list(prefix_groups(["same prompt"] * 3, 4).groups()) == [(11, [0, 1, 2])]
    assert list(prefix_groups(["ab", "ab"], 4).groups()) == [(0, [0]), (0, [1])]  # shorter than the min head
    assert prefix_groups([], 4) == ([], [], [])


def test_token_ids_are_grouped_by_tokens() -> None:
    header = [101, 7, 7, 7, 9, 70000]
    ids = [header + [1, 2], [5, 5, 5, 5, 5], header + [3], header + [1, 2, 4], [2**40, 1, 2, 3, 4]]
    found = prefix_groups(ids, 4)
    assert list(found.groups()) == [(6, [0, 2, 3]), (0, [1]), (0, [4])]  # 2**40 needs 8 bytes per id
    assert list(prefix_groups([[1, 2, 3, 256], [1, 2, 3, 257]], 3).groups()) == [(3, [0, 1])]  # bytes part mid-id


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="min_head must be a positive integer"):
        prefix_groups(["a"], 0)
    with pytest.raises(TypeError, match="all be text or all be sequences of integer token ids"):
        prefix_groups(["a", [1, 2]], 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="ab", max_size=9), max_size=14), st.integers(1, 5))
def test_groups_match_the_definition(prompts: list[str], min_head: int) -> None:
    found = prefix_groups(prompts, min_head)
    assert sorted(found.order) == list(range(len(prompts)))
    assert sorted(found.groups(), key=lambda g: g[1]) == sorted(brute_force(prompts, min_head), key=lambda g: g[1])
    firsts = [members[0] for _, members in found.groups()]
    assert firsts == sorted(firsts)  # deterministic: groups in the order of their first member


@given(st.lists(st.lists(st.integers(0, 300), max_size=7), max_size=10), st.integers(1, 4))
@settings(max_examples=100, deadline=None)
def test_token_groups_match_the_definition(ids: list[list[int]], min_head: int) -> None:
    found = prefix_groups(ids, min_head)
    assert sorted(found.groups(), key=lambda g: g[1]) == sorted(brute_force(ids, min_head), key=lambda g: g[1])


def test_common_prefix_length() -> None:
    assert common_prefix_length("abcdef", "abcxyz") == 3
    assert common_prefix_length("abc", "abc") == 3 and common_prefix_length("", "abc") == 0
    assert common_prefix_length(b"\x01\x02\x03", b"\x01\x02\x04", known=1) == 2


def test_ten_thousand_prompts_take_milliseconds() -> None:
    rng = random.Random(0)
    headers = [f"Header {k}: " + "example text. " * 70 for k in range(4)]  # about 1,000 characters each
    shared = [rng.choice(headers) + f"Question {i}: {rng.random()}" for i in range(10_000)]
    unrelated = [f"{rng.random()} question {i}" for i in range(10_000)]
    for prompts, groups in ((shared, 4), (unrelated, 10_000)):
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            found = prefix_groups(prompts, 256)
            best = min(best, time.perf_counter() - start)
        assert len(found.sizes) == groups
        # Measured 2-4 ms unloaded (2 shared cores); generous bound for a busy CI machine.
        assert best < float(os.environ.get("OUTLINES_PREFIX_BOUND_S", "0.1")), best
