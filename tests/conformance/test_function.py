"""The conformance suite against ``models.from_function`` (sync, async, batched)."""
from __future__ import annotations

import asyncio
import hashlib
import random

import pytest

from outlines import models
from outlines.models import Model
from tests.conformance.suite import *  # noqa: F401,F403
from tests.fixtures.recording import RecordingBackend


def _fake_completion(prompt: str, temperature: float | None, rng: random.Random) -> str:
    if temperature == 0:
        return "greedy:" + hashlib.sha1(prompt.encode()).hexdigest()[:8]
    return f"sample:{prompt[:8]}:{rng.random():.6f}"


class FunctionConformance:
    distinct_samples = True

    def __init__(self, flavour: str) -> None:
        self.flavour = flavour
        self.count = 0
        self.rng = random.Random(0)
        self.recordings: list[RecordingBackend] = []

    def calls(self) -> int:
        return self.count

    def batches(self) -> int:
        return sum(len(r.batches) for r in self.recordings)

    def model(self, **defaults):
        function_model = self._function_model(**defaults)
        self.recordings.append(RecordingBackend(inner=function_model.backend))
        return Model(self.recordings[-1], **defaults)

    def _function_model(self, **defaults):
        temperature = defaults.get("temperature")
        if self.flavour == "batched":

            def complete_batch(prompts):
                self.count += 1
                return [_fake_completion(p, temperature, self.rng) for p in prompts]

            return models.from_function(complete_batch, batched=True, name="batched", **defaults)
        if self.flavour == "async":

            async def complete_async(prompt):
                self.count += 1
                await asyncio.sleep(0)
                return _fake_completion(prompt, temperature, self.rng)

            return models.from_function(complete_async, name="async", **defaults)

        def complete(prompt):
            self.count += 1
            return _fake_completion(prompt, temperature, self.rng)

        return models.from_function(complete, name="sync", **defaults)

    def failing_model(self):
        def broken(prompt):
            raise ConnectionError("backend unavailable")

        return models.from_function(broken, name="broken")


@pytest.fixture(params=["sync", "async", "batched"])
def conformance(request):
    return FunctionConformance(request.param)
