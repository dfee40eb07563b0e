"""``models.openai`` and ``models.openai_completion`` against a real ``transformers serve``.

The completion tests run the tiny local GPT-2 built by the ``tiny_model_path``
fixture. It refuses a list of prompts (400 "prompt must be a string.") and
ignores ``n``, so the backend's fallbacks must kick in; greedy results must
equal what the server answers to each prompt alone. The chat tests run
SmolLM2-135M-Instruct (written once as a model folder, with ``do_sample`` in
its generation config so that samples differ), a real chat model with a template.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import outlines
from outlines import models

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.filterwarnings("error::ResourceWarning")]

STARTUP_SECONDS = 180


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve_command() -> list[str]:
    cli = Path(sys.executable).with_name("transformers")
    if cli.exists():
        return [str(cli), "serve"]
    found = shutil.which("transformers")
    if found is None:
        pytest.skip("the `transformers` command is not installed (pip install 'transformers[serving]')")
    return [found, "serve"]


def _post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def served(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(base URL, model name, log file) of a ``transformers serve`` pinned to the tiny model."""
    yield from _serve(tiny_model_path, tmp_path_factory)


@pytest.fixture(scope="module")
def served_smollm2(smollm2_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(base URL, model name, log file) of a ``transformers serve`` pinned to SmolLM2."""
    pytest.importorskip("gguf")
    from outlines.testing import build_smollm2_folder

    folder = build_smollm2_folder(tmp_path_factory.mktemp("smollm2") / "model")
    yield from _serve(folder, tmp_path_factory)


def _serve(model_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    pytest.importorskip("fastapi", reason="transformers serve needs the 'serving' extra (fastapi)")
    pytest.importorskip("uvicorn", reason="transformers serve needs the 'serving' extra (uvicorn)")
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = _serve_command() + [model_path, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                                  "--log-level", "info"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.skip(f"transformers serve exited with {process.returncode} before it was ready; "
                            f"its log ends: {log.read_text()[-800:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.skip(f"transformers serve was not ready after {STARTUP_SECONDS}s; "
                            f"its log ends: {log.read_text()[-800:]}")
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1", model_path, log
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_20_prompt_graph_through_transformers_serve(
    served: tuple[str, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    base_url, model_name, log = served
    llm = models.openai_completion(model_name, base_url=base_url, api_key="sk-local", max_tokens=6, temperature=0)
    topic = outlines.string("topic")
    answers = llm("Tell me about " + topic + ":")
    topics = [f"thing {i}" for i in range(20)]
    with caplog.at_level(logging.WARNING, logger="outlines.backends.openai"):
        result = answers.eval({topic: topics}, cache=False)
    assert result.shape == (20,) and all(isinstance(text, str) for text in result)
    assert any("refuses a list of prompts" in r.getMessage() for r in caplog.records)
    # The server's own answers, asked one prompt at a time.
    expected = [
        _post(f"{base_url}/completions", {"model": model_name, "prompt": f"Tell me about {t}:", "max_tokens": 6,
                                           "temperature": 0})["choices"][0]["text"]
        for t in topics
    ]
    assert result.tolist() == expected
    text = log.read_text()
    assert text.count("400 Bad Request") == 1 and text.count('"POST /v1/completions HTTP/1.1" 200') == 40


def test_samples_from_transformers_serve(served: tuple[str, str, Path]) -> None:
    base_url, model_name, _ = served
    llm = models.openai_completion(model_name, base_url=base_url, max_tokens=4, temperature=1.0)
    result = llm(["a", "b"], num_samples=3).eval(cache=False)
    assert np.asarray(result).shape == (2, 3) and all(isinstance(t, str) for t in np.asarray(result).flat)


def _posts(log: Path, before: int) -> list[str]:
    """The status of each POST the server logged after its first ``before`` lines."""
    lines = log.read_text().splitlines()[before:]
    return [line.split('HTTP/1.1" ')[1][:3] for line in lines if "POST /v1/" in line]


def test_twenty_prompts_times_three_samples_cost_sixty_requests_and_the_quirks_are_remembered(
    served: tuple[str, str, Path], default_cache: Any
) -> None:
    from outlines.backends import quirks
    from outlines.common.config import process_state

    base_url, model_name, log = served
    llm = models.openai_completion(model_name, base_url=base_url, api_key="sk-local", max_tokens=2, temperature=1.0)
    prompts = [f"thing {i}" for i in range(20)]
    before = len(log.read_text().splitlines())
    assert np.asarray(llm(prompts, num_samples=3).eval(cache=False)).shape == (20, 3)
    # one list refused, then per prompt: the n=3 request whose one answer is kept as sample 0, and 2 more
    assert sorted(_posts(log, before)) == ["200"] * 60 + ["400"]
    assert quirks.known(base_url) == {quirks.IGNORES_N, quirks.REFUSES_LISTS}
    process_state().quirks_known.clear()  # as a new process would start: only the cache file knows
    before = len(log.read_text().splitlines())
    second = llm([f"other {i}" for i in range(20)], num_samples=3).eval(cache=False)
    assert np.asarray(second).shape == (20, 3) and _posts(log, before) == ["200"] * 60


def test_smollm2_answers_through_the_chat_endpoint(served_smollm2: tuple[str, str, Path]) -> None:
    base_url, model_name, _ = served_smollm2
    llm = models.openai(model_name, base_url=base_url, api_key="sk-local", max_tokens=24, temperature=0)
    answer = llm("What is 2 + 2?").eval(cache=False)
    assert "4" in answer, answer


def test_a_conversation_is_sent_as_its_messages(served_smollm2: tuple[str, str, Path]) -> None:
    from outlines import chat

    base_url, model_name, _ = served_smollm2
    llm = models.openai(model_name, base_url=base_url, api_key="sk-local", max_tokens=16, temperature=0)
    conversation = chat.system("Answer with one word.") + chat.user("Name a color.") + chat.assistant("Blue.") \
        + chat.user("Name another one.")
    grown = conversation + chat.assistant(llm(conversation))
    value = grown.eval(cache=False)
    messages = value.messages
    expected = _post(f"{base_url}/chat/completions", {"model": model_name, "messages": messages[:-1],
                                                      "max_tokens": 16, "temperature": 0})
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[-1]["content"] == expected["choices"][0]["message"]["content"]


def test_smollm2_samples_differ_through_the_chat_endpoint(served_smollm2: tuple[str, str, Path]) -> None:
    base_url, model_name, _ = served_smollm2
    llm = models.openai(model_name, base_url=base_url, api_key="sk-local", max_tokens=12, temperature=1.0)
    samples = llm("Write a random word.", num_samples=4).eval(cache=False)
    assert np.asarray(samples).shape == (4,) and len(set(samples)) > 1, samples


def test_a_constraint_transformers_serve_refuses_is_checked_and_retried(
    served: tuple[str, str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    base_url, model_name, log = served
    llm = models.openai_completion(model_name, base_url=base_url, api_key="sk-local", max_tokens=4, temperature=0.8,
                                   max_retries=2)
    before = log.read_text().splitlines()
    with caplog.at_level(logging.WARNING, logger="outlines.backends.openai"):
        result = llm("Answer yes or no:", choices=["certainly", "never"]).eval(cache=False, errors="return")
    lines = [line for line in log.read_text().splitlines()[len(before):] if "POST /v1/completions" in line]
    assert isinstance(result, outlines.Failure) and "is not one of the choices ['certainly', 'never']" in result.message
    # serve answers 422 to guided_choice, and to the probe carrying only it: remembered, then the draw and 2
    # retries without it
    assert [line.split('HTTP/1.1" ')[1][:3] for line in lines] == ["422", "422", "200", "200", "200"]
    assert any("refuses guided_choice" in r.getMessage() for r in caplog.records)


def test_a_greedy_draw_serve_answers_outside_its_constraint_is_not_asked_again(served: tuple[str, str, Path]) -> None:
    base_url, model_name, log = served
    llm = models.openai_completion(model_name, base_url=base_url, api_key="sk-local", max_tokens=4, temperature=0,
                                   max_retries=3)
    before = len(log.read_text().splitlines())
    result = llm("Answer yes or no:", choices=["certainly", "never"]).eval(cache=False, errors="return")
    assert isinstance(result, outlines.Failure) and "is not one of the choices ['certainly', 'never']" in result.message
    assert "not asked again: at temperature=0" in result.message
    assert _posts(log, before) == ["422", "422", "200"]  # serve refuses guided_choice (and its probe); once without
