"""How things name themselves in pictures and reports: one short line, never a secret.

``shorten`` puts text on one line within a width; ``hide_keys`` stars out
anything shaped like an API key, ``hide_secrets`` the secrets a thing holds. Something a picture names without knowing
its class (a backend, in a graph picture or a timeline) is ``Shown``: it
gives its ``label`` and ``redact``s its own secrets out of any text. Pictures
ask through ``label_of`` and ``redactor``, which answer safely for objects
that are not ``Shown`` (their type's name; only the key pattern hidden).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

__all__ = ["ANYWHERE_FROM", "Shown", "apart", "hide_keys", "hide_secrets", "label_of", "redactor", "shorten"]

_KEY_PATTERN = re.compile(r"\b(sk-[A-Za-z0-9_\-]{3,}|Bearer\s+\S+)")
#: The characters keys are made of: a short secret next to one of them is part of a longer word.
_KEY_CHARACTERS = r"A-Za-z0-9_\-"
#: Secrets this long are hidden wherever they stand (no word holds one by chance); shorter ones as whole tokens.
ANYWHERE_FROM = 16


@runtime_checkable
class Shown(Protocol):
    """What a picture asks of a thing it names (every ``outlines.backends.base.Backend`` is one)."""

    @property
    def label(self) -> str:
        """A short name on one line (``kind: model``): no URL, no secret."""
        ...

    def redact(self, text: str) -> str:
        """``text`` with this thing's own secrets (an API key, a header value) starred out."""
        ...


def shorten(text: str, limit: int = 40) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis.

    Examples
    --------
    >>> shorten("a  long\\n text", 8)
    'a long …'
    """
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def hide_keys(text: str) -> str:
    """``text`` with anything shaped like an API key (``sk-...``, ``Bearer ...``) starred out.

    Examples
    --------
    >>> hide_keys("Authorization: Bearer abc123")
    'Authorization: Bea***'
    """
    return _KEY_PATTERN.sub(lambda m: m.group(0)[:3] + "***", text)


def hide_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``, the longest first.

    A secret of ``ANYWHERE_FROM`` (16) characters or more is hidden wherever
    it stands, even glued to other text (``key%3Dsk-...``); a shorter one (a
    test key such as ``"k"``) only as a whole token: not inside a longer run
    of key characters (letters, digits, ``_``, ``-``), so the words around it
    keep their letters.

    Examples
    --------
    >>> hide_secrets("SocketTimeoutError for k", ["k"])
    'SocketTimeoutError for ***'
    >>> hide_secrets("key=sk-0123456789abcdefXYZ&k=1", ["sk-0123456789abcdefXYZ"])
    'key=***&k=1'
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        if secret not in text:
            continue
        if len(secret) >= ANYWHERE_FROM:
            text = text.replace(secret, "***")
        else:
            text = re.sub(f"(?<![{_KEY_CHARACTERS}]){re.escape(secret)}(?![{_KEY_CHARACTERS}])", "***", text)
    return text


def label_of(thing: Any) -> str:
    """The label ``thing`` gives itself when it is ``Shown``, else its type's name.

    Never its ``repr``: that of an unknown object may hold a secret.

    Examples
    --------
    >>> label_of(object())
    'object'
    """
    if isinstance(thing, Shown):
        return thing.label
    return type(thing).__name__


def apart(labels: dict[str, str]) -> dict[str, str]:
    """``key -> label``, whole, with ``#2``, ``#3``... after a label that an earlier key already has.

    Reports name backends by their labels (``kind: model``) in full, so two
    models print apart; two backends of one label (one model at two base
    URLs) are told apart by number, in the order of their keys.

    Examples
    --------
    >>> apart({"a": "openai: gpt-4o", "b": "openai: gpt-4o-mini", "c": "openai: gpt-4o"})
    {'a': 'openai: gpt-4o', 'b': 'openai: gpt-4o-mini', 'c': 'openai: gpt-4o #2'}
    """
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for key, label in labels.items():
        seen[label] = seen.get(label, 0) + 1
        out[key] = label if seen[label] == 1 else f"{label} #{seen[label]}"
    return out


def redactor(things: Iterable[Any]) -> Callable[[str], str]:
    """One function that passes text through every ``Shown`` thing's ``redact``, then ``hide_keys``.

    Parameters
    ----------
    things
        What the text may speak of (the backends of a graph); anything that is
        not ``Shown`` (``None``, a plain object) adds nothing.

    Returns
    -------
    Callable[[str], str]
    """
    hooks: list[Callable[[str], str]] = []
    seen: set[int] = set()
    for thing in things:
        if id(thing) not in seen and isinstance(thing, Shown):
            seen.add(id(thing))
            hooks.append(thing.redact)

    def redact(text: str) -> str:
        for hook in hooks:
            text = hook(text)
        return hide_keys(text)

    return redact
