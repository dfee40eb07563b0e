"""``from_function`` identity: captured state separates models; unhashable state opts out of the cache.

Two functions that differ only in what they capture must be two models: in one
schedule (grouping and dedup), with ``cache=False``, and in the disk cache.
"""
from __future__ import annotations

import functools
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest

import outlines
from outlines import models
from outlines.cache import Cache, CacheWarning
from tests.fixtures.subprocesses import ROOT, python_env


def suffixer(suffix: str) -> Callable[[str], str]:
    def answer(prompt: str) -> str:
        return prompt + suffix

    return answer


def with_default(suffix: str) -> Callable[..., str]:
    def answer(prompt: str, end: str = suffix) -> str:
        return prompt + end

    return answer


def joined(prompt: str, suffix: str) -> str:
    return prompt + suffix


class Appender:
    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def method(self, prompt: str) -> str:
        return prompt + self.suffix

    def __call__(self, prompt: str) -> str:
        return prompt + self.suffix


PAIRS: dict[str, Callable[[str], Callable[..., str]]] = {
    "closure": suffixer,
    "default argument": with_default,
    "functools.partial": lambda s: functools.partial(joined, suffix=s),
    "bound method": lambda s: Appender(s).method,
    "callable object": Appender,
    "batched closure": lambda s: (lambda prompts: [p + s for p in prompts]),
}


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("kind", list(PAIRS))
def test_functions_that_differ_only_in_captured_state_are_two_models(
    kind: str, cache: bool, tmp_path: Path
) -> None:
    batched = kind.startswith("batched")
    one = models.from_function(PAIRS[kind]("-one"), batched=batched, temperature=0)
    two = models.from_function(PAIRS[kind]("-two"), batched=batched, temperature=0)
    assert one.backend != two.backend and one.backend.identity != two.backend.identity
    store: Any = Cache(tmp_path) if cache else False
    assert outlines.eval(one("p"), two("p"), cache=store) == ("p-one", "p-two")
    if cache:  # the disk never serves one model's draws for the other
        assert two("p").eval(cache=Cache(tmp_path)) == "p-two"
        assert one("p").eval(cache=Cache(tmp_path)) == "p-one"


def test_equal_state_is_one_model_and_shares_the_cache(tmp_path: Path) -> None:
    calls: list[str] = []

    def counted(suffix: str) -> Callable[[str], str]:
        def answer(prompt: str) -> str:
            calls.append(prompt)
            return prompt + suffix

        return answer

    # ``calls`` is captured too, and is equal (empty) when both are built.
    one, two = models.from_function(counted("-x")), models.from_function(counted("-x"))
    assert one.backend == two.backend
    assert outlines.eval(one("p"), two("q"), cache=Cache(tmp_path)) == ("p-x", "q-x")
    assert len(calls) == 2


def test_identity_is_stable_across_processes() -> None:
    code = (
        "import functools; from outlines import models; from tests.backends.test_function import joined, suffixer;"
        "print(models.from_function(functools.partial(joined, suffix='!')).backend.identity);"
        "print(models.from_function(suffixer('?')).backend.identity)"
    )
    env = python_env(PYTHONHASHSEED="random")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                           check=True).stdout for _ in range(2)}
    assert len(outs) == 1 and "object-" not in outs.pop()


def locked(suffix: str) -> Callable[[str], str]:
    lock = threading.Lock()

    def guarded(prompt: str) -> str:
        with lock:
            return prompt + suffix

    return guarded


def test_unhashable_state_groups_by_object_skips_the_disk_and_warns_once(tmp_path: Path, fresh_state: Any) -> None:
    with pytest.warns(CacheWarning, match="not cached on disk.*version="):
        one = models.from_function(locked("-one"), temperature=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per function name
        two = models.from_function(locked("-two"), temperature=0)
    assert not one.backend.cacheable and one.backend != two.backend
    store = Cache(tmp_path)
    assert outlines.eval(one("p"), two("p"), cache=store) == ("p-one", "p-two")
    assert store.stats()["entries"] == 0 and outlines.explain(one("p"), cache=store).requests == 1


def test_version_declares_the_identity_and_caches(tmp_path: Path, fresh_state: Any) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        llm = models.from_function(locked("-v"), version="2024-01", temperature=0.7)
    assert llm.backend.cacheable and llm.backend.identity[-1] == "2024-01"
    store = Cache(tmp_path)
    assert llm("p").eval(cache=store) == "p-v"
    assert store.stats()["entries"] == 1


@pytest.mark.parametrize(
    "options",
    [{"max_batch": -1}, {"max_batch": 0}, {"max_batch": 2.5}, {"max_batch": True}, {"max_concurrency": -1},
     {"max_concurrency": 0}, {"max_concurrency": 1.5}],
)
@pytest.mark.parametrize("batched", [False, True])
def test_bad_limits_fail_at_construction(options: dict[str, Any], batched: bool) -> None:
    name = next(iter(options))
    with pytest.raises(ValueError, match=f"from_function\\('upper'\\): {name} must be a positive integer"):
        models.from_function(str.upper, batched=batched, name="upper", **options)


class Text(str):
    """A str subclass: text, as ``isinstance`` says."""


@pytest.mark.parametrize("bad", [None, 3, b"bytes"])
def test_a_batched_function_returning_a_non_text_fails_naming_it(bad: Any) -> None:
    llm = models.from_function(lambda prompts: [p + "!" for p in prompts[:-1]] + [bad], batched=True, name="odd")
    with pytest.raises(outlines.NodeError, match=f"must return str, got {type(bad).__name__}"):
        outlines.eval(llm(outlines.constant(["a", "b", "c"])), cache=False)
    texts = models.from_function(lambda prompts: [Text(p + "!") for p in prompts], batched=True, name="sub")
    assert texts(outlines.constant(["a", "b"])).eval(cache=False).tolist() == ["a!", "b!"]
