"""The conformance suite against the transformers backend on the tiny local model."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from outlines.backends.transformers import TransformersBackend  # noqa: E402
from outlines.models import Model  # noqa: E402
from tests.conformance.suite import *  # noqa: E402,F401,F403
from tests.fixtures.recording import RecordingBackend  # noqa: E402


class TransformersConformance:
    distinct_samples = True

    def __init__(self, path: str) -> None:
        self.recording = RecordingBackend(inner=TransformersBackend(path, device="cpu"))
        self.path = path

    def calls(self) -> int:
        return len(self.recording.batches)

    def batches(self) -> int:
        return len(self.recording.batches)

    def model(self, **defaults) -> Model:  # type: ignore[no-untyped-def]
        return Model(self.recording, **defaults)

    def failing_model(self) -> Model:
        return Model(RecordingBackend(inner=TransformersBackend(self.path + "-missing", device="cpu")), max_tokens=2)


@pytest.fixture
def conformance(tiny_model_path: str) -> TransformersConformance:
    return TransformersConformance(tiny_model_path)
