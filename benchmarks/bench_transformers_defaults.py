"""The transformers backend's defaults from the machine against the fixed ones they replaced (issue 42 item 10).

"before" is today's defaults written out (``dtype="float32"``, ``max_batch=32``,
``max_batch_tokens=65536``), "after" the defaults (the device's native dtype,
bfloat16 on a CPU with AVX512-BF16 or AMX; up to ``AUTO_MAX_BATCH`` rows within
the memory budget of the key/value cache). The main job's model, SmolLM2-135M-Instruct
(its GGUF file, as ``examples/word_problems.py`` loads it), generates 128
greedy tokens for 100 prompts (the main job's problems through its chat
format), each run in a fresh process (model load not timed, cache off), the
cases round-robin so background load hits both alike. ``--before-src`` runs
"before" on another checkout (the commit before the change: its code with its
defaults). Prints completion tokens/s per run, and the ratios of the best
runs and of the medians.

    python benchmarks/bench_transformers_defaults.py [--rounds 2] [--prompts 100] [--new-tokens 128] [--before-src DIR]

``--main-job``: runs ``examples/word_problems.py`` once per case, each in a
fresh process with an empty cache, the "before" one with the old defaults
patched into ``models.transformers`` (and on ``--before-src`` if given); prints
both tables (accuracy, walls, the trace's completion tokens).

    python benchmarks/bench_transformers_defaults.py --main-job [--before-src DIR] [-- example args]
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
#: Today's defaults before issue 42 item 10, written out.
BEFORE = {"dtype": "float32", "max_batch": 32, "max_batch_tokens": 1 << 16}
CASES: dict[str, dict[str, Any]] = {"before": BEFORE, "after": {}}


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("word_problems", ROOT / "examples" / "word_problems.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prompts(count: int) -> list[str]:
    """``count`` distinct prompts: the main job's problems, numbered, in its chat format."""
    example = _example()
    return [example.chatml(example.SOLVE, f"Problem {i + 1}: {example.PROBLEMS[i % len(example.PROBLEMS)]['question']}")
            for i in range(count)]


def throughput_case(case: str, count: int, new_tokens: int) -> None:
    """One timed run in this (fresh) process; prints a JSON line, then the texts."""
    import numpy as np

    import outlines
    from outlines import models
    from outlines.testing import smollm2_gguf

    outlines.cache.disable()
    batch = np.array(prompts(count), dtype=object)
    llm = models.transformers(smollm2_gguf(), chat=False, max_tokens=new_tokens, temperature=0, **CASES[case])
    loaded = llm.backend.load()
    llm(batch[:2], max_tokens=2).eval()  # warm-up: the counting tokenizer, the kernels' first call
    load = os.getloadavg()[0]
    with outlines.trace() as trace:
        start = time.perf_counter()
        texts = list(llm(batch).eval())
        wall = time.perf_counter() - start
    completion = trace.tokens[1]
    print(json.dumps({"case": case, "backend": repr(llm.backend), "batch_tokens": getattr(loaded, "batch_tokens", None),
                      "wall_s": round(wall, 1), "completion_tokens": completion,
                      "tokens_per_s": round(completion / wall, 1), "batch_sizes": sorted({b.size for b in trace.batches}),
                      "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}))
    print(json.dumps(texts))


def throughput(rounds: int, count: int, new_tokens: int, before_src: str | None) -> None:
    rates: dict[str, list[float]] = {name: [] for name in CASES}
    texts: dict[str, list[str]] = {}
    for _ in range(rounds):
        for name in CASES:
            src = before_src if name == "before" and before_src else str(ROOT)
            done = subprocess.run(
                [sys.executable, __file__, "--throughput-case", name, "--prompts", str(count),
                 "--new-tokens", str(new_tokens)], env={**os.environ, "PYTHONPATH": src},
                capture_output=True, text=True, check=True,
            )
            record, case_texts = done.stdout.strip().splitlines()[-2:]
            print(record, flush=True)
            rates[name].append(json.loads(record)["tokens_per_s"])
            texts[name] = json.loads(case_texts)
    same = sum(a == b for a, b in zip(texts["before"], texts["after"]))
    best = {name: max(values) for name, values in rates.items()}  # other processes only ever take time away
    middle = {name: statistics.median(values) for name, values in rates.items()}
    print(f"completion tokens/s of {rounds} rounds: best before {best['before']:.0f}, after {best['after']:.0f}: "
          f"{best['after'] / best['before']:.2f}x; median {middle['before']:.0f} and {middle['after']:.0f}: "
          f"{middle['after'] / middle['before']:.2f}x; {same}/{count} greedy texts identical")


def main_job_case(case: str, example_args: list[str]) -> None:
    """One run of the main job in this process, ``case``'s options patched into ``models.transformers``."""
    example = _example()
    example.models.transformers = functools.partial(example.models.transformers, **CASES[case])
    sys.argv = ["word_problems.py", *example_args]
    example.main()


def main_job(example_args: list[str], before_src: str | None) -> None:
    for case in CASES:
        with tempfile.TemporaryDirectory() as cache:  # nothing replayed from an earlier run
            src = before_src if case == "before" and before_src else str(ROOT)
            env = {**os.environ, "PYTHONPATH": src, "OUTLINES_CACHE_DIR": cache}
            print(f"== {case} {CASES[case]} (load {os.getloadavg()[0]:.2f})", flush=True)
            subprocess.run([sys.executable, __file__, "--main-job-case", case, "--", *example_args], env=env,
                           check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--main-job", action="store_true", help="the main job once per case, accuracy and walls")
    parser.add_argument("--before-src", help="an outlines checkout to run the before case on (default: this one)")
    parser.add_argument("--main-job-case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--throughput-case", choices=sorted(CASES), help=argparse.SUPPRESS)
    parser.add_argument("example_args", nargs="*", help="after --: arguments of examples/word_problems.py")
    args = parser.parse_args()
    if args.throughput_case:
        throughput_case(args.throughput_case, args.prompts, args.new_tokens)
    elif args.main_job_case:
        main_job_case(args.main_job_case, args.example_args)
    elif args.main_job:
        main_job(args.example_args, args.before_src)
    else:
        throughput(args.rounds, args.prompts, args.new_tokens, args.before_src)


if __name__ == "__main__":
    main()
