"""Shared pytest fixtures: the tiny local model, an isolated default cache, the fake OpenAI server.

Every fake provider checks each request against the provider's published
spec (``tests/fixtures/spec/validate.py``); a request it refused fails the
test that sent it (``pytest_runtest_call``, and ``_spec_violations`` for what
comes during teardown) unless the test declared it (``expect_violations``).
"""
from __future__ import annotations

import sys
from typing import Any, Iterator

import pytest

VALIDATE = "tests.fixtures.spec.validate"


def _check_spec_violations() -> None:
    validate = sys.modules.get(VALIDATE)  # loaded by the fakes: a test without one pays nothing
    if validate is not None:
        validate.check_ledgers()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[Any]:
    """Fail a test whose requests a fake provider refused for breaking the spec."""
    try:
        result = yield
    except BaseException as error:
        try:
            _check_spec_violations()
        except AssertionError as violations:  # the test's own failure stays the one reported
            error.add_note(str(violations))
        raise
    _check_spec_violations()
    return result


@pytest.fixture(autouse=True)
def _spec_violations() -> Iterator[None]:
    """Violations during the test's teardown (a fixture's last requests) fail it too."""
    yield
    _check_spec_violations()


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


@pytest.fixture
def fresh_state() -> Iterator[Any]:
    """The test runs with a process state of its own, as a new process starts (``outlines.common.config``).

    What it sets (``set_tuning``, ``set_executor``, ``outlines.cache.enable``...)
    and what its evaluations learn go with it; the process's state is back after.
    """
    from outlines.common.config import using_process_state

    with using_process_state() as state:
        yield state
