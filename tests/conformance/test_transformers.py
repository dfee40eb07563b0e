"""The conformance suite against the transformers backend on the tiny local model."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from outlines.backends.transformers import TransformersBackend  # noqa: E402
from outlines.models import Model  # noqa: E402
from tests.conformance.suite import *  # noqa: E402,F401,F403


class CountingBackend(TransformersBackend):
    """Counts ``generate`` calls into a list shared with the fixture."""

    def __init__(self, path: str, counter: list[int]) -> None:
        super().__init__(path, device="cpu")
        self.counter = counter

    async def generate(self, requests):  # type: ignore[no-untyped-def]
        self.counter.append(len(requests))
        return await super().generate(requests)


class TransformersConformance:
    distinct_samples = True

    def __init__(self, path: str) -> None:
        self.path = path
        self.counter: list[int] = []

    def calls(self) -> int:
        return len(self.counter)

    def model(self, **defaults) -> Model:  # type: ignore[no-untyped-def]
        return Model(CountingBackend(self.path, self.counter), **defaults)

    def failing_model(self) -> Model:
        return Model(CountingBackend(self.path + "-missing", self.counter), max_tokens=2)


@pytest.fixture
def conformance(tiny_model_path: str) -> TransformersConformance:
    return TransformersConformance(tiny_model_path)
