"""Where an HTTP backend's requests may go: base URLs checked, redirects judged, passwords hidden.

``check_base_url`` accepts an ``http(s)`` URL without credentials and says
what is wrong with any other through ``redact`` (``user:password@`` shown as
``***@``), never chaining the parser's error, which may quote it.
``redirect_target`` is ``http.HTTPClient``'s redirect policy: 307 and 308
(which keep the method and body) are followed, at most ``MAX_REDIRECTS`` hops;
301, 302 and 303 would turn the POST into a GET and are refused, naming the
new address. A hop to another origin (``same_origin``) goes without the API
key and without any header the user supplied, and a later hop back does not
restore them: credentials go to the origin they were given for, never further.
"""
from __future__ import annotations

import re

import yarl

__all__ = ["MAX_REDIRECTS", "REDIRECTS", "RedirectRefused", "check_base_url", "redact", "redirect_target",
           "same_origin", "without_version"]

#: The redirect statuses; only 307 and 308 are followed (``redirect_target``).
REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Redirects followed within one request before it fails.
MAX_REDIRECTS = 3

#: A scheme with its ``//``, or a bare ``//``: what comes before a URL's userinfo.
_PREFIX = re.compile(r"\s*(?:[A-Za-z][A-Za-z0-9+.-]*:)?//")


class RedirectRefused(Exception):
    """A redirect that is not followed; ``http.HTTPClient`` turns it into a ``BackendError`` (not retried)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def redact(url: str) -> str:
    """``url`` with everything before its host's ``@`` (user and password) shown as ``***``.

    Works on text that does not parse as a URL too (no scheme, a stray ``/``
    or ``@`` inside the password): everything between the scheme and the
    last ``@`` is hidden, so it may hide more than the userinfo, never less.

    Examples
    --------
    >>> redact("https://user:secret@example.com/v1")
    'https://***@example.com/v1'
    >>> redact("user:secret@example.com/v1")
    '***@example.com/v1'
    """
    at = url.rfind("@")
    if at < 0:
        return url
    prefix = _PREFIX.match(url)
    start = prefix.end() if prefix is not None and prefix.end() <= at else 0
    return url[:start] + "***" + url[at:]


def _userinfo_parts(url: str) -> list[str]:
    """The user and password candidates of ``url`` (what ``redact`` hides), for checking other text."""
    at = url.rfind("@")
    if at < 0:
        return []
    prefix = _PREFIX.match(url)
    start = prefix.end() if prefix is not None and prefix.end() <= at else 0
    userinfo = url[start:at]
    return [part for part in (userinfo, *userinfo.split(":")) if part]


def check_base_url(url: object, name: str) -> str:
    """``url`` stripped of spaces and a trailing ``/``, once it is a plain ``http(s)`` URL.

    Parameters
    ----------
    url
        The URL as given.
    name
        Where it came from, for the message (``"base_url"``, ``"OPENAI_BASE_URL"``).

    Raises
    ------
    ValueError
        When it does not parse, is not ``http(s)``, has no host, or holds a
        ``user:password@``; the message shows it through ``redact``.

    Examples
    --------
    >>> check_base_url("http://127.0.0.1:8000/v1/", "base_url")
    'http://127.0.0.1:8000/v1'
    """
    if not isinstance(url, str):
        raise ValueError(f"{name} must be a string URL such as https://api.openai.com/v1, got {type(url).__name__}")
    text = url.strip().rstrip("/")
    shown = redact(text)
    problem = None
    try:
        parsed = yarl.URL(text)
        scheme, host, credentials = parsed.scheme, parsed.host, parsed.user is not None or parsed.password is not None
        parsed.port  # noqa: B018 - a port out of range raises here in some yarl versions
    except (ValueError, TypeError) as exc:
        # The parser's message may quote the URL: shown only when it holds no part of the userinfo.
        reason = str(exc)
        safe = not any(part in reason for part in _userinfo_parts(text))
        problem = f"{name} is not a valid URL{f' ({reason})' if safe else ''}: {shown!r}"
    # Raised outside the ``except``: no chained parser error that could quote the password.
    if problem is not None:
        raise ValueError(problem)
    if scheme not in ("http", "https"):
        raise ValueError(f"{name} must be an http(s) URL such as https://api.openai.com/v1, got {shown!r}")
    if not host:
        raise ValueError(f"{name} has no host: {shown!r}")
    if credentials:
        raise ValueError(f"{name} must not hold credentials (user:password@), got {shown!r}; pass api_key= instead")
    return text


def without_version(url: str, version: str) -> str:
    """``url`` (checked by ``check_base_url``) without its last path segment when that is ``version``.

    The base URL convention of every HTTP backend is the API root with its
    version, as OpenAI's is (``https://api.openai.com/v1``,
    ``https://api.anthropic.com/v1``). A backend whose request paths carry
    the version themselves (Anthropic's ``/v1/messages``, as its own SDK
    spells them) takes the URL through this, so both spellings reach the
    same endpoints and the same cache keys.

    Examples
    --------
    >>> without_version("https://api.anthropic.com/v1", "v1"), without_version("https://api.anthropic.com", "v1")
    ('https://api.anthropic.com', 'https://api.anthropic.com')
    """
    head, _, last = url.rpartition("/")
    return head if last == version and "://" in head and not head.endswith("/") else url


def same_origin(one: yarl.URL, other: yarl.URL) -> bool:
    """Whether two URLs share scheme, host and port (the port a scheme implies counts)."""
    return (one.scheme, (one.host or "").lower(), one.port) == (other.scheme, (other.host or "").lower(), other.port)


def redirect_target(status: int, url: yarl.URL, location: str | None) -> yarl.URL:
    """Where the redirect ``status`` from ``url`` to ``location`` goes, if it may be followed.

    Raises
    ------
    RedirectRefused
        For 301, 302 and 303, and for a ``location`` that is missing, not
        ``http(s)`` or holds credentials.
    """
    if location is None:
        raise RedirectRefused(f"the server answered a redirect (HTTP {status}) without a Location", status)
    problem = None
    try:
        target = url.join(yarl.URL(location.strip()))
        scheme, credentials = target.scheme, target.user is not None or target.password is not None
    except (ValueError, TypeError):
        problem = f"the server answered a redirect (HTTP {status}) to an invalid Location {redact(location)!r}"
    if problem is not None:
        raise RedirectRefused(problem, status)
    shown = redact(str(target))
    if scheme not in ("http", "https"):
        raise RedirectRefused(f"the server answered a redirect (HTTP {status}) to {shown}, not an http(s) URL; "
                              "not following it", status)
    if credentials:
        raise RedirectRefused(f"the server answered a redirect (HTTP {status}) to a URL that holds credentials, "
                              f"{shown}; not following it", status)
    if status not in (307, 308):
        raise RedirectRefused(
            f"the server answered a redirect (HTTP {status}) to {shown}, which would turn this POST into a GET; "
            "not following it: set base_url to the new address", status,
        )
    return target
