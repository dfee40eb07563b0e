"""Pay once for a shared prefix: provider prompt caches and local key/value reuse (issue 26).

(a) 200 chat prompts sharing a 2,000-token head, through the fake OpenAI server
    (tests/fixtures/fake_openai.py, its own process) that simulates OpenAI's
    prompt cache (heads of 1,024+ tokens, in 128-token steps, cached once a
    request carrying them was answered) and answers after 300 ms. All 200 may be
    in flight at once. Naive concurrent dispatch (``prefix_warmup=False``) vs
    the warm-up (one request per head first, its siblings once its response
    starts): the share of head tokens billed as cached, the wall, and the input
    cost at $2.50 per 1M input tokens and $1.25 per 1M cached ones.
    Targets: >= 95% cached; wall <= naive + 1 latency.
(b) SmolLM2-135M-Instruct (CPU): 64 prompts built from 4 few-shot headers
    (about 400 tokens each), shuffled, in the scheduler's batches of 32
    (arrival order today; prefix groups together with groups).
    Today's one-common-prefix sharing (``group_min_tokens=None``) vs prefix
    groups: prompt tokens computed in prefill, greedy texts and seeded samples
    (must be equal), tokens per second. Target: >= 3x fewer prefill tokens.
(c) Prompts sharing nothing: (a) on 200 unrelated prompts of 2,000 tokens and
    (b) on 64 unrelated questions; the walls must agree within noise.

Both sides go through ``.eval`` (cache off), so the scheduler's own batches
are measured: with prefix groups a group's prompts share a batch.

Run: ``.venv/bin/python benchmarks/bench_prefix.py [--quick] [--part a|b|c]``
(``--quick``: 50 HTTP prompts at 100 ms, 16 local prompts, 8 new tokens;
``--http N --latency S --local N --new-tokens N --batch N`` set each size).
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Any

import _compat  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
from _compat import emit  # noqa: E402
from bench_openai import Server  # noqa: E402  # the fake server in a child process
from outlines import models  # noqa: E402
from outlines.models import Model  # noqa: E402
from outlines.backends.usage import Price  # noqa: E402

KEY = "sk-bench"
PRICE = Price(2.50, 10.0, cached_input=1.25)
HEAD_TOKENS = 2000  # 4-character tokens: the server's and the client's estimate agree


def http_run(server: Server, prompts: list[str], warm: bool) -> dict[str, float]:
    """One evaluation of ``prompts`` (cache off), the server's token counts and the wall."""
    llm = models.openai("gpt-bench", base_url=server.base_url, api_key=KEY, max_tokens=8, temperature=0,
                        max_concurrency=len(prompts), prefix_warmup=warm)
    question = outlines.string("question")
    server.stats(reset=True)  # also empties its prompt cache
    start = time.perf_counter()
    texts = llm(question).eval({question: prompts}, cache=False)
    wall = time.perf_counter() - start
    assert list(texts) == [p + "#0" for p in prompts]
    stats = server.stats(reset=True)
    return {"wall": wall, "prompt": stats["prompt_tokens"], "cached": stats["cached_tokens"],
            "requests": stats["count"]}


def part_a(count: int, latency: float, repeat: int, shared: bool = True) -> None:
    rng = random.Random(0)

    def text() -> str:
        return "".join(rng.choice("abcdefghij klmnop") for _ in range(HEAD_TOKENS * 4))

    head = text() if shared else ""
    prompts = [(head if shared else text()) + f"Question {i}: what is {i} times {i + 3}?" for i in range(count)]
    server = Server(latency, "--pieces")  # its tokens are 4-character pieces, as the client estimates
    try:
        http_run(server, prompts[:2], True)  # warm the client's imports and the server's first connection
        runs = {}
        for warm in (False, True):  # best wall of ``repeat`` runs: the counts are the same each time
            runs[warm] = min((http_run(server, prompts, warm) for _ in range(repeat)), key=lambda run: run["wall"])
    finally:
        server.close()
    print(f"\n(a{'' if shared else ', c'}) {count} chat prompts of 2,000 tokens"
          f"{' sharing their head' if shared else ' sharing nothing'}, latency {latency * 1000:.0f} ms, all in flight "
          f"at once, best of {repeat}")
    for warm, run in runs.items():
        head_cached = run["cached"] / (count * HEAD_TOKENS) if shared else 0.0
        cost = PRICE.cost(run["prompt"], 0, cached_tokens=run["cached"])
        print(f"  {'warm-up' if warm else 'naive  '}: wall {run['wall']:.3f} s = {run['wall'] / latency:.2f} latencies, "
              f"{run['requests']} requests, cached {run['cached']:,} of {run['prompt']:,} prompt tokens "
              f"({head_cached:.1%} of head tokens), input cost ${cost:.4f}")
        what = f"(a{'' if shared else ', c'}) {count} prompts, {'warm-up' if warm else 'naive'}"
        emit(f"{what}: wall", run["wall"])
        emit(f"{what}: requests", run["requests"], "calls")
        if shared and warm:
            emit(f"{what}: head tokens cached", 100 * head_cached, "%")
    extra = (runs[True]["wall"] - runs[False]["wall"]) / latency
    print(f"  warm-up wall - naive wall = {extra:+.2f} latencies (target <= +1)")


def headers(tokenizer: Any) -> list[str]:
    """4 few-shot headers of about 400 tokens each."""
    rng = random.Random(1)
    tasks = [
        ("Add the two numbers.", lambda a, b: (f"{a} + {b}", str(a + b))),
        ("Multiply the two numbers.", lambda a, b: (f"{a} * {b}", str(a * b))),
        ("Give the larger number.", lambda a, b: (f"max({a}, {b})", str(max(a, b)))),
        ("Subtract the second number from the first.", lambda a, b: (f"{a} - {b}", str(a - b))),
    ]
    out = []
    for instruction, example in tasks:
        text = f"{instruction} Answer with the number only.\n"
        while len(tokenizer(text)["input_ids"]) < 400:
            question, answer = example(rng.randint(10, 99), rng.randint(10, 99))
            text += f"Q: {question}\nA: {answer}\n"
        out.append(text)
    return out


def local_run(backend: Any, prompts: list[str], params: dict[str, Any], samples: int | None) -> tuple[list[Any], Any, float]:
    """``prompts`` through ``.eval`` (cache off): the scheduler's own batches; texts, trace and wall."""
    prompt = outlines.string("prompt")
    llm = Model(backend, **params)
    start = time.perf_counter()
    with outlines.trace() as trace:
        texts = llm(prompt, num_samples=samples).eval({prompt: prompts}, cache=False)
    return texts.tolist(), trace, time.perf_counter() - start


def part_b(count: int, new_tokens: int, shared: bool = True, batch: int = 32) -> None:
    from outlines.backends.transformers import TransformersBackend
    from outlines.testing import smollm2_gguf

    today = TransformersBackend(smollm2_gguf(), device="cpu", group_min_tokens=None, max_batch=batch)
    today.prefix_min_head = None  # as before prefix groups: batches in arrival order
    grouped = TransformersBackend(smollm2_gguf(), device="cpu", max_batch=batch)
    loaded = grouped.load()
    rng = random.Random(2)
    if shared:
        found = headers(loaded.tokenizer)
        sizes = [len(loaded.tokenizer(h)["input_ids"]) for h in found]
        prompts = [found[i % 4] + f"Q: {rng.randint(10, 99)} ? {rng.randint(10, 99)}\nA:" for i in range(count)]
        rng.shuffle(prompts)
        print(f"\n(b) SmolLM2: {count} prompts from 4 few-shot headers of {sizes} tokens, shuffled, batches of {batch}")
    else:
        prompts = [f"Q: what is {rng.randint(100, 999)} plus {rng.randint(100, 999)}? Reply briefly." for _ in range(count)]
        print(f"\n(c) SmolLM2: {count} prompts sharing nothing but the chat template, batches of {batch}")
    greedy = {"max_tokens": new_tokens, "temperature": 0}
    sampled = {"max_tokens": new_tokens, "temperature": 0.7, "seed": 11}
    local_run(grouped, prompts[:1], greedy, None)  # load and warm up
    today.load()
    results: dict[str, Any] = {}
    for name, backend in (("today", today), ("groups", grouped)):
        texts, trace, wall = local_run(backend, prompts, greedy, None)  # one draw a prompt: no sample axis
        samples, sample_trace, sample_wall = local_run(backend, prompts, sampled, 2)
        (prompt_tokens, new), cached = trace.tokens, trace.cached_tokens[0]
        computed = prompt_tokens - cached
        results[name] = (texts, samples, computed)
        print(f"  {name:>6}: prefill computed {computed:,} of {prompt_tokens:,} prompt tokens "
              f"in {len(trace.batches)} batches; greedy wall {wall:.1f} s, {(prompt_tokens + new) / wall:,.0f} "
              f"prompt+new tokens/s, {new / wall:.1f} new tokens/s; 2 seeded samples each: {sample_wall:.1f} s, "
              f"{sum(sample_trace.tokens) / sample_wall:,.0f} tokens/s")
    same = results["today"][:2] == results["groups"][:2]
    ratio = results["today"][2] / max(results["groups"][2], 1)
    print(f"  prefill tokens today / groups = {ratio:.2f}x{' (target >= 3x)' if shared else ''}; "
          f"same greedy texts and seeded samples: {same}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script")
    parser.add_argument("--part", choices=["a", "b", "c"], action="append", help="run only these parts")
    parser.add_argument("--repeat", type=int, default=3, help="HTTP runs per variant; the best wall is shown")
    parser.add_argument("--http", type=int, help="HTTP prompts (default 200; --quick: 50)")
    parser.add_argument("--latency", type=float, help="the server's latency in seconds (default 0.3; --quick: 0.1)")
    parser.add_argument("--local", type=int, help="SmolLM2 prompts (default 64; --quick: 16)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per SmolLM2 draw (default 16; --quick: 8)")
    parser.add_argument("--batch", type=int, default=32, help="SmolLM2's max_batch (default 32)")
    parser.add_argument("--json", action="store_true", help="also print part (a)'s rows as BENCH {json}")
    args = parser.parse_args()
    _compat.JSON = args.json
    parts = args.part or ["a", "b", "c"]
    count, latency, local, new_tokens = (50, 0.1, 16, 8) if args.quick else (200, 0.3, 64, 16)
    count, latency = args.http or count, args.latency or latency
    local, new_tokens = args.local or local, args.new_tokens or new_tokens
    if "a" in parts:
        part_a(count, latency, args.repeat)
    if "b" in parts:
        part_b(local, new_tokens, batch=args.batch)
    if "c" in parts:
        part_a(count, latency, args.repeat, shared=False)
        part_b(local, new_tokens, shared=False, batch=args.batch)


if __name__ == "__main__":
    main()
