"""The conformance suite against the Anthropic Messages backend, served by the fake provider on 127.0.0.1."""
from __future__ import annotations

import itertools
from typing import Any, Iterator

import pytest

from outlines import models
from outlines.models import Model
from tests.conformance.suite import *  # noqa: F401,F403
from tests.fixtures.fake_batches import FakeBatches
from tests.fixtures.recording import RecordingBackend

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")

KEY = "sk-ant-conformance"
_fresh = itertools.count()


def _reply(prompt: str, sample: int, body: Any) -> str:
    """Greedy answers depend on the prompt only; samples are fresh every time."""
    if body.get("temperature") == 0:
        return f"greedy:{prompt}"
    return f"sample:{prompt}:{next(_fresh)}"


class AnthropicConformance:
    distinct_samples = True

    def __init__(self, server: FakeBatches) -> None:
        self.server = server
        self.recordings: list[RecordingBackend] = []

    def calls(self) -> int:
        return len(self.server.requests)

    def batches(self) -> int:
        return sum(len(r.batches) for r in self.recordings)

    def model(self, **defaults: Any) -> Model:
        model = models.anthropic("claude-fake", base_url=self.server.anthropic_url, api_key=KEY, **defaults)
        self.recordings.append(RecordingBackend(inner=model.backend))
        return Model(self.recordings[-1], **model.defaults.to_dict())

    def failing_model(self) -> Model:
        # Port 9 (discard) refuses connections on 127.0.0.1.
        return models.anthropic("claude-fake", base_url="http://127.0.0.1:9", api_key=KEY, max_retries=0)


@pytest.fixture
def conformance() -> Iterator[AnthropicConformance]:
    with FakeBatches(reply=_reply) as server:
        yield AnthropicConformance(server)
