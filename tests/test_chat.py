"""outlines.chat: message Variables and the conversations they evaluate to."""
from __future__ import annotations

import numpy as np
import pytest

import outlines
from outlines import chat, models
from outlines.chat import Conversation


def test_messages_concatenate_elementwise_over_arrays() -> None:
    question = outlines.string("question")
    conversation = chat.system("Be brief.") + chat.user(question) + "Thanks."
    value = conversation.eval({question: ["a", "b"]})
    assert isinstance(value, np.ndarray) and value.shape == (2,)
    assert [m["content"] for m in value[1].messages] == ["Be brief.", "b", "Thanks."]


def test_a_model_called_on_a_conversation_grows_it_and_caches_it(tmp_path) -> None:
    seen: list[str] = []

    def echo(prompt: str) -> str:
        seen.append(prompt)
        return f"{len(Conversation(prompt).messages)} messages"

    llm = models.from_function(echo, name="echo")
    conversation = chat.user("hi")
    grown = conversation + chat.assistant(llm(conversation)) + chat.user("and?")
    cache = outlines.cache.Cache(tmp_path)
    final = llm(grown)
    assert final.eval(cache=cache) == "3 messages"
    assert final.eval(cache=cache) == "3 messages" and len(seen) == 2  # the second run replays both draws


def test_a_message_of_a_non_string_is_a_build_error() -> None:
    with pytest.raises(outlines.GraphBuildError):
        chat.user(3)
