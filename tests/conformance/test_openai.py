"""The conformance suite against the OpenAI backends, served by the fake server on 127.0.0.1.

Variants: legacy completions (prompt lists), completions on a server that
refuses lists and ignores ``n`` (like ``transformers serve``), and chat.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

import pytest

from outlines import models
from outlines.models import Model
from tests.conformance.suite import *  # noqa: F401,F403
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.recording import RecordingBackend

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

KEY = "sk-conformance"


_fresh = itertools.count()


def _reply(prompt: str, sample: int, body: Any) -> str:
    """Echo-style: greedy answers depend on the prompt only; samples are fresh every time."""
    if body.get("temperature") == 0:
        return f"greedy:{prompt}"
    return f"sample:{prompt}:{next(_fresh)}"


class OpenAIConformance:
    distinct_samples = True

    def __init__(self, server: FakeOpenAI, flavour: str) -> None:
        self.server = server
        self.flavour = flavour
        self.recordings: list[RecordingBackend] = []

    def calls(self) -> int:
        return len(self.server.requests)

    def batches(self) -> int:
        return sum(len(r.batches) for r in self.recordings)

    def model(self, **defaults: Any) -> Model:
        if self.flavour == "chat":
            model = models.openai("fake", base_url=self.server.base_url, api_key=KEY, **defaults)
        else:
            model = models.openai_completion("fake", base_url=self.server.base_url, api_key=KEY, **defaults)
        self.recordings.append(RecordingBackend(inner=model.backend))
        return Model(self.recordings[-1], **defaults)

    def failing_model(self) -> Model:
        # Port 9 (discard) refuses connections on 127.0.0.1.
        return models.openai_completion("fake", base_url="http://127.0.0.1:9/v1", api_key=KEY, max_retries=0)


@pytest.fixture(params=["completion", "completion-no-lists", "chat"])
def conformance(request: pytest.FixtureRequest) -> Iterator[OpenAIConformance]:
    restricted = request.param == "completion-no-lists"
    with FakeOpenAI(reply=_reply, refuse_lists=restricted, ignore_n=restricted) as server:
        conformance = OpenAIConformance(server, "chat" if request.param == "chat" else "completion")
        if restricted:
            # Let the backend learn the server's limits first (one refused request each,
            # tested in tests/backends); the suite then measures the steady state.
            model = conformance.model(temperature=1.0)
            model(["a", "b"], num_samples=2).eval(cache=False)
            server.reset()
        yield conformance
