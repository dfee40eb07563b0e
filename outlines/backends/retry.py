"""Retry rules for HTTP backends, as small pure functions.

``should_retry`` says whether a response status is worth another try,
``parse_retry_after`` reads the server's ``Retry-After`` / ``retry-after-ms``
hint, and ``retry_delay`` turns an attempt number and that hint into seconds
to wait (exponential backoff with jitter, or the hint when it is longer; a
hint never shortens the backoff), or ``None`` when the server asks
for a wait longer than the cap: the caller then fails fast instead of hanging.
"""
from __future__ import annotations

import email.utils
import math
import random
import time
from typing import Callable, Mapping

__all__ = [
    "MAX_RETRY_AFTER",
    "RETRY_STATUSES",
    "parse_retry_after",
    "retry_delay",
    "should_retry",
]

#: Statuses retried besides every 5xx: timeout, conflict (lock), rate limit.
RETRY_STATUSES = frozenset({408, 409, 429})
#: The longest Retry-After (seconds) honoured; a longer one fails fast.
MAX_RETRY_AFTER = 60.0
INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 8.0


def should_retry(status: int, headers: Mapping[str, str] | None = None) -> bool:
    """Whether a response with this status (and headers) should be retried.

    Parameters
    ----------
    status
        HTTP status code.
    headers
        Response headers; an ``x-should-retry: true|false`` header, as sent
        by the OpenAI API, overrides the status rule.

    Returns
    -------
    bool
        True for 408, 409, 429 and every 5xx; False for everything else.

    Examples
    --------
    >>> should_retry(429), should_retry(503), should_retry(400)
    (True, True, False)
    """
    override = _header(headers, "x-should-retry")
    if override is not None and override.strip().lower() in ("true", "false"):
        return override.strip().lower() == "true"
    return status in RETRY_STATUSES or 500 <= status <= 599


def parse_retry_after(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """The wait, in seconds, that the server asks for; ``None`` when absent or unreadable.

    Parameters
    ----------
    headers
        Response headers. ``retry-after-ms`` (milliseconds) wins over
        ``Retry-After`` (seconds, or an HTTP date).
    now
        Current time as a Unix timestamp, for dates (default: ``time.time()``).

    Returns
    -------
    float or None
        Seconds, ``>= 0``; possibly huge or ``inf`` (callers cap it). Negative,
        NaN and unparseable values give ``None``; a date in the past gives 0.

    Examples
    --------
    >>> parse_retry_after({"retry-after-ms": "1500"})
    1.5
    >>> parse_retry_after({"Retry-After": "-10"}) is None
    True
    """
    millis = _number(_header(headers, "retry-after-ms"))
    if millis is not None:
        return millis / 1000.0
    raw = _header(headers, "retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    try:
        parsed = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if parsed is None or parsed.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, parsed.timestamp() - current)


def retry_delay(
    attempt: int,
    retry_after: float | None = None,
    *,
    max_retry_after: float = MAX_RETRY_AFTER,
    initial: float = INITIAL_BACKOFF,
    maximum: float = MAX_BACKOFF,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """Seconds to wait before retry number ``attempt + 1``.

    Parameters
    ----------
    attempt
        How many attempts failed so far, minus one (0 after the first failure).
    retry_after
        The server's hint from ``parse_retry_after``, if any.
    max_retry_after
        The longest hint honoured.
    initial, maximum
        Backoff bounds: ``initial * 2**attempt`` capped at ``maximum``.
    rand
        Source of jitter in ``[0, 1)``; the backoff is scaled by ``1 - 0.25 * rand()``.

    Returns
    -------
    float or None
        Jittered backoff, or the hint when it is longer (and within the
        cap); ``None`` when the hint exceeds ``max_retry_after`` (do not retry).

    Examples
    --------
    >>> retry_delay(0, 2.0)
    2.0
    >>> retry_delay(0, 0.0, rand=lambda: 0.0)
    0.5
    >>> retry_delay(2, rand=lambda: 0.0)
    2.0
    >>> retry_delay(0, 3600.0) is None
    True
    """
    if retry_after is not None and retry_after > max_retry_after:
        return None
    backoff = min(maximum, initial * 2.0 ** min(attempt, 32)) * (1.0 - 0.25 * rand())
    # The hint is a floor, never a way around backoff: ``Retry-After: 0`` or a
    # date in the past still waits, so a failing server is not hammered.
    return backoff if retry_after is None else max(retry_after, backoff)


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        # Plain dicts are case-sensitive; CIMultiDict and friends are not.
        lowered = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == lowered), None)
    return value


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if math.isnan(value) or value < 0:
        return None
    return value
