"""outlines.common.labels: one-line text, hidden keys, and what a picture asks of a thing it names."""
from __future__ import annotations

from outlines.common.labels import Shown, hide_keys, hide_secrets, label_of, redactor, shorten


class Named:
    """Shown without being a backend: the protocol is structural."""

    def __init__(self, label: str, secret: str) -> None:
        self._label, self._secret = label, secret

    @property
    def label(self) -> str:
        return self._label

    def redact(self, text: str) -> str:
        return text.replace(self._secret, "***")


def test_shorten_puts_text_on_one_line_within_the_limit() -> None:
    assert shorten("a\n  b\tc") == "a b c"
    assert shorten("x" * 50, 10) == "x" * 9 + "…" and len(shorten("y" * 500)) == 40


def test_hide_keys_stars_out_key_shaped_text_only() -> None:
    assert hide_keys("key sk-abcdef123456 and Bearer tok.en") == "key sk-*** and Bea***"
    assert hide_keys("a sketch of sk-ab") == "a sketch of sk-ab"  # too short to be a key


def test_a_shown_thing_gives_its_label_and_others_only_their_type() -> None:
    named = Named("kind: model", "hunter2")
    assert isinstance(named, Shown) and label_of(named) == "kind: model"

    class Holder:
        def __repr__(self) -> str:
            return "Holder(api_key='hunter2')"  # a repr may hold a secret: never used

    assert label_of(Holder()) == "Holder" and label_of(None) == "NoneType"


def test_short_secrets_are_hidden_as_whole_tokens_long_ones_anywhere() -> None:
    """Issue 38, item 15: a one-letter key must not star out the letters of ordinary words."""
    assert hide_secrets("SocketTimeoutError: k refused (k)", ["k"]) == "SocketTimeoutError: *** refused (***)"
    assert hide_secrets("kk k-1 x_k key=k.", ["k"]) == "kk k-1 x_k key=***."
    long = "sk-proj-0123456789abcdef"
    assert hide_secrets(f"key%3D{long}x and {long}", [long]) == "key%3D***x and ***"  # glued to text: still hidden
    assert hide_secrets("abc abcdef", ["abc", "abcdef", ""]) == "*** ***"  # the longest first


def test_the_redactor_asks_every_shown_thing_once_then_hides_keys() -> None:
    calls: list[str] = []
    first, second = Named("a", "hunter2"), Named("b", "swordfish")
    original = first.redact
    first.redact = lambda text: calls.append(text) or original(text)  # type: ignore[method-assign]
    redact = redactor([first, None, object(), second, first])
    assert redact("hunter2 swordfish sk-abcdef123456 plain") == "*** *** sk-*** plain"
    assert len(calls) == 1  # the same thing twice is asked once
    assert redactor([])("Bearer xyz hunter2") == "Bea*** hunter2"  # nothing Shown: the key pattern only
