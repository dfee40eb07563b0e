"""Chat messages and conversations as graph values.

``system``, ``user`` and ``assistant`` turn text (a str or a string Variable)
into a one-message conversation; ``+`` concatenates conversations (a plain
string operand is a user message). A model called on a conversation continues
it: chat backends send the messages, local models render them through their
chat template. A conversation value is a ``Conversation``
(``outlines.common.conversation``, re-exported here): a ``str`` holding the canonical
JSON of its messages, so it is hashable, JSON-able, a cache-key part as it is,
and an element of NumPy object arrays like any prompt.
"""
from __future__ import annotations

from typing import Any

from outlines.common.conversation import ROLES, Conversation, as_conversation
from outlines.common.errors import GraphBuildError
from outlines.graph.basic import Apply, Op, Variable, as_variable
from outlines.graph.ops import broadcast_map, check_text_input
from outlines.graph.traits import Traits

__all__ = ["Conversation", "ConversationVariable", "assistant", "system", "user"]


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
    traits = Traits(elementwise=True)

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

    traits = Traits(elementwise=True)

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
        Evaluates to an ``outlines.chat.Conversation`` (one per element of
        ``text``); ``+`` appends messages or conversations.

    Raises
    ------
    GraphBuildError
        When ``text`` is not text (a number, a list of lists...).

    Examples
    --------
    >>> from outlines import chat
    >>> conversation = chat.system("Answer briefly.") + chat.user("What is 2 + 2?")
    >>> conversation.eval().messages[1]
    {'role': 'user', 'content': 'What is 2 + 2?'}
    """
    return Message("system")(text)


def user(text: Any) -> Variable:
    """A user message (a one-message conversation Variable); see ``system``.

    A plain string operand of ``+`` on a conversation is a user message too.

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
    >>> chat.user("Hi!").eval().messages
    [{'role': 'user', 'content': 'Hi!'}]
    >>> (chat.system("Be brief.") + "Hi!").eval().messages[-1]
    {'role': 'user', 'content': 'Hi!'}
    """
    return Message("user")(text)


def assistant(text: Any) -> Variable:
    """An assistant message, e.g. a model's answer appended to grow a conversation; see ``system``.

    Parameters
    ----------
    text
        A str, an array of str or a string Variable (such as a model call on
        the conversation so far).

    Returns
    -------
    ConversationVariable

    Examples
    --------
    >>> from outlines import chat, models
    >>> llm = models.from_function(lambda prompt: "Blue.", name="blue")
    >>> talk = chat.user("Name a color.")
    >>> talk = talk + chat.assistant(llm(talk)) + chat.user("Another one?")
    >>> [m["role"] for m in talk.eval().messages]
    ['user', 'assistant', 'user']
    """
    return Message("assistant")(text)
