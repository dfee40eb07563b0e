"""The Dask executor: per-batch overhead, and the tiny model on 1 vs 2 workers.

The scheduler and workers run as separate ``dask`` processes on 127.0.0.1, so
this process is the driver only and its CPU time is the driver's cost.

1. 100 batches of a trivial model (``max_batch=1``), one at a time and all in
   flight, with the local executor and on a 2-worker cluster: wall time per
   batch, and driver / Dask-scheduler CPU per batch.
2. 512 prompts on the tiny GPT-2 (32 new tokens, batches of 32), locally and on
   1 and 2 workers (models loaded before timing), interleaved: prompts/s, ratios.

    python benchmarks/bench_dask.py [--model PATH] [--repeat 3]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import outlines

N_BATCHES, N_PROMPTS, NEW_TOKENS = 100, 512, 32
DASK = os.path.join(os.path.dirname(sys.executable), "dask")


def same(prompts: list[str]) -> list[str]:
    return prompts


@contextlib.contextmanager
def cluster(n_workers: int) -> Iterator[tuple[Any, Processes]]:
    """A scheduler process and ``n_workers`` single-thread workers; yields the client and their processes."""
    import psutil
    from distributed import Client

    folder = tempfile.mkdtemp(prefix="bench-dask-")
    info = os.path.join(folder, "scheduler.json")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = subprocess.Popen(
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", info], **quiet
    )
    workers = None
    try:
        while not os.path.exists(info):
            time.sleep(0.05)
        time.sleep(0.1)  # the file is written in one go, but give it a moment
        address = json.load(open(info))["address"]
        workers = subprocess.Popen(
            [DASK, "worker", address, "--nworkers", str(n_workers), "--nthreads", "1", "--no-dashboard",
             "--host", "127.0.0.1"], **quiet,
        )
        with Client(address) as client:
            client.wait_for_workers(n_workers, timeout=60)
            children = psutil.Process(workers.pid).children(recursive=True)
            worker_processes = [p for p in children if "resource_tracker" not in " ".join(p.cmdline())]
            yield client, Processes(psutil.Process(scheduler.pid), worker_processes)
    finally:
        for process in (workers, scheduler):
            if process is not None:
                process.terminate()
                process.wait(timeout=30)


class Processes:
    """The Dask scheduler and worker processes whose CPU time a measurement reads."""

    def __init__(self, scheduler: Any = None, workers: list[Any] | None = None) -> None:
        self.scheduler = scheduler
        self.workers = workers or []

    def cpu(self) -> tuple[float, list[float]]:
        def seconds(process: Any) -> float:
            return float(sum(process.cpu_times()[:2]))

        return (seconds(self.scheduler) if self.scheduler else 0.0), [seconds(w) for w in self.workers]


def measure(run: Callable[[], Any], processes: Processes | None = None) -> dict[str, Any]:
    """Wall s, and CPU s of the driver, the Dask scheduler and each worker, for one call."""
    processes = processes or Processes()
    cpu, (sched, workers) = time.process_time(), processes.cpu()
    start = time.perf_counter()
    run()
    wall = time.perf_counter() - start
    sched_after, workers_after = processes.cpu()
    return {
        "wall": wall,
        "driver": time.process_time() - cpu,
        "scheduler": sched_after - sched,
        "workers": [after - before for before, after in zip(workers, workers_after)],
    }


def best(run: Callable[[], Any], repeat: int, processes: Processes | None = None) -> dict[str, Any]:
    run()  # warm-up
    return min((measure(run, processes) for _ in range(repeat)), key=lambda m: m["wall"])


def overhead_cases(executor: Any) -> dict[str, Callable[[], Any]]:
    q = outlines.string("q")
    prompts = [f"p{i}" for i in range(N_BATCHES)]
    cases = {}
    for label, concurrency in (("one at a time", 1), ("all in flight", None)):
        model = outlines.models.from_function(same, batched=True, max_batch=1, max_concurrency=concurrency)
        graph = model(q)
        cases[label] = lambda graph=graph: outlines.eval(
            graph, givens={"q": prompts}, cache=False, executor=executor, progress=False
        )
    return cases


def tiny_run(path: str, executor: Any) -> Callable[[], Any]:
    tiny = outlines.models.transformers(path, max_tokens=NEW_TOKENS, temperature=0, max_batch=32)
    graph = tiny(outlines.string("q"))
    prompts = [f"Q: What is {i} * {i % 7 + 2}? A:" for i in range(N_PROMPTS)]
    return lambda: outlines.eval(graph, givens={"q": prompts}, cache=False, executor=executor, progress=False)


def warm_workers(client: Any, path: str) -> None:
    """Load the model on every worker (small batches, so each worker gets some)."""
    from outlines.backends.dask import worker_stats

    tiny = outlines.models.transformers(path, max_tokens=1, temperature=0, max_batch=2)
    prompts = [f"warm {i}" for i in range(64)]
    outlines.eval(tiny(outlines.string("q")), givens={"q": prompts}, cache=False, executor=client, progress=False)
    loads = [sum(s["loads"] for s in stats.values()) for stats in client.run(worker_stats).values()]
    print(f"  model loads per worker after warm-up: {loads}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (default: build the tiny GPT-2)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from outlines.testing import build_tiny_model

    path = args.model or build_tiny_model()
    rows: list[tuple[str, str, str, str]] = []

    print(f"1. {N_BATCHES} batches of a trivial model", flush=True)
    local = {name: best(run, args.repeat) for name, run in overhead_cases(None).items()}
    with cluster(2) as (client, processes):
        remote = {name: best(run, args.repeat, processes) for name, run in overhead_cases(client).items()}
    for name in local:
        lw, lc = local[name]["wall"], local[name]["driver"]
        rw, rc, rs = remote[name]["wall"], remote[name]["driver"], remote[name]["scheduler"]
        per = 1000 / N_BATCHES
        rows.append((f"batch, {name}: wall ms/batch", f"{lw * per:.2f}", f"{rw * per:.2f}", f"{rw / lw:.1f}x"))
        rows.append((f"batch, {name}: driver CPU ms/batch", f"{lc * per:.2f}", f"{rc * per:.2f}", f"{rc / lc:.1f}x"))
        rows.append((f"batch, {name}: Dask scheduler CPU ms/batch", "-", f"{rs * per:.2f}", ""))

    print(f"2. {N_PROMPTS} prompts on the tiny model", flush=True)
    import torch

    torch.set_num_threads(1)  # like each worker (Dask sets OMP_NUM_THREADS=1 there)
    with cluster(1) as (one, processes_one), cluster(2) as (two, processes_two):
        warm_workers(one, path)
        warm_workers(two, path)
        runs = {"local": (tiny_run(path, None), None), 1: (tiny_run(path, one), processes_one),
                2: (tiny_run(path, two), processes_two)}
        for run, _ in runs.values():
            run()  # warm-up
        measured: dict[Any, list[dict[str, Any]]] = {name: [] for name in runs}
        for _ in range(args.repeat):  # interleaved, so background load hits every case alike
            for name, (run, processes) in runs.items():
                measured[name].append(measure(run, processes))
    fastest = {name: min(m, key=lambda x: x["wall"]) for name, m in measured.items()}
    rate = {name: N_PROMPTS / m["wall"] for name, m in fastest.items()}
    rows.append(("tiny model: prompts/s, local vs 1 worker", f"{rate['local']:.0f}", f"{rate[1]:.0f}",
                 f"{rate[1] / rate['local']:.2f}x"))
    rows.append(("tiny model: prompts/s, 1 vs 2 workers", f"{rate[1]:.0f}", f"{rate[2]:.0f}", f"{rate[2] / rate[1]:.2f}x"))
    # Equal totals mean splitting costs no extra work: with a free core per worker
    # (not so on a busy 2-core box) the wall ratio approaches the worker count.
    total = {n: sum(fastest[n]["workers"]) for n in (1, 2)}
    rows.append(("tiny model: worker CPU s in all, 1 vs 2 workers", f"{total[1]:.2f}", f"{total[2]:.2f}",
                 f"{total[2] / total[1]:.2f}x"))
    for n in (1, 2):
        m = fastest[n]
        workers = "+".join(f"{w:.2f}" for w in m["workers"])
        rows.append((f"tiny model, {n} worker(s): CPU s driver/scheduler/workers, wall s", "-",
                     f"{m['driver']:.2f}/{m['scheduler']:.2f}/{workers}, {m['wall']:.2f}", ""))

    print(f"\n(cpu count {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; best of {args.repeat} after a warm-up)")
    header = ("case", "baseline", "dask", "ratio")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for row in [header] + rows:
        print("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width) for i, (cell, width) in enumerate(zip(row, widths))))


if __name__ == "__main__":
    main()
