"""Chat messages and conversations as graph values.

``system``, ``user`` and ``assistant`` turn text (a str or a string Variable)
into a one-message conversation; ``+`` concatenates conversations (a plain
string operand is a user message). A model called on a conversation continues
it: chat backends send the messages, local models render them through their
chat template. A conversation value is a ``Conversation``: a ``str`` holding
the canonical JSON of its messages, so it is hashable, JSON-able, a cache-key
part as it is, and an element of NumPy object arrays like any prompt.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from outlines.errors import GraphBuildError
from outlines.graph.basic import Apply, Op, Variable, as_variable
from outlines.graph.ops import broadcast_map, check_text_input

__all__ = ["Conversation", "ConversationVariable", "assistant", "system", "user"]

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
        """Build a conversation from (role, content) pairs or message dicts."""
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

    def __add__(self, other: Any) -> Conversation:  # type: ignore[override]
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


class ConversationVariable(Variable):
    """A symbolic conversation: ``+`` appends messages instead of joining text."""

    __slots__ = ()

    def __add__(self, other: Any) -> Variable:
        return Extend()(self, other)

    def __radd__(self, other: Any) -> Variable:
        return Extend()(other, self)


def _conversation_node(op: Op, inputs: list[Variable]) -> Apply:
    node = Apply(op, inputs)
    node.outputs = (ConversationVariable(node, 0),)
    return node


class Message(Op):
    """Wrap text as a one-message conversation with ``role``, elementwise."""

    __props__ = ("role",)
    elementwise = True

    def __init__(self, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        self.role = role

    @property
    def name(self) -> str:
        return f"Message[{self.role}]"

    def make_node(self, *inputs: Any) -> Apply:
        if len(inputs) != 1:
            raise GraphBuildError(f"{self.name} takes exactly one text, got {len(inputs)} arguments")
        text = as_variable(inputs[0], array=True)
        check_text_input(self, text, "the message")
        return _conversation_node(self, [text])

    def perform(self, text: Any) -> Any:
        return broadcast_map(self._wrap, [text])

    def _wrap(self, text: Any) -> Conversation:
        if isinstance(text, Conversation) or not isinstance(text, str):
            raise TypeError(f"{self.name}: a message holds text, got {type(text).__name__} {text!r:.60}")
        return Conversation.of([(self.role, text)])


class Extend(Op):
    """Concatenate conversations (plain text is a user message), elementwise."""

    elementwise = True

    @property
    def name(self) -> str:
        return "Conversation+"

    def make_node(self, *inputs: Any) -> Apply:
        variables = [as_variable(x, array=True) for x in inputs]
        for variable in variables:
            check_text_input(self, variable, "each operand of +")
        return _conversation_node(self, variables)

    def perform(self, *values: Any) -> Any:
        return broadcast_map(_extend, values)


def _extend(*parts: Any) -> Conversation:
    total = as_conversation(parts[0])
    for part in parts[1:]:
        total = total + part
    return total


def system(text: Any) -> Variable:
    """A system message (a one-message conversation Variable).

    Parameters
    ----------
    text
        A str, an array of str or a string Variable.

    Returns
    -------
    ConversationVariable

    Examples
    --------
    >>> from outlines import chat
    >>> conversation = chat.system("Answer briefly.") + chat.user("What is 2 + 2?")
    >>> conversation.eval().messages[1]
    {'role': 'user', 'content': 'What is 2 + 2?'}
    """
    return Message("system")(text)


def user(text: Any) -> Variable:
    """A user message (a one-message conversation Variable); see ``system``."""
    return Message("user")(text)


def assistant(text: Any) -> Variable:
    """An assistant message, e.g. a model's answer appended to grow a conversation; see ``system``."""
    return Message("assistant")(text)


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
