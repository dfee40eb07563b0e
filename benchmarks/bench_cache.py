"""The draw cache side by side: warm re-eval, cold overhead, lookups vs joblib and LangChain.

1. Warm re-eval of 1,000 chains x depth 3 (three model calls in a row per
   chain), everything cached: microseconds per graph node and backend calls
   (must be 0), with the in-memory LRU warm and with only the disk warm (a new
   process's view).
2. Cold run with the cache on vs off, on a zero-latency batched function (pure
   overhead, the worst case) and on a loopback OpenAI-compatible fake server
   (tests/fixtures/fake_openai.py in a child process) answering after 20 ms
   and 100 ms: wall-time ratio.
3. Lookup cost per draw on the same 10,000 keys: outlines ``Cache.get_many``
   (batches of 128, as the scheduler calls it, and one key at a time) vs
   ``joblib.Memory`` and LangChain's ``SQLiteCache``, all reading from disk in
   this run: microseconds per draw and ratios.
4. The cache at scale (issue 15): 100,000 inputs x 3 model calls (300,000
   draws). (a) The store alone: ``draw_key`` per draw, ``put_many`` of each
   100,000-draw batch on the caller's thread, the flush lag (last put to
   everything committed), warm lookups from the memory LRU and from disk only,
   and file bytes per entry. (b) A compiled Program on 100,000 inputs (3
   batched model calls of 100 ms: critical path 0.3 s): cold eval wall with
   the cache off and on, the writer's lag after the eval returned, and the
   warm re-eval (memory, then disk only). ``--scale-only`` runs just this.

Run: ``.venv/bin/python benchmarks/bench_cache.py [--chains 1000] [--keys 10000] [--scale 100000]``.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import _compat  # noqa: E402
from _compat import ROOT, emit  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
import outlines.cache.keys  # noqa: E402
from outlines import models  # noqa: E402
from outlines.draws import Draw, GenerationParams  # noqa: E402
from outlines.cache import Cache, draw_key  # noqa: E402
from outlines.graph.traversal import toposort  # noqa: E402


class Counter:
    """A batched model that counts the prompts it is sent."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts: list[str]) -> list[str]:
        self.calls += len(prompts)
        return [p + " ok" for p in prompts]


def chains(llm: models.Model, count: int, depth: int, salt: str = "") -> list[Any]:
    outs = []
    for i in range(count):
        value: Any = outlines.constant(f"Question {i}{salt}: what is {i} * 3?")
        for step in range(depth):
            value = llm(value + f" Step {step}:")
        outs.append(value)
    return outs


def timed(fn: Callable[[], Any], repeat: int = 1) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def warm_reeval(directory: Path, count: int, depth: int) -> None:
    counter = Counter()
    llm = models.from_function(counter, batched=True, name="counter", temperature=0.7)
    outs = chains(llm, count, depth)
    nodes = len(toposort(outs))
    cache = Cache(directory / "warm")
    cold = timed(lambda: outlines.eval(*outs, cache=cache))
    sent = counter.calls
    warm = timed(lambda: outlines.eval(*outs, cache=cache), repeat=3)
    disk = timed(lambda: outlines.eval(*outs, cache=Cache(directory / "warm")), repeat=3)
    print(f"\n1. warm re-eval, {count} chains x depth {depth} ({nodes} nodes, {sent} draws on the cold run)")
    print(f"   cold run               {cold * 1e3:8.1f} ms")
    print(f"   warm, memory LRU       {warm * 1e3:8.1f} ms  = {warm / nodes * 1e6:6.1f} us per node")
    print(f"   warm, disk only        {disk * 1e3:8.1f} ms  = {disk / nodes * 1e6:6.1f} us per node")
    print(f"   backend calls on the warm runs: {counter.calls - sent}  (target 0; target <= 30 us per node)")
    emit("1. warm re-eval, memory: per node", warm / nodes * 1e6, "us")
    emit("1. warm re-eval, disk only: per node", disk / nodes * 1e6, "us")
    emit("1. warm re-eval: backend calls", counter.calls - sent, "calls")


class Server:
    """The fake OpenAI server in a child process (as in bench_openai.py)."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-m", "tests.fixtures.fake_openai", "--latency", str(latency)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        assert self.process.stdout is not None
        self.base_url = self.process.stdout.readline().strip()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def cold_overhead(directory: Path, count: int, depth: int, latencies: list[float]) -> None:
    print(f"\n2. cold run, cache on vs off ({count} chains x depth {depth}; median of 7, alternating)")
    counter = Counter()
    function_llm = models.from_function(counter, batched=True, name="counter", temperature=0.7)
    servers = [Server(latency) for latency in latencies]
    try:
        configurations = [("zero-latency batched function", function_llm)] + [
            (f"fake OpenAI server, {server.latency * 1e3:.0f} ms",
             models.openai_completion("tiny", base_url=server.base_url, api_key="sk-bench", temperature=0.7))
            for server in servers
        ]
        for label, llm in configurations:
            # Interleave on and off so drift hits both alike. The cache file exists (as it
            # does after a first use) but holds none of the run's draws: prompts are salted.
            cache = Cache(directory / "cold")
            cache.get_many([draw_key(("bench", "open the file"), Draw("open", GenerationParams.create(), 0))])
            times: dict[str, list[float]] = {"on": [], "off": []}
            for run in range(7):
                for kind in ("on", "off") if run % 2 else ("off", "on"):
                    outs = chains(llm, count, depth, salt=f" ({label} {kind} {run})")
                    gc.collect()  # building the graph must not leave garbage to the timed run
                    times[kind].append(timed(lambda: outlines.eval(*outs, cache=cache if kind == "on" else False)))
                    cache.flush()  # the writer's leftovers are not charged to the next run
            on_times, off_times = times["on"], times["off"]
            on, off = statistics.median(on_times), statistics.median(off_times)
            print(f"   {label:32s} off {off * 1e3:8.1f} ms   on {on * 1e3:8.1f} ms   ratio {on / off:5.3f}"
                  "  (target <= 1.10)")
            emit(f"2. cold, {label}: cache off", off)
            emit(f"2. cold, {label}: cache on", on)
    finally:
        for server in servers:
            server.close()


def lookups(directory: Path, count: int) -> None:
    import joblib
    from langchain_community.cache import SQLiteCache
    from langchain_core.outputs import Generation

    identity = ("openai_completion", "tiny", "http://127.0.0.1:8000/v1")
    params = GenerationParams.create(temperature=0.7, max_tokens=64)
    requests = [Draw(f"Question {i}: what is {i} * 3?", params, i % 5) for i in range(count)]
    texts = [f"answer {i} " * 8 for i in range(count)]
    keys = [draw_key(identity, r) for r in requests]
    llm_string = repr((identity, params.to_dict()))

    ours = Cache(directory / "ours")
    for start in range(0, count, 128):
        ours.put_many(dict(zip(keys[start : start + 128], texts[start : start + 128])))

    def ours_batched() -> None:
        cache = Cache(directory / "ours")  # nothing in memory: disk reads, as in a new process
        for start in range(0, count, 128):
            cache.get_many([draw_key(identity, r) for r in requests[start : start + 128]])

    def ours_single() -> None:
        cache = Cache(directory / "ours")
        for request in requests:
            cache.get_many([draw_key(identity, request)])

    def ours_memory() -> None:
        for start in range(0, count, 128):
            ours.get_many([draw_key(identity, r) for r in requests[start : start + 128]])

    memory = joblib.Memory(str(directory / "joblib"), verbose=0)

    def generate(prompt: str, model: tuple, params: dict, draw: int) -> str:
        return texts[int(prompt.split()[1].rstrip(":"))]

    cached = memory.cache(generate)
    for request in requests:
        cached(request.prompt, identity, request.params.to_dict(), request.draw)

    def joblib_lookup() -> None:
        for request in requests:
            cached(request.prompt, identity, request.params.to_dict(), request.draw)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        langchain = SQLiteCache(database_path=str(directory / "langchain.db"))
    for request, text in zip(requests, texts):
        langchain.update(f"{request.prompt}#{request.draw}", llm_string, [Generation(text=text)])

    def langchain_lookup() -> None:
        for request in requests:
            langchain.lookup(f"{request.prompt}#{request.draw}", llm_string)

    results = {
        "outlines get_many, batches of 128 (disk)": timed(ours_batched, 3),
        "outlines get_many, one key at a time (disk)": timed(ours_single, 3),
        "outlines get_many, batches of 128 (memory LRU)": timed(ours_memory, 3),
        "joblib.Memory (one call per draw)": timed(joblib_lookup, 3),
        "LangChain SQLiteCache.lookup": timed(langchain_lookup, 3),
    }
    base = results["outlines get_many, batches of 128 (disk)"]
    print(f"\n3. lookup cost per draw, {count} keys, all present (keys hashed inside each timing)")
    for label, seconds in results.items():
        print(f"   {label:48s} {seconds / count * 1e6:8.2f} us/draw   {seconds / base:7.1f}x outlines batched")


def scale_store(directory: Path, count: int) -> None:
    """4a: the store alone, on 3 x ``count`` draws put and read as the scheduler does."""
    identity = ("function", "chain", "0123abcd", True)
    params = GenerationParams.create(temperature=0.7)
    levels = [[Draw(f"Question {i}: what is {i} * 3? Step {step}:", params, 0) for i in range(count)]
              for step in range(3)]
    texts = [f"answer {i}, thought through" for i in range(count)]
    many = getattr(outlines.cache.keys, "draw_keys", None)  # the batch form, where it exists
    start = time.perf_counter()
    keys = [[draw_key(identity, d) for d in level] for level in levels]
    single = time.perf_counter() - start
    batched = None
    if many is not None:
        start = time.perf_counter()
        for level in levels:
            many(identity, level)
        batched = time.perf_counter() - start
    cache = Cache(directory / "scale")
    cache.get_many(keys[0][:1])  # opens the new file, as a first lookup does
    lookup_cold = put = 0.0
    for level_keys in keys:
        start = time.perf_counter()
        cache.get_many(level_keys)  # every draw misses: the scheduler's lookup before sending
        lookup_cold += time.perf_counter() - start
        start = time.perf_counter()
        cache.put_many(dict(zip(level_keys, texts)))
        put += time.perf_counter() - start
    start = time.perf_counter()
    cache.flush()
    lag = time.perf_counter() - start
    start = time.perf_counter()
    hits = sum(len(cache.get_many(level_keys)) for level_keys in keys)
    memory = time.perf_counter() - start
    fresh = Cache(directory / "scale", memory_entries=0)
    start = time.perf_counter()
    hits_disk = sum(len(fresh.get_many(level_keys)) for level_keys in keys)
    disk = time.perf_counter() - start
    cache.close()
    size = sum(f.stat().st_size for f in (directory / "scale").iterdir())
    total = 3 * count
    print(f"\n4a. the store alone, 3 x {count} draws (load {os.getloadavg()[0]:.2f})")
    print(f"   draw_key, one per draw        {single * 1e3:8.1f} ms = {single / total * 1e6:5.2f} us/draw")
    if batched is not None:
        print(f"   draw_keys, one per batch      {batched * 1e3:8.1f} ms = {batched / total * 1e6:5.2f} us/draw")
    print(f"   lookups on the new file (all miss) {lookup_cold * 1e3:8.1f} ms")
    print(f"   put_many (caller's thread)    {put * 1e3:8.1f} ms = {put / total * 1e6:5.2f} us/draw")
    print(f"   flush lag after the last put  {lag * 1e3:8.1f} ms")
    print(f"   warm lookups, memory LRU      {memory * 1e3:8.1f} ms = {memory / total * 1e6:5.2f} us/draw ({hits} hits)")
    print(f"   warm lookups, disk only       {disk * 1e3:8.1f} ms = {disk / total * 1e6:5.2f} us/draw ({hits_disk} hits)")
    print(f"   file                          {size / 1e6:8.1f} MB = {size / total:5.0f} bytes/entry")


def scale_program(directory: Path, count: int) -> None:
    """4b: a compiled 3-call Program on ``count`` inputs, cache off, cold, warm."""
    import asyncio

    async def respond(prompts: list[str]) -> list[str]:
        await asyncio.sleep(0.1)
        return [p[-12:] + " ok" for p in prompts]

    llm = models.from_function(respond, batched=True, name="scale", temperature=0.7)
    program = outlines.compile(lambda q: llm(llm(llm(q + " A:") + " B:") + " C:"))
    inputs = [f"Question {i}: what is {i} * 3?" for i in range(count)]
    cache = Cache(directory / "program")

    def run(option: Any) -> tuple[float, float]:
        gc.collect()
        cpu, start = time.process_time(), time.perf_counter()
        program.with_options(cache=option)(inputs)
        return time.perf_counter() - start, time.process_time() - cpu

    off = run(False)
    cold = run(cache)
    start = time.perf_counter()
    cache.flush()
    lag = time.perf_counter() - start
    warm = run(cache)
    disk = run(Cache(directory / "program", memory_entries=0))
    print(f"\n4b. Program on {count} inputs x 3 model calls of 100 ms (load {os.getloadavg()[0]:.2f})")
    for label, (wall, cpu) in (("cache off", off), ("cache on, cold", cold), ("warm, memory LRU", warm),
                               ("warm, disk only", disk)):
        print(f"   {label:20s} {wall:7.2f} s = {wall / 0.3:5.2f}x the critical path  (cpu {cpu:5.2f} s)")
        emit(f"4b. Program on {count} inputs, {label}", wall)
    print(f"   writer still busy after the cold eval returned: {lag * 1e3:8.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=1000)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--latency", type=float, nargs="*", default=[0.02, 0.1],
                        help="the fake servers' latencies in part 2 (none: the zero-latency function only)")
    parser.add_argument("--scale", type=int, default=100_000)
    parser.add_argument("--scale-only", action="store_true")
    parser.add_argument("--part", action="append", choices=["1", "2", "3", "4a", "4b"],
                        help="run only these parts (repeatable)")
    parser.add_argument("--json", action="store_true", help="also print the eval and Program rows as BENCH {json}")
    args = parser.parse_args()
    _compat.JSON = args.json
    parts = set(args.part or (["4a", "4b"] if args.scale_only else ["1", "2", "3", "4a", "4b"]))
    directory = Path(tempfile.mkdtemp(prefix="outlines-bench-cache-"))
    try:
        if "1" in parts:
            warm_reeval(directory, args.chains, args.depth)
        if "2" in parts:
            cold_overhead(directory, args.chains, args.depth, args.latency)
        if "3" in parts:
            lookups(directory, args.keys)
        if "4a" in parts:
            scale_store(directory, args.scale)
        if "4b" in parts:
            scale_program(directory, args.scale)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
