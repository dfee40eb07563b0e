"""outlines.common.conversation: the conversation value, and the messages a backend sends for a prompt."""
from __future__ import annotations

import pickle

import pytest

from outlines import chat
from outlines.common.conversation import Conversation, as_conversation, messages_of


def test_a_conversation_is_canonical_hashable_text() -> None:
    first = Conversation.of([("system", "S"), ("user", "Q")])
    again = Conversation.of([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])
    assert first == again and hash(first) == hash(again) and isinstance(first, str)
    assert first.messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    assert pickle.loads(pickle.dumps(first)).messages == first.messages
    assert (first + "more").messages[-1] == {"role": "user", "content": "more"}
    with pytest.raises(ValueError, match="role must be one of"):
        Conversation.of([("robot", "x")])
    with pytest.raises(TypeError, match="must hold text"):
        Conversation.of([("user", 3)])  # type: ignore[list-item]


def test_messages_of_puts_the_system_prompt_first_unless_there_is_one() -> None:
    assert messages_of("hi", "S") == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    own = Conversation.of([("system", "mine"), ("user", "hi")])
    assert messages_of(own, "S") == own.messages


def test_plain_text_is_one_user_message_and_other_values_are_refused() -> None:
    assert as_conversation("hi").messages == [{"role": "user", "content": "hi"}]
    own = Conversation.of([("assistant", "A")])
    assert as_conversation(own) is own
    with pytest.raises(TypeError, match="built from messages or text, not int"):
        as_conversation(3)


def test_outlines_chat_names_the_same_conversation_type() -> None:
    assert chat.Conversation is Conversation
