"""64 prompts x 20 new tokens on the tiny local GPT-2: outlines vs raw transformers.

Compares one outlines schedule (batched, left-padded) with a loop of single raw
``generate`` calls and with one raw batched ``generate``; reports tokens/s and
peak RSS, and measures the worker choice of the backend: a thread (what ships)
against a one-process pool (startup, per-batch time, event-loop lag).

    python benchmarks/bench_transformers.py [--model PATH] [--repeat 5]
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import resource
import statistics
import time
from typing import Any, Callable

N_PROMPTS, NEW_TOKENS = 64, 20
PROMPTS = [f"Q: What is {i} * {i % 7 + 2}?" + " Think." * (i % 5) + " A:" for i in range(N_PROMPTS)]
_worker: dict[str, Any] = {}


def timed(fn: Callable[[], Any], repeat: int) -> float:
    """Best of ``repeat`` runs after a warm-up (other processes only ever add time)."""
    return min(interleaved({"_": fn}, repeat)["_"])


def interleaved(cases: dict[str, Callable[[], Any]], repeat: int) -> dict[str, list[float]]:
    """Run the cases round-robin, so that background load hits all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        fn()  # warm-up
    for _ in range(repeat):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def raw_setup(path: str) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    return AutoModelForCausalLM.from_pretrained(path).eval(), tokenizer


def raw_generate(model: Any, tokenizer: Any, prompts: list[str], sample: bool = False) -> list[str]:
    import torch

    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    options = {"do_sample": True, "temperature": 1.0, "top_k": 0} if sample else {"do_sample": False}
    with torch.inference_mode():
        out = model.generate(**batch, max_new_tokens=NEW_TOKENS, pad_token_id=tokenizer.pad_token_id, **options)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def _requests() -> list[Any]:
    from outlines.backends.base import Draw, GenerationParams

    return [Draw(p, GenerationParams.create(max_tokens=NEW_TOKENS, temperature=0)) for p in PROMPTS]


def _process_init(path: str) -> None:
    from outlines.backends.transformers import TransformersBackend

    _worker["backend"] = TransformersBackend(path, max_batch=N_PROMPTS)


def _process_generate(requests: list[Any]) -> list[str]:
    from outlines.backends.base import BatchReport

    return asyncio.run(_worker["backend"].generate(requests, BatchReport()))


async def loop_lag(work: Callable[[], Any]) -> float:
    """Longest delay of a 5 ms ticker while ``work`` runs in an executor."""
    worst, running = 0.0, True

    async def ticker() -> None:
        nonlocal worst
        while running:
            start = time.perf_counter()
            await asyncio.sleep(0.005)
            worst = max(worst, time.perf_counter() - start - 0.005)

    task = asyncio.create_task(ticker())
    await work()
    running = False
    await task
    return worst


def worker_choice(path: str, repeat: int) -> list[tuple[str, float, float]]:
    """The backend's code in a thread (what ships) vs in a one-process pool, runs interleaved."""
    from outlines.backends.base import BatchReport
    from outlines.backends.transformers import TransformersBackend

    requests = _requests()
    start = time.perf_counter()
    pool = concurrent.futures.ProcessPoolExecutor(
        1, mp_context=multiprocessing.get_context("spawn"), initializer=_process_init, initargs=(path,)
    )
    pool.submit(_process_generate, requests[:1]).result()
    startup = time.perf_counter() - start
    backend = TransformersBackend(path, max_batch=N_PROMPTS)

    async def in_thread() -> None:
        await backend.generate(requests, BatchReport())

    async def in_process() -> None:
        await asyncio.get_running_loop().run_in_executor(pool, _process_generate, requests)

    times = interleaved({"thread": lambda: asyncio.run(in_thread()),
                         "process": lambda: asyncio.run(in_process())}, repeat)
    lags = {name: max(asyncio.run(loop_lag(work)) for _ in range(3))
            for name, work in (("thread", in_thread), ("process", in_process))}
    pool.shutdown()
    return [("thread (ships)", min(times["thread"]), lags["thread"]),
            ("process pool of 1", min(times["process"]), lags["process"]),
            ("process pool startup", startup, 0.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the tiny model, built on first run)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    import outlines
    from outlines import models
    from outlines.testing import build_tiny_model

    path = args.model or build_tiny_model()
    choice = worker_choice(path, args.repeat)
    model, tokenizer = raw_setup(path)
    llm = models.transformers(path, max_tokens=NEW_TOKENS, temperature=0, max_batch=N_PROMPTS)
    question = outlines.string("question")
    answers = llm(question)
    samples = llm(question, temperature=1.0, seed=0)

    loop = timed(lambda: [raw_generate(model, tokenizer, [p]) for p in PROMPTS], max(1, args.repeat // 3))
    times = interleaved({
        "raw one batched generate": lambda: raw_generate(model, tokenizer, PROMPTS),
        "outlines, one schedule (batched)": lambda: answers.eval({question: PROMPTS}, cache=False, progress=False),
        "raw batched generate, sampling": lambda: raw_generate(model, tokenizer, PROMPTS, sample=True),
        "outlines, sampling (per-draw streams)": lambda: samples.eval({question: PROMPTS}, cache=False,
                                                                      progress=False),
    }, args.repeat)
    rows = [("raw loop of 64 single generate calls", loop, loop)]
    rows += [(name, min(values), statistics.median(values)) for name, values in times.items()]
    tokens = N_PROMPTS * NEW_TOKENS
    print(f"\n{N_PROMPTS} prompts x {NEW_TOKENS} new tokens, greedy, {path}")
    print(f"{'case':40s} {'best s':>8s} {'median s':>9s} {'tokens/s':>10s}")
    for name, best, median in rows:
        print(f"{name:40s} {best:8.3f} {median:9.3f} {tokens / best:10.0f}")
    (_, single, _), (_, raw, raw_median), (_, ours, ours_median), (_, raw_s, _), (_, ours_s, _) = rows
    print(f"\noutlines vs loop of single calls: {single / ours:.1f}x faster (target >= 20x)")
    print(f"outlines overhead vs raw batched generate: {100 * (ours / raw - 1):+.1f}% best, "
          f"{100 * (ours_median / raw_median - 1):+.1f}% median (target <= 10%)")
    print(f"outlines sampling overhead vs raw sampling: {100 * (ours_s / raw_s - 1):+.1f}% best")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(f"\n{'worker for generate':28s} {'seconds':>9s} {'max loop lag':>13s}")
    for name, seconds, lag in choice:
        print(f"{name:28s} {seconds:9.3f} {1000 * lag:11.1f}ms")

if __name__ == "__main__":
    main()
