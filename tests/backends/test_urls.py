"""Base URLs and redirects: passwords never shown, credentials never sent to another origin.

The base-URL checks (issue 27, item 2) run through every way a URL reaches a
backend: the ``base_url`` argument and ``OPENAI_BASE_URL``, for both OpenAI
constructors and the HTTP client itself. The redirect rules (item 1) are pure
functions here; ``test_http_faults.py`` follows them between two real servers.
"""
from __future__ import annotations

import traceback
from typing import Any

import pytest
import yarl

from outlines import models
from outlines.backends import urls
from outlines.backends.http import HTTPClient

PASSWORD = "hunter2PW"

BAD_URLS = [
    f"ftp://user:{PASSWORD}@example.com/v1",  # another scheme
    f"user:{PASSWORD}@example.com/v1",  # no scheme
    f"//user:{PASSWORD}@example.com/v1",  # scheme-relative
    f"http://user:{PASSWORD}@example.com/v1",  # http with userinfo
    f"https://user:{PASSWORD}@example.com:99999/v1",  # a port out of range
    f"http://user:{PASSWORD}@/v1",  # no host
    f"http://user:{PASSWORD}@[::1/v1",  # a broken IPv6 host
    f"http://user:p@ss/{PASSWORD}@example.com/v1",  # an unescaped '/' inside the password
    f"  http://:{PASSWORD}@example.com/v1",  # a password without a user
    f"mailto:user:{PASSWORD}@example.com",
]


def _shown(exc: BaseException) -> str:
    """Everything a user could see of an exception: message, repr, the whole printed traceback."""
    return str(exc) + repr(exc) + "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("url", BAD_URLS)
@pytest.mark.parametrize("through", ["argument", "environment"])
@pytest.mark.parametrize("constructor", [models.openai, models.openai_completion])
def test_a_bad_base_url_is_refused_without_showing_its_password(
    monkeypatch: pytest.MonkeyPatch, url: str, through: str, constructor: Any
) -> None:
    if through == "environment":
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        options: dict[str, Any] = {}
    else:
        monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
        options = {"base_url": url}
    with pytest.raises(ValueError) as caught:
        constructor("m", api_key="sk-x", **options)
    assert PASSWORD not in _shown(caught.value)
    assert ("OPENAI_BASE_URL" if through == "environment" else "base_url") in str(caught.value)
    assert "***" in str(caught.value)  # the URL is shown, its userinfo hidden


@pytest.mark.parametrize("url", BAD_URLS)
def test_the_http_client_refuses_them_too(url: str) -> None:
    with pytest.raises(ValueError) as caught:
        HTTPClient(url)
    assert PASSWORD not in _shown(caught.value)


@pytest.mark.parametrize(
    "text, shown",
    [
        ("http://u:pw@h:1/v1", "http://***@h:1/v1"),
        ("u:pw@h/v1", "***@h/v1"),
        ("http://h/v1", "http://h/v1"),
        ("http://u:p@ss@h/v1?x=1", "http://***@h/v1?x=1"),
        ("https://u:p/w@h/v1", "https://***@h/v1"),
        ("no url here", "no url here"),
    ],
)
def test_redact_hides_userinfo_however_the_url_is_written(text: str, shown: str) -> None:
    assert urls.redact(text) == shown


def test_a_good_base_url_is_kept() -> None:
    assert urls.check_base_url(" http://127.0.0.1:8000/v1/ ", "base_url") == "http://127.0.0.1:8000/v1"
    backend = models.openai("m", base_url="https://example.com/v1", api_key="sk-x").backend
    assert backend.base_url == "https://example.com/v1"


# -- redirects: the pure rules ------------------------------------------------------------
HERE = yarl.URL("https://api.example.com/v1/chat/completions")


@pytest.mark.parametrize(
    "location, target, same",
    [
        ("/v2/chat/completions", "https://api.example.com/v2/chat/completions", True),
        ("https://API.example.com:443/v2", "https://api.example.com:443/v2", True),
        ("http://api.example.com/v1/chat/completions", "http://api.example.com/v1/chat/completions", False),
        ("https://api.example.com:8443/v1", "https://api.example.com:8443/v1", False),
        ("https://evil.example.net/collect", "https://evil.example.net/collect", False),
    ],
)
def test_a_307_or_308_is_followed_and_another_origin_is_told(location: str, target: str, same: bool) -> None:
    for status in (307, 308):
        found = urls.redirect_target(status, HERE, location)
        assert found == yarl.URL(target)
        assert urls.same_origin(HERE, found) is same


@pytest.mark.parametrize(
    "status, location, message",
    [
        (301, "https://api.example.com/v2", r"redirect \(HTTP 301\) to https://api.example.com/v2.*base_url"),
        (303, "/elsewhere", r"HTTP 303.*https://api.example.com/elsewhere"),
        (307, None, "without a Location"),
        (308, "ftp://files.example.com/x", "not an http"),
        (307, f"https://u:{PASSWORD}@evil.example.net/", r"holds credentials.*https://\*\*\*@evil.example.net/"),
    ],
)
def test_redirects_that_are_refused(status: int, location: str | None, message: str) -> None:
    with pytest.raises(urls.RedirectRefused, match=message) as caught:
        urls.redirect_target(status, HERE, location)
    assert PASSWORD not in _shown(caught.value) and caught.value.status == status


@pytest.mark.parametrize("given", ["https://proxy.example/anthropic/v1", "https://proxy.example/anthropic",
                                   "https://proxy.example/anthropic/v1/"])
@pytest.mark.parametrize("through", ["argument", "environment"])
def test_one_base_url_convention_for_both_native_backends(
    monkeypatch: pytest.MonkeyPatch, given: str, through: str
) -> None:
    """The API root with its version, as for OpenAI; Anthropic's SDK spelling without /v1 is the same URL."""
    if through == "environment":
        monkeypatch.setenv("ANTHROPIC_BASE_URL", given)
    claude = models.anthropic("claude-x", api_key="k", **({"base_url": given} if through == "argument" else {}))
    backend = claude.backend
    assert backend.base_url + backend.path == "https://proxy.example/anthropic/v1/messages"
    assert backend.identity[2] == "https://proxy.example/anthropic"  # one identity: one cache key for both
    gpt = models.openai("gpt-x", api_key="k", base_url="https://proxy.example/openai/v1").backend
    assert gpt.base_url + gpt.path == "https://proxy.example/openai/v1/chat/completions"
