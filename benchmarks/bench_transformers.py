"""64 prompts x 20 new tokens on the tiny local GPT-2: outlines vs raw transformers.

Compares one outlines schedule (batched, left-padded) with a loop of single raw
``generate`` calls and with one raw batched ``generate``; reports tokens/s and
peak RSS, and measures the worker choice of the backend: a thread (what ships)
against a one-process pool (startup, per-batch time, event-loop lag).

    python benchmarks/bench_transformers.py [--model PATH] [--repeat 5]

With ``--smollm2``: self-consistency on SmolLM2-135M-Instruct with a ~300-token
few-shot prompt, 16 questions x 8 samples: the backend's prefix sharing vs its
unshared path vs raw ``generate(num_return_sequences=8)``, each run in a fresh
process (model load not timed), min and median of ``--runs``. With
``--accuracy``: greedy vs the majority of k = 1, 4, 8, 16 samples on the main
job's 30 problems.

    python benchmarks/bench_transformers.py --smollm2 [--runs 3] [--accuracy]
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
    from outlines.draws import Draw, GenerationParams

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


FEW_SHOT = "".join(
    f"Q: {q}\nA: {work} The answer is {a}.\n\n" for q, work, a in [
        ("Tom has 3 apples and buys 5 more. How many apples does he have?", "3 + 5 = 8.", 8),
        ("A box holds 6 eggs. How many eggs are in 4 boxes?", "6 * 4 = 24.", 24),
        ("Sara had 20 stickers and gave away 7. How many are left?", "20 - 7 = 13.", 13),
        ("3 friends share 12 sweets equally. How many does each get?", "12 / 3 = 4.", 4),
        ("A shelf has 9 books and Ann adds 14. How many books are there now?", "9 + 14 = 23.", 23),
        ("Each bag has 7 marbles. How many marbles are in 5 bags?", "7 * 5 = 35.", 35),
        ("A tank holds 50 liters and 18 are used. How many liters remain?", "50 - 18 = 32.", 32),
        ("Ben reads 8 pages a day for 6 days. How many pages does he read?", "8 * 6 = 48.", 48),
        ("A farm has 16 cows and buys 9 more. How many cows does it have?", "16 + 9 = 25.", 25),
        ("There are 40 seats in 5 equal rows. How many seats are in each row?", "40 / 5 = 8.", 8),
    ]
)
SC_QUESTIONS = [f"What is {a} * {b}?" if i % 2 else f"Lily has {a} pens and buys {b} more. How many pens does she have?"
                for i, (a, b) in enumerate([(17, 3), (12, 4), (9, 9), (15, 2), (6, 7), (11, 5), (23, 4), (8, 8),
                                            (14, 3), (25, 6), (7, 12), (19, 2), (13, 13), (21, 5), (16, 4), (5, 18)])]
SC_SAMPLES, SC_TOKENS = 8, 32


def _smollm2_case(case: str, folder: str) -> None:
    """One timed run in this (fresh) process; prints a JSON line (wall and CPU seconds)."""
    import json

    from outlines.backends.base import BatchReport
    from outlines.draws import Draw, GenerationParams
    from outlines.backends.transformers import TransformersBackend

    backend = TransformersBackend(folder, device="cpu", share_prefix=case == "shared", max_batch=1 << 10)
    loaded = backend.load()
    cpu = time.process_time()
    prompts = [FEW_SHOT + f"Q: {q}\nA:" for q in SC_QUESTIONS]
    params = GenerationParams.create(max_tokens=SC_TOKENS, temperature=0.7, seed=0)
    start = time.perf_counter()
    if case == "raw":
        import torch

        tokenizer, model = loaded.tokenizer, loaded.model
        texts = [backend.render(loaded, p) for p in prompts]
        batch = tokenizer(texts, padding=True, add_special_tokens=False, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=True, temperature=0.7, top_k=0, max_new_tokens=SC_TOKENS,
                                 num_return_sequences=SC_SAMPLES, pad_token_id=tokenizer.pad_token_id)
        new = out[:, batch["input_ids"].shape[1]:]
        tokens = int((new != tokenizer.pad_token_id).sum())
    else:
        requests = [Draw(p, params, d) for p in prompts for d in range(SC_SAMPLES)]
        texts = asyncio.run(backend.generate(requests, BatchReport()))
        tokens = sum(len(loaded.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    prompt_tokens = len(loaded.tokenizer(backend.render(loaded, prompts[0]), add_special_tokens=False)["input_ids"])
    print(json.dumps({"case": case, "seconds": seconds, "cpu": cpu, "tokens": tokens, "prompt_tokens": prompt_tokens}))


def smollm2_benchmark(runs: int) -> None:
    import json
    import os
    import subprocess
    import sys

    from outlines.testing import build_smollm2_folder

    folder = build_smollm2_folder()  # the GGUF de-quantized once: fast loads in the fresh processes
    results: dict[str, list[dict[str, Any]]] = {"shared": [], "unshared": [], "raw": []}
    for _ in range(runs):
        for case in results:  # interleaved, each in a fresh process
            done = subprocess.run([sys.executable, __file__, "--smollm2-case", case, "--model", folder], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": os.getcwd()}, check=True)
            results[case].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[case][-1]), flush=True)
    prompt_tokens = results["shared"][0]["prompt_tokens"]
    print(f"\nself-consistency on SmolLM2-135M-Instruct: {len(SC_QUESTIONS)} questions x {SC_SAMPLES} samples, "
          f"{prompt_tokens}-token prompts, {SC_TOKENS} new tokens, {runs} fresh-process runs")
    print(f"{'case':44s} {'min s':>8s} {'median s':>9s} {'tokens/s':>9s} {'min CPU s':>10s}")
    best = {}
    for case, label in (("shared", "outlines, prefix sharing (ships)"), ("unshared", "outlines, unshared path"),
                        ("raw", "raw generate(num_return_sequences=8)")):
        seconds = [r["seconds"] for r in results[case]]
        best[case] = min(seconds)
        tokens = statistics.median(r["tokens"] for r in results[case])
        cpu = min(r["cpu"] for r in results[case])
        print(f"{label:44s} {min(seconds):8.2f} {statistics.median(seconds):9.2f} {tokens / min(seconds):9.0f} "
              f"{cpu:10.2f}")
    print(f"prefix sharing vs unshared: {best['unshared'] / best['shared']:.2f}x faster (target >= 2x)")
    print(f"prefix sharing vs raw num_return_sequences: {best['raw'] / best['shared']:.2f}x faster")


def accuracy_table(max_k: int = 16) -> None:
    """Greedy vs the majority of the first k of ``max_k`` samples, on the main job's problems."""
    import collections

    import _compat  # the measured tree (OUTLINES_BENCH_TREE, default this one) and its examples
    import outlines
    from outlines import models
    from outlines.testing import smollm2_gguf

    example = _compat.example("self_consistency")
    llm = models.transformers(smollm2_gguf(), system_prompt=example.SYSTEM, max_tokens=40, temperature=0.7, seed=0)
    question = outlines.string("question")
    greedy = example.parse_answer(llm(question, temperature=0))
    samples = example.parse_answer(llm(question, num_samples=max_k))
    questions = [q for q, _ in example.PROBLEMS]
    start = time.perf_counter()
    greedy_answers, sampled = outlines.eval(greedy, samples, givens={question: questions})
    seconds = time.perf_counter() - start
    truths = [str(a) for _, a in example.PROBLEMS]
    print(f"\naccuracy on {len(truths)} problems (SmolLM2-135M-Instruct, temperature 0.7, 40 tokens; "
          f"{seconds:.0f} s for {len(truths) * (max_k + 1)} draws)")
    print(f"greedy                 {sum(g == t for g, t in zip(greedy_answers, truths)) / len(truths):6.1%}")
    for k in (1, 4, 8, 16):
        if k > max_k:
            break
        votes = [collections.Counter(a for a in row[:k] if a != "?").most_common(1) for row in sampled]
        right = sum(bool(v) and v[0][0] == t for v, t in zip(votes, truths))
        print(f"majority of k = {k:<6d} {right / len(truths):6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model folder (default: the tiny model, built on first run)")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--smollm2", action="store_true", help="the SmolLM2 self-consistency benchmark")
    parser.add_argument("--runs", type=int, default=3, help="fresh-process runs per case (with --smollm2)")
    parser.add_argument("--accuracy", action="store_true", help="the SmolLM2 accuracy table")
    parser.add_argument("--max-k", type=int, default=16, help="samples per problem (with --accuracy)")
    parser.add_argument("--smollm2-case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smollm2_case:
        return _smollm2_case(args.smollm2_case, args.model)
    if args.smollm2 or args.accuracy:
        if args.smollm2:
            smollm2_benchmark(args.runs)
        if args.accuracy:
            accuracy_table(args.max_k)
        return

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
