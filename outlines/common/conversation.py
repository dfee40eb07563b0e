"""A conversation as a value: chat messages held as one canonical, hashable ``str``.

A ``Conversation`` is what a conversation Variable (``outlines.chat``)
evaluates to and what a model receives as its prompt: chat backends send its
messages, local models render them through their chat template. It lives
below the graph and the backends so that both can read it; ``messages_of``
is how a backend turns any prompt into the messages it sends.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

__all__ = ["ROLES", "Conversation", "as_conversation", "messages_of"]

ROLES = ("system", "user", "assistant")


class Conversation(str):
    """Messages ``[{"role": ..., "content": ...}, ...]``; the text is their canonical JSON.

    Examples
    --------
    >>> c = Conversation.of([("user", "hi")])
    >>> c.messages
    [{'role': 'user', 'content': 'hi'}]
    """

    @classmethod
    def of(cls, messages: Sequence[tuple[str, str]] | Sequence[dict[str, str]]) -> Conversation:
        """Build a conversation from (role, content) pairs or message dicts.

        Parameters
        ----------
        messages
            ``[("system", "..."), ("user", "...")]`` or
            ``[{"role": "user", "content": "..."}]``; roles are ``system``,
            ``user`` and ``assistant``.

        Returns
        -------
        Conversation

        Raises
        ------
        ValueError
            For an unknown role.
        TypeError
            For content that is not a ``str``.

        Examples
        --------
        >>> Conversation.of([{"role": "user", "content": "hi"}]) == Conversation.of([("user", "hi")])
        True
        """
        pairs = [(m["role"], m["content"]) if isinstance(m, dict) else tuple(m) for m in messages]
        for role, content in pairs:
            if role not in ROLES:
                raise ValueError(f"a message role must be one of {', '.join(ROLES)}, got {role!r}")
            if not isinstance(content, str):
                raise TypeError(f"a {role} message must hold text, got {type(content).__name__} {content!r:.60}")
        return cls(json.dumps({"messages": [[r, c] for r, c in pairs]}, ensure_ascii=False, separators=(",", ":")))

    @property
    def messages(self) -> list[dict[str, str]]:
        """The messages as OpenAI-style dicts (what chat templates and chat APIs take)."""
        return [{"role": role, "content": content} for role, content in json.loads(self)["messages"]]

    def __add__(self, other: Any) -> Conversation:
        return Conversation.of([(m["role"], m["content"]) for m in self.messages + as_conversation(other).messages])

    def __radd__(self, other: Any) -> Conversation:
        return as_conversation(other) + self

    def __repr__(self) -> str:
        return f"Conversation({self.messages!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Conversation, (str(self),))


def as_conversation(value: Any) -> Conversation:
    """A conversation as it is; a plain string as one user message."""
    if isinstance(value, Conversation):
        return value
    if isinstance(value, str):
        return Conversation.of([("user", value)])
    raise TypeError(f"a conversation is built from messages or text, not {type(value).__name__} {value!r:.60}")


def messages_of(prompt: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """The messages a chat model receives for ``prompt``.

    A ``Conversation`` gives its own messages; any other string is one user
    message. ``system_prompt`` (a model option) comes first unless the
    conversation starts with its own system message.
    """
    messages = prompt.messages if isinstance(prompt, Conversation) else [{"role": "user", "content": prompt}]
    if system_prompt is not None and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages
