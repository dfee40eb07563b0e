"""Shared pytest fixtures: the tiny local model, an isolated default cache, the fake OpenAI server."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder holding a tiny random GPT-2 and its BPE tokenizer (see outlines.testing)."""
    from outlines.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-gpt2"))


@pytest.fixture(scope="session", autouse=True)
def _isolated_default_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests that use the default cache write to a temporary folder, never ~/.cache."""
    import os

    os.environ["OUTLINES_CACHE_DIR"] = str(tmp_path_factory.mktemp("outlines-cache"))


@pytest.fixture(autouse=True)
def _forget_server_quirks():  # noqa: ANN202
    """Each test starts with no remembered server quirks.

    The OpenAI backends remember, per base URL, for the process and in the
    default cache's file, a server that ignores ``n`` or refuses prompt lists
    or constraint fields. Fake servers bind free ports, and the OS hands a
    freed port out again, so a quirk noted in one test would change how a
    later test talks to a new server on the same port (it once made a
    2-sample request go out as two ``n=1`` requests).
    """
    yield
    from outlines.backends import quirks

    quirks.forget()


@pytest.fixture
def fake_openai():  # noqa: ANN201
    """A fresh fake OpenAI server on 127.0.0.1 (its port may be a freed one: see _forget_server_quirks)."""
    from tests.fixtures.fake_openai import FakeOpenAI

    with FakeOpenAI() as server:
        yield server
