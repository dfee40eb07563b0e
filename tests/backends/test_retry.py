"""The pure retry rules: which statuses retry, how Retry-After is read and capped."""
from __future__ import annotations

import email.utils
import math

import pytest
from multidict import CIMultiDict

from outlines.backends.retry import MAX_RETRY_AFTER, parse_retry_after, retry_delay, should_retry

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    "status, expected",
    [(200, False), (400, False), (401, False), (403, False), (404, False), (422, False),
     (408, True), (409, True), (429, True), (500, True), (502, True), (503, True), (599, True)],
)
def test_should_retry_by_status(status: int, expected: bool) -> None:
    assert should_retry(status, {}) is expected


@pytest.mark.parametrize("header, status, expected", [("true", 400, True), ("false", 503, False), ("maybe", 503, True)])
def test_x_should_retry_overrides_status(header: str, status: int, expected: bool) -> None:
    assert should_retry(status, CIMultiDict({"X-Should-Retry": header})) is expected


@pytest.mark.parametrize(
    "value, expected",
    [
        ("0", 0.0),
        ("2", 2.0),
        ("1.5", 1.5),
        (" 7 ", 7.0),
        ("-10", None),
        ("inf", math.inf),
        ("-inf", None),
        ("nan", None),
        ("1e40", 1e40),
        ("soon", None),
        ("", None),
        ("Wed, 99 Foo 2026 25:61:00 GMT", None),
        (email.utils.formatdate(NOW + 30, usegmt=True), 30.0),
        (email.utils.formatdate(NOW - 30, usegmt=True), 0.0),
        (email.utils.formatdate(NOW + 10 * 365 * 86400, usegmt=True), 10 * 365 * 86400.0),
    ],
)
def test_retry_after_table(value: str, expected: float | None) -> None:
    assert parse_retry_after({"Retry-After": value}, now=NOW) == expected


@pytest.mark.parametrize(
    "value, expected", [("1500", 1.5), ("0", 0.0), ("-1", None), ("nan", None), ("x", None), ("1e40", 1e37)]
)
def test_retry_after_ms(value: str, expected: float | None) -> None:
    parsed = parse_retry_after({"retry-after-ms": value}, now=NOW)
    assert parsed == (None if expected is None else pytest.approx(expected))


def test_retry_after_ms_wins_and_headers_are_case_insensitive() -> None:
    assert parse_retry_after({"RETRY-AFTER": "9", "Retry-After-Ms": "250"}) == 0.25
    assert parse_retry_after(CIMultiDict({"retry-after": "3"})) == 3.0
    assert parse_retry_after({}) is None and parse_retry_after(None) is None


@pytest.mark.parametrize(
    "value, delay",
    [
        ("0", "backoff"),  # a zero, tiny or past hint never skips the backoff
        ("0.1", "backoff"),
        (email.utils.formatdate(NOW - 3600, usegmt=True), "backoff"),
        ("2", 2.0),
        ("-10", "backoff"),
        ("nan", "backoff"),
        ("bad date", "backoff"),
        ("inf", None),
        ("1e40", None),
        (email.utils.formatdate(NOW + 86400, usegmt=True), None),
    ],
)
def test_retry_delay_honours_the_hint_up_to_the_cap(value: str, delay: object) -> None:
    hint = parse_retry_after({"retry-after": value}, now=NOW)
    got = retry_delay(0, hint, rand=lambda: 0.0)
    assert got == (0.5 if delay == "backoff" else delay)


def test_backoff_grows_exponentially_with_jitter_and_a_ceiling() -> None:
    assert [retry_delay(a, rand=lambda: 0.0) for a in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert retry_delay(1, rand=lambda: 0.999) == pytest.approx(0.75, abs=1e-3)
    assert retry_delay(10_000, rand=lambda: 0.0) == 8.0  # no overflow


def test_cap_is_configurable() -> None:
    assert retry_delay(0, MAX_RETRY_AFTER) == MAX_RETRY_AFTER
    assert retry_delay(0, MAX_RETRY_AFTER + 1) is None
    assert retry_delay(0, 120.0, max_retry_after=300) == 120.0
