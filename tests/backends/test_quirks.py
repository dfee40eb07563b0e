"""Server quirks noted by the backends: kept for the process, remembered in the cache file for the next one.

The cross-process tests run real client processes against one fake server on
127.0.0.1 that ignores ``n`` and refuses prompt lists, as ``transformers serve``.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

import outlines
from outlines import cache
from outlines.backends import quirks
from outlines.common.config import process_state
from outlines.backends.openai import N_IGNORED
from tests.fixtures.fake_openai import FakeOpenAI
from tests.fixtures.subprocesses import python_env

URL = "http://127.0.0.1:9/v1"

#: One client process: 20 prompts x 3 samples; prints what it knows about the server afterwards.
CLIENT = """
import sys
from outlines import models
from outlines.backends import quirks
kind, base_url = sys.argv[1], sys.argv[2]
known_before = sorted(quirks.known(base_url))
constructor = models.openai if kind == "chat" else models.openai_completion
llm = constructor("fake-model", base_url=base_url, api_key="sk-local", temperature=1.0)
out = llm([f"q{i}" for i in range(20)], num_samples=3).eval(cache=False)
assert out.shape == (20, 3)
print(",".join(known_before), "|", ",".join(sorted(quirks.known(base_url))))
"""


def test_a_noted_quirk_is_known_and_remembered_on_disk(default_cache):
    assert quirks.known(URL) == frozenset() and URL not in N_IGNORED
    assert quirks.note(URL, quirks.IGNORES_N) is True
    assert quirks.note(URL, quirks.IGNORES_N) is False  # not news
    assert quirks.known(URL) == {quirks.IGNORES_N} and URL in N_IGNORED
    import asyncio

    asyncio.run(quirks.remember(URL, quirks.IGNORES_N))
    process_state().quirks_known.clear()  # as a new process: memory empty, the file is read again
    assert quirks.known(URL) == {quirks.IGNORES_N}
    quirks.forget()
    assert quirks.known(URL) == frozenset()


def test_unknown_quirk_names_are_refused():
    with pytest.raises(ValueError, match="unknown server quirk 'ignores_m'"):
        quirks.note(URL, "ignores_m")


def test_with_the_default_cache_off_quirks_live_in_memory_only(default_cache, monkeypatch):
    import asyncio

    monkeypatch.setenv("OUTLINES_CACHE", "0")
    with outlines.common.config.using_process_state():  # as a new process: the default cache follows OUTLINES_CACHE
        assert cache.resolve(True) is None
        quirks.note(URL, quirks.REFUSES_LISTS)
        asyncio.run(quirks.remember(URL, quirks.REFUSES_LISTS))  # nowhere to write: a no-op
    process_state().quirks_known.clear()
    assert cache.resolve(True) is not None and quirks.known(URL) == frozenset()


def test_a_damaged_cache_file_costs_only_the_memory(default_cache):
    import asyncio

    default_cache.path.write_bytes(b"not a database at all" * 100)
    assert quirks.known(URL) == frozenset()
    quirks.note(URL, quirks.IGNORES_N)
    asyncio.run(quirks.remember(URL, quirks.IGNORES_N))  # logged and skipped, never raised
    assert quirks.known(URL) == {quirks.IGNORES_N}


@pytest.mark.slow
@pytest.mark.parametrize("kind, first, second", [("chat", 60, 60), ("completion", 61, 60)])
def test_a_new_process_does_not_learn_a_servers_quirks_again(tmp_path, kind, first, second):
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "cache"))
    with FakeOpenAI(ignore_n=True, refuse_lists=True) as server:
        counts, known = [], []
        for _ in range(2):
            server.reset()
            done = subprocess.run([sys.executable, "-c", CLIENT, kind, server.base_url], env=env,
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            counts.append(server.count)
            known.append(done.stdout.strip())
    learned = "ignores_n" if kind == "chat" else "ignores_n,refuses_prompt_lists"
    # the first process learns (the list refused once, each prompt's n=3 answer kept as sample 0);
    # the second knows from the cache file and asks one prompt, one sample per request from the start
    assert counts == [first, second]
    assert known == [f"| {learned}", f"{learned} | {learned}"]


def test_a_quirk_an_earlier_version_noted_after_a_schema_error_is_healed(default_cache):
    """The old version wrote 'refuses_constraint_fields' for the base URL after any 400 naming response_format.

    Such a note is not trusted: the next run sends response_format again (and would probe the
    field if the server refused it), and structured outputs stay on for that server.
    """
    from outlines import models
    from outlines.cache import quirks as stored

    with FakeOpenAI(honour_constraints=True) as server:
        stored.write(default_cache.path, server.base_url, "refuses_constraint_fields")  # as the old version did
        process_state().quirks_known.clear()  # a new process
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                  "additionalProperties": False}
        llm = models.openai("fake-model", base_url=server.base_url, api_key="sk-local")
        assert llm("q", json_schema=schema).eval(cache=False) == {"a": 0}
        (request,) = server.requests
        assert request.body["response_format"]["json_schema"]["schema"] == schema
        assert quirks.known(server.base_url) == frozenset()


def test_the_notes_and_the_store_are_the_process_states():
    from outlines.common.config import ProcessState, using_process_state

    with using_process_state(ProcessState()) as state:  # no store: notes in memory only
        assert quirks.note(URL, quirks.IGNORES_N) and state.quirks_known == {URL: {quirks.IGNORES_N}}
        quirks.note_accepted(URL, "guided_json")
        assert state.quirks_accepted == {(URL, "guided_json")}
        with using_process_state(ProcessState()):  # another process knows none of it
            assert quirks.known(URL) == frozenset() and not quirks.accepts(URL, "guided_json")
        assert quirks.known(URL) == {quirks.IGNORES_N} and quirks.accepts(URL, "guided_json")
        store = object()
        quirks.use_store(store)  # type: ignore[arg-type]
        assert state.quirk_store is store
    assert process_state().quirk_store is not store  # the process's own state is back
