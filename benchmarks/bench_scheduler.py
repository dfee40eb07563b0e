"""The scheduler at scale, side by side with LangChain and Dask (issue 3).

The model is ``models.from_function`` over an async batched function that
sleeps 100 ms per call (one call = one request, whatever its size).

1. 1,000 independent chains of depth 3 (3,000 model nodes): wall vs the 0.3 s
   critical path, and vs a LangChain ``RunnableLambda`` chain's ``.abatch``.
2. The same chain as a compiled Program over 5,000 inputs (3 nodes, vectorized):
   wall vs the critical path, and vs LangChain on the same 5,000 inputs.
3. 2,000 chains x 5 trivial ``outlines.fn`` steps (10,000 nodes, cache off):
   build and eval microseconds per node vs ``dask.delayed`` (sync scheduler).
4. Memory: build and eval a 100,000-node graph in a child process; peak RSS
   added, KB per node.
5. Random latencies (50-150 ms): requests sent vs the ideal
   depth x ceil(N / max_batch), wall vs critical path, with the gathering
   window (default) and without (``batch_window=0``): (a) each model call
   sleeps a random time; (b) each chain step is an async tool of random
   latency before the 100 ms model, so siblings become ready at different times.

Walls are the best of 3 runs (LangChain on 5,000 inputs: one run). Every
figure is printed with its target and PASS/FAIL; note that "3x faster than
LangChain" needs LangChain to take at least 3 x 0.3 s = 0.9 s, since nothing
beats the critical path.

Run: ``.venv/bin/python benchmarks/bench_scheduler.py [--quick]``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import random
import subprocess
import sys
import time
from typing import Any, Callable

import _compat  # noqa: E402
from _compat import ROOT, emit  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
from outlines import models  # noqa: E402

LATENCY = 0.1
DEPTH = 3
REPEAT = 3  # walls are the best of REPEAT runs: the machine may be shared
PEERS = True  # False (``--no-peers``): skip LangChain and Dask, whose times do not depend on this package
ROWS: list[tuple[str, str, str, str]] = []  # (what, measured, target, PASS/FAIL/-)


def row(what: str, measured: str, target: str = "", ok: bool | None = None) -> None:
    ROWS.append((what, measured, target, "-" if ok is None else ("PASS" if ok else "FAIL")))
    print(f"  {what:<58} {measured:<34} {target:<16} {ROWS[-1][3]}", flush=True)


class Backend:
    """An async batched function: sleeps per call, counts calls."""

    def __init__(self, latency: Callable[[], float] | float = LATENCY) -> None:
        self.latency = latency
        self.calls = 0
        self.prompts = 0

    async def __call__(self, prompts: list[str]) -> list[str]:
        self.calls += 1
        self.prompts += len(prompts)
        await asyncio.sleep(self.latency() if callable(self.latency) else self.latency)
        return [p[-16:] + "." for p in prompts]


CPU: list[float] = []  # process CPU seconds of each timed() call


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    CPU.append(time.process_time() - cpu)
    return time.perf_counter() - start, result


def best_wall(fn: Callable[[], Any]) -> tuple[float, float]:
    """(best wall, CPU seconds of that run) over REPEAT runs."""
    runs = []
    for _ in range(REPEAT):
        wall, _ = timed(fn)
        runs.append((wall, CPU[-1]))
    return min(runs)


# -- 1 and 2: chains of model calls ------------------------------------------------------
def chain_graph(llm: models.Model, n: int) -> list[outlines.Variable]:
    outs = []
    for i in range(n):
        x: Any = outlines.constant(f"Question {i}:")
        for _ in range(DEPTH):
            x = llm(x)
        outs.append(x)
    return outs


def langchain_wall(n: int, repeat: int) -> tuple[float, int]:
    from langchain_core.runnables import RunnableLambda

    backend = Backend()

    async def step(x: str) -> str:
        return (await backend([x]))[0]

    chain = RunnableLambda(step) | RunnableLambda(step) | RunnableLambda(step)
    inputs = [f"Question {i}:" for i in range(n)]
    wall = min(timed(lambda: asyncio.run(chain.abatch(inputs)))[0] for _ in range(repeat))
    return wall, backend.calls // repeat


def bench_chains(n: int, program_n: int) -> None:
    critical = DEPTH * LATENCY
    print(f"\n1. {n} independent chains x depth {DEPTH}, 100 ms per call (critical path {critical:.1f} s)")
    runs = []
    for _ in range(REPEAT):  # a fresh graph each time: build is not timed, plan and eval are
        backend = Backend()
        llm = models.from_function(backend, batched=True, name="sleepy")
        outs = chain_graph(llm, n)
        predicted = outlines.explain(*outs, cache=False).requests
        runs.append((timed(lambda: outlines.eval(*outs, cache=False))[0], CPU[-1]))
    wall, cpu = min(runs)
    requests = backend.calls
    outs = chain_graph(llm, n)
    with outlines.trace() as trace:
        traced, _ = timed(lambda: outlines.eval(*outs, cache=False))
    traced_cpu = CPU[-1]
    row(f"outlines wall ({requests} requests; explain said {predicted}; cpu {cpu * 1e3:.0f} ms)",
        f"{wall:.3f} s = {wall / critical:.2f}x cp", "<= 1.3x cp", wall <= 1.3 * critical)
    row(f"  traced run: wall {trace.wall:.3f} s, critical path {trace.critical_path:.3f} s",
        f"{traced:.3f} s (cpu {traced_cpu * 1e3:.0f} ms)")
    emit(f"1. {n} chains x {DEPTH}: wall", wall)
    emit(f"1. {n} chains x {DEPTH}: requests", requests, "calls")
    emit(f"1. {n} chains x {DEPTH}: traced wall", traced)
    if not PEERS:
        _program(program_n, critical)
        return
    lc_wall, lc_calls = langchain_wall(n, REPEAT)
    bound = f" (bound {lc_wall / critical:.1f}x)" if lc_wall < 3 * critical else ""
    row(f"LangChain RunnableLambda .abatch ({lc_calls} calls)", f"{lc_wall:.3f} s = {lc_wall / wall:.1f}x outlines{bound}",
        ">= 3x", lc_wall >= 3 * wall)
    _program(program_n, critical)


def _program(program_n: int, critical: float) -> None:
    print(f"\n2. compiled Program over {program_n} inputs (3 nodes, vectorized)")
    backend = Backend()
    llm = models.from_function(backend, batched=True, name="sleepy")
    program = outlines.compile(lambda q: llm(llm(llm(q))), cache=False)
    inputs = [f"Question {i}:" for i in range(program_n)]
    wall, cpu = best_wall(lambda: program(inputs))
    row(f"outlines Program wall ({backend.calls // REPEAT} requests; cpu {cpu * 1e3:.0f} ms)", f"{wall:.3f} s = {wall / critical:.2f}x cp",
        "<= 1.2x cp", wall <= 1.2 * critical)
    emit(f"2. Program over {program_n} inputs: wall", wall)
    emit(f"2. Program over {program_n} inputs: requests", backend.calls // REPEAT, "calls")
    if PEERS:
        lc_wall, _ = langchain_wall(program_n, 1)
        row("LangChain RunnableLambda .abatch, same inputs", f"{lc_wall:.3f} s = {lc_wall / wall:.1f}x outlines", "",
            None)


# -- 3: trivial Python steps ------------------------------------------------------------------
def step_python(x: str) -> str:
    return x + "+"


def outlines_fn_chains(chains: int, steps: int) -> list[outlines.Variable]:
    step = outlines.fn(step_python, name="step")
    outs = []
    for i in range(chains):
        x: Any = f"s{i}"
        for _ in range(steps):
            x = step(x)
        outs.append(x)
    return outs


def dask_chains(chains: int, steps: int) -> list[Any]:
    from dask import delayed

    outs = []
    for i in range(chains):
        x: Any = f"s{i}"
        for _ in range(steps):
            x = delayed(step_python, pure=False)(x)
        outs.append(x)
    return outs


def best(fn: Callable[[], Any], repeat: int = 3) -> tuple[float, Any]:
    runs = [timed(fn) for _ in range(repeat)]
    return min(r[0] for r in runs), runs[-1][1]


def bench_fn_chains(chains: int, steps: int) -> None:
    import dask

    nodes = chains * steps
    print(f"\n3. {chains} chains x {steps} trivial outlines.fn steps ({nodes} nodes, cache off; best of 3)")
    build, outs = best(lambda: outlines_fn_chains(chains, steps))
    evaluate, values = best(lambda: outlines.eval(*outs, cache=False))
    assert values[0] == "s0" + "+" * steps
    us = 1e6 / nodes
    emit(f"3. {nodes} fn nodes: build per node", build * us, "us")
    emit(f"3. {nodes} fn nodes: eval per node", evaluate * us, "us")
    if not PEERS:
        row("build", f"{build * us:.2f} us/node", "<=10 us", build * us <= 10)
        row("eval", f"{evaluate * us:.2f} us/node", "<=20 us", evaluate * us <= 20)
        return
    dask_build, douts = best(lambda: dask_chains(chains, steps))
    dask_eval, dvalues = best(lambda: dask.compute(*douts, scheduler="sync"))
    assert list(dvalues) == list(values)
    row("build", f"{build * us:.2f} us/node; dask {dask_build * us:.1f} = {dask_build / build:.0f}x",
        "<=10 us, >=20x", build * us <= 10 and dask_build >= 20 * build)
    row("eval", f"{evaluate * us:.2f} us/node; dask {dask_eval * us:.1f} = {dask_eval / evaluate:.0f}x",
        "<=20 us, >=20x", evaluate * us <= 20 and dask_eval >= 20 * evaluate)


# -- 4: memory (in a child process) -------------------------------------------------------------
def rss_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def reset_peak() -> int:
    """Collect, reset the peak RSS (VmHWM) to the current RSS, and return that RSS in KB."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:  # not Linux, or not allowed: the peak then includes what came before
        pass
    return rss_kb("VmRSS")


def memory_child(kind: str, nodes: int) -> None:
    """Build and eval ``nodes`` nodes; print the peak RSS added (KB) as JSON."""
    llm = models.from_function(Backend(0.0), batched=True, name="instant")
    outlines_fn_chains(2, 5), outlines.eval(*outlines_fn_chains(2, 5), cache=False)  # warm imports and pools
    outlines.eval(llm(outlines.constant("warm")), cache=False)
    before = reset_peak()
    if kind == "fn":
        outs = outlines_fn_chains(nodes // 5, 5)
    else:
        outs = chain_graph(llm, nodes // DEPTH)
    outlines.eval(*outs, cache=False)
    print(json.dumps({"added_kb": rss_kb("VmHWM") - before, "nodes": nodes}))


def bench_memory(nodes: int) -> None:
    print(f"\n4. memory: build + eval a {nodes}-node graph (child process, peak RSS added)")
    for kind, label in (("fn", "outlines.fn chains x 5"), ("model", "model chains x 3, instant backend")):
        out = subprocess.run([sys.executable, __file__, "--memory-child", kind, str(nodes)],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        data = json.loads(out.stdout.strip().splitlines()[-1])
        mb, per = data["added_kb"] / 1024, data["added_kb"] * 1024 / nodes / 1024
        row(label, f"{mb:.1f} MB = {per:.2f} KB/node", "<=100 MB, <=1 KB", mb <= 100 and per <= 1.0)
        emit(f"4. memory, {label}: per node", per, "KB")


# -- 5: random latencies ----------------------------------------------------------------------
def bench_random(n: int, max_batch: int) -> None:
    ideal = DEPTH * math.ceil(n / max_batch)
    print(f"\n5. {n} chains x depth {DEPTH}, max_batch {max_batch}: ideal {ideal} requests")
    for window in (None, 0.0):
        rng = random.Random(3)
        backend = Backend(lambda: rng.uniform(0.05, 0.15))
        llm = models.from_function(backend, batched=True, name="jittery", max_batch=max_batch)
        outs = chain_graph(llm, n)
        options: dict[str, Any] = {} if window is None else {"batch_window": window}
        with outlines.trace() as trace:
            wall, _ = timed(lambda: outlines.eval(*outs, cache=False, **options))
        name = "default window" if window is None else "batch_window=0"
        row(f"(a) model call 50-150 ms, {name}",
            f"{backend.calls} req ({backend.calls / ideal:.2f}x); {wall:.3f} s = {wall / trace.critical_path:.2f}x cp")
        emit(f"5a. {name}: requests", backend.calls, "calls")
        emit(f"5a. {name}: wall / critical path", wall / trace.critical_path, "x cp")
    for window in (0.0, None, 0.02, 0.1):
        rng = random.Random(5)
        delays = {(i, s): rng.uniform(0.05, 0.15) for i in range(n) for s in range(DEPTH)}
        critical = max(sum(delays[i, s] + LATENCY for s in range(DEPTH)) for i in range(n))

        @outlines.fn(name="tool")
        async def tool(x: str, chain: int, step: int) -> str:
            await asyncio.sleep(delays[chain, step])
            return x

        backend = Backend()
        llm = models.from_function(backend, batched=True, name="sleepy", max_batch=max_batch)
        outs = []
        for i in range(n):
            x: Any = outlines.constant(f"Question {i}:")
            for s in range(DEPTH):
                x = llm(tool(x, i, s))
            outs.append(x)
        options = {} if window is None else {"batch_window": window}
        wall, _ = timed(lambda: outlines.eval(*outs, cache=False, **options))
        name = "default window (5 ms)" if window is None else f"batch_window={window:g}"
        row(f"(b) tool 50-150 ms + model 100 ms, {name}",
            f"{backend.calls} req ({backend.calls / ideal:.2f}x); {wall:.3f} s = {wall / critical:.2f}x cp")
        emit(f"5b. {name}: requests", backend.calls, "calls")
        emit(f"5b. {name}: wall / critical path", wall / critical, "x cp")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--section", type=int, action="append", choices=range(1, 6),
                        help="run only these sections (repeatable; 1 and 2 run together)")
    parser.add_argument("--no-peers", action="store_true", help="skip LangChain and Dask (their times are not ours)")
    parser.add_argument("--json", action="store_true", help="also print each row as a line BENCH {json}")
    parser.add_argument("--memory-child", nargs=2, metavar=("KIND", "NODES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return
    global PEERS
    PEERS, _compat.JSON = not args.no_peers, args.json
    scale = 10 if args.quick else 1
    load = os.getloadavg()[0]
    print(f"outlines scheduler benchmarks (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {load:.1f})")
    sections = set(args.section or range(1, 6))
    if 1 in sections or 2 in sections:
        bench_chains(1000 // scale, 5000 // scale)
    if 3 in sections:
        bench_fn_chains(2000 // scale, 5)
    if 4 in sections:
        bench_memory(100_000 // scale)
    if 5 in sections:
        bench_random(1000 // scale, 64 // (2 if args.quick else 1))
    failed = [r for r in ROWS if r[3] == "FAIL"]
    print(f"\n{sum(r[3] == 'PASS' for r in ROWS)} PASS, {len(failed)} FAIL")
    for what, measured, target, _ in failed:
        print(f"  FAIL {what.strip()}: {measured} (target {target})")


if __name__ == "__main__":
    main()
