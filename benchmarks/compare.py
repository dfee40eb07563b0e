"""Benchmark rows against two package trees in one sitting: old vs new, interleaved (issue 40).

The benchmark scripts are this tree's; the ``outlines`` package they import
is either ``--old PATH``'s (a checkout of another commit, e.g. ``git worktree
add ../old141 141f75c``) or ``--new PATH``'s (default: this tree). Each job
runs ``--runs`` times per tree, each time in a fresh process with a fresh
temporary ``OUTLINES_CACHE_DIR`` (the default cache where a row has the
cache on), old and new alternating which goes first; ``--confirm N`` then
runs each job that has a FLAG N more times per tree before the table.

Per row it prints old best / median, new best / median (best: the min; for
a row whose unit is ``%`` or ``x faster``, the max), the ratio new / old of
the bests (and of the medians) and FLAG where new's best is worse than
old's by more than ``--tolerance`` (5%). The load average is printed with
every run, and where a script reports it, the CPU seconds of the timed part
(``cpu s`` rows): on a shared machine the walls include waiting for a core,
the CPU seconds less so.

With no ``--old`` both sides are this tree: a control run whose ratios show
the noise of the machine, the yardstick for reading a real comparison.

Rows (``--list`` prints the jobs; ``--only TEXT`` keeps the jobs whose name
contains TEXT):

- ``bench_scale.py``: every case as one child process each (its ``--child``
  mode): 1k / 5k / 20k chains, the four shapes at 5k and 20k (with build and
  plan per node), Program 10k / 100k (peak RSS per element, warm re-eval),
  the Program with steps, the issue-40 Program ``m(m(m(q) + "a") + "b")``
  and its hand-written floor, refine loops and routed chains (stacked; the
  unstacked ones at 1k, and at 5k with ``--slow``), 10k trivial fn nodes
  (without Dask: its time is not ours);
- ``bench_scheduler.py --no-peers``: rows 1-5 (LangChain and Dask left out);
- ``bench_control.py``: the three outlines variants (LangGraph left out);
- ``bench_cache.py``: parts 1, 2 (the zero-latency function) and 4b;
- quick variants: ``bench_prefix.py --quick --part a``, ``bench_jobs.py
  --quick``, ``bench_vote.py --runs 1`` (its figures are seeded counts);
- not compared (printed at the end, with why): the scripts bound by a real
  model or by peers.

The two issue-40 figures are printed for both trees at the end: 20k chains
with an impure ``outlines.fn`` step (wall / critical path, cache off and on;
targets 1.4x and 1.7x) and the 100k Program (wall / its floor; 1.15x, 1.35x).

Run: ``python benchmarks/compare.py --old ../old141 [--new .] [--runs 3] [--confirm 2] [--only TEXT]
[--out FILE.json]``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
#: Units where a larger value is better; every other unit is a cost (seconds, us, KB, calls, x cp).
HIGHER_IS_BETTER = ("%", "x faster")
CRITICAL = 0.3  # bench_scale: 3 model calls of 100 ms

Rows = dict[str, tuple[float, str]]


@dataclass
class Job:
    """One script invocation; ``parse`` turns its stdout into rows ``{name: (value, unit)}``."""

    name: str
    argv: list[str]
    parse: Callable[[str], Rows]
    timeout: float = 300.0
    results: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: {"old": [], "new": []})


def bench_lines(prefix: str) -> Callable[[str], Rows]:
    """The ``BENCH {json}`` lines a script prints under ``--json``."""

    def parse(stdout: str) -> Rows:
        rows = {}
        for line in stdout.splitlines():
            if line.startswith("BENCH "):
                row = json.loads(line[6:])
                rows[f"{prefix}{row['row']}"] = (float(row["value"]), row["unit"])
        return rows

    return parse


def last_json(prefix: str, keys: dict[str, tuple[str, str]]) -> Callable[[str], Rows]:
    """The last stdout line as a JSON dict: ``keys`` maps its fields to (row suffix, unit)."""

    def parse(stdout: str) -> Rows:
        data = json.loads(stdout.strip().splitlines()[-1])
        data = data.get("result", data)  # bench_jobs wraps its figures
        return {f"{prefix}{suffix}": (float(data[key]), unit) for key, (suffix, unit) in keys.items()
                if key in data and data[key] == data[key]}  # NaN: not measured

    return parse


def scale_job(name: str, spec: dict[str, Any], extra: dict[str, tuple[str, str]] | None = None) -> Job:
    keys = {"wall": ("", "s"), "cpu": (": cpu", "cpu s"), **(extra or {})}
    return Job(f"bench_scale: {name}", ["bench_scale.py", "--child", json.dumps(spec)],
               last_json(f"scale: {name}", keys))


def jobs(slow: bool = False) -> list[Job]:
    """Every job, in the order they run; ``slow``: also the 5k control chains left unstacked (20 s a run loaded)."""
    out = []
    for n in (1_000, 5_000, 20_000):
        for cache in (False, True):
            out.append(scale_job(f"{n} chains, cache {'on' if cache else 'off'}",
                                 {"kind": "chains", "n": n, "cache": cache}))
    for n in (5_000, 20_000):
        for shape in ("concat", "template", "fn", "fn-default"):
            for cache in (False, True):
                per_node = {"build_us": (": build per node", "us"), "plan_us": (": plan per node", "us")}
                out.append(scale_job(f"{shape} {n} chains, cache {'on' if cache else 'off'}",
                                     {"kind": "shape", "n": n, "cache": cache, "shape": shape},
                                     None if cache else per_node))
    for n in (10_000, 100_000):
        for cache in (False, True):
            extra: dict[str, tuple[str, str]] = {}
            if n == 100_000:
                extra = ({"warm_wall": (": warm re-eval", "s")} if cache
                         else {"kb_per_element": (": peak RSS per element", "KB")})
            out.append(scale_job(f"Program {n}, cache {'on' if cache else 'off'}",
                                 {"kind": "program", "n": n, "cache": cache, "warm": cache and n == 100_000}, extra))
    for cache in (False, True):
        out.append(scale_job(f"Program with steps 100000, cache {'on' if cache else 'off'}",
                             {"kind": "program-steps", "n": 100_000, "cache": cache, "warm": cache},
                             {"warm_wall": (": warm re-eval", "s")} if cache else None))
    out.append(scale_job("floor: hand-written asyncio, concat 100000 (no outlines)",
                         {"kind": "shape-floor", "n": 100_000, "shape": "concat"}))
    for cache in (False, True):
        out.append(scale_job(f"Program concat 100000, cache {'on' if cache else 'off'} (issue 40)",
                             {"kind": "program-concat", "n": 100_000, "cache": cache}))
    for kind, label in (("loops", "refine loops"), ("routes", "routed chains")):
        for n in (1_000, 5_000):
            for stack, cache in ((True, False), (True, True), (False, False)):
                if not stack and n == 5_000 and not slow:
                    continue
                how = f"stacked, cache {'on' if cache else 'off'}" if stack else "each its own node, cache off"
                out.append(scale_job(f"{label} {n}, {how}", {"kind": kind, "n": n, "cache": cache, "stack": stack}))
    out.append(scale_job("10000 trivial fn nodes, build + eval", {"kind": "fn", "n": 10_000, "peer": False},
                         {"build": (": build", "s"), "eval": (": eval", "s")}))
    out.append(Job("bench_scheduler: rows 1-5, no peers", ["bench_scheduler.py", "--no-peers", "--json"],
                   bench_lines("scheduler: "), timeout=600))
    for variant in ("outlines.while_loop", "Python loop around a compiled Program",
                    "Python loop per trajectory (gather of acall)"):
        out.append(Job(f"bench_control: {variant}", ["bench_control.py", "--child", variant, "-n", "1000"],
                       last_json(f"control: {variant}", {"wall": ("", "s"), "cpu": (": cpu", "cpu s"),
                                                         "calls": (": calls", "calls")})))
    out.append(Job("bench_cache: parts 1, 2 (function), 4b", ["bench_cache.py", "--part", "1", "--part", "2",
                                                                "--part", "4b", "--latency", "--json"],
                   bench_lines("cache: ")))
    out.append(Job("bench_prefix: --quick --part a", ["bench_prefix.py", "--quick", "--part", "a", "--json"],
                   bench_lines("prefix quick: ")))
    out.append(Job("bench_jobs: --quick", ["bench_jobs.py", "--quick"],
                   last_json("jobs quick: ", {"wall_s": ("wall", "s"), "live_requests": ("live requests", "calls"),
                                              "jobs": ("jobs", "calls"), "paid_twice": ("paid twice", "calls"),
                                              "cost": ("cost", "$")})))
    out.append(Job("bench_vote: --runs 1", ["bench_vote.py", "--runs", "1", "--json"], bench_lines("vote: ")))
    return out


#: Scripts left out, and why.
NOT_COMPARED = (
    ("bench_transformers.py, bench_transformers_defaults.py, bench_labels.py, bench_prefix.py --part b/c",
     "a real model (tiny GPT-2 / SmolLM2) on the CPU: minutes a run, bound by torch, not by the planner; "
     "their figures are token counts and accuracies (run each once on the new tree and check they match)"),
    ("bench_structured.py, bench_constraint_engines.py", "mask engines on a tokenizer: no planner or scheduler in "
     "the timed part"),
    ("bench_dask.py", "starts a Dask cluster (seconds) and a tiny model: the cluster dominates"),
    ("bench_openai.py", "every size also runs the AsyncOpenAI and LangChain peers, whose time is not ours; "
     "bench_prefix part a drives the same OpenAI backend through the same fake server"),
    ("bench_jobs.py at 10k, --live, --kill", "minutes of the fake provider's clock; --quick (1k) is compared"),
    ("bench_scale.py refine loops / routed chains 5000, each its own node (unless --slow)",
     "what not stacking costs: 9-20 s a run; the 1000 rows of the same cases are compared"),
    ("bench_scale.py peers, bench_scheduler.py LangChain / Dask, bench_control.py LangGraph",
     "the peers' times do not depend on this package"),
)


def run_once(job: Job, tree: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="outlines-compare-") as cache_dir:
        env = {**os.environ, "OUTLINES_BENCH_TREE": str(tree), "PYTHONPATH": str(tree), "OUTLINES_CACHE_DIR": cache_dir}
        env.pop("OUTLINES_CACHE", None)
        load = os.getloadavg()[0]
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(HERE / job.argv[0]), *job.argv[1:]], capture_output=True,
                                  text=True, cwd=tree, env=env, timeout=job.timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {job.timeout:.0f} s", "load": load, "seconds": job.timeout}
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:200], "load": load, "seconds": seconds}
    try:
        rows = job.parse(done.stdout)
    except (ValueError, KeyError, IndexError) as exc:
        return {"error": f"unreadable output: {exc}", "load": load, "seconds": seconds}
    return {"rows": {name: list(value) for name, value in rows.items()}, "load": load, "seconds": seconds}


def rounds(selected: list[Job], trees: dict[str, Path], runs: int, first: int = 0) -> None:
    """Run every job ``runs`` times per tree, old and new alternating which goes first; print each run."""
    for run in range(first, first + runs):
        for index, job in enumerate(selected):
            order = ("old", "new") if (run + index) % 2 == 0 else ("new", "old")
            took = []
            for side in order:
                result = run_once(job, trees[side])
                job.results[side].append(result)
                state = f"ERROR {result['error'][:60]}" if "error" in result else f"{result['seconds']:.1f} s"
                took.append(f"{side} {state} (load {result['load']:.2f})")
            print(f"  run {run + 1}/{first + runs}  {job.name:<64} {'; '.join(took)}", flush=True)


def job_rows(job: Job) -> set[str]:
    """The rows ``job`` has given so far, on either tree."""
    return {name for side in job.results.values() for result in side for name in result.get("rows", {})}


def worse(old: float, new: float, unit: str) -> float:
    """How much worse new is than old, as a fraction (negative: better)."""
    if unit in HIGHER_IS_BETTER:
        return (old - new) / old if old else 0.0
    if old == 0:
        return 0.0 if new == 0 else float("inf")
    return (new - old) / old


Values = dict[str, dict[str, list[float]]]  # row -> tree -> one value per run


def table(all_jobs: list[Job], tolerance: float, quiet: bool = False) -> tuple[list[str], Values]:
    """Print the per-row table (``quiet``: do not); return the flagged rows and every row's values per tree."""
    if quiet:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return table(all_jobs, tolerance)
    values: Values = {}
    units: dict[str, str] = {}
    loads: dict[str, dict[str, list[float]]] = {}
    errors = []
    for job in all_jobs:
        for side in ("old", "new"):
            for result in job.results[side]:
                if "error" in result:
                    errors.append(f"{job.name} ({side}): {result['error']}")
                    continue
                for name, (value, unit) in result["rows"].items():
                    values.setdefault(name, {"old": [], "new": []})[side].append(value)
                    loads.setdefault(name, {"old": [], "new": []})[side].append(result["load"])
                    units[name] = unit
    flagged = []
    width = max((len(name) for name in values), default=20)
    print(f"\n{'row':<{width}}  {'unit':>5}  {'old best / median':>21}  {'new best / median':>21}  "
          f"{'new/old best':>12}  {'median':>7}  loads old | new  (best: the min; for % and x faster the max)")
    for name, sides in values.items():
        old, new, unit = sides["old"], sides["new"], units[name]
        if not old or not new:
            print(f"{name:<{width}}  {unit:>5}  {'(missing on one side)':>21}")
            continue
        o_min, o_med = (max if unit in HIGHER_IS_BETTER else min)(old), statistics.median(old)
        n_min, n_med = (max if unit in HIGHER_IS_BETTER else min)(new), statistics.median(new)
        ratio = n_min / o_min if o_min else (1.0 if n_min == 0 else float("inf"))
        ratio_med = n_med / o_med if o_med else (1.0 if n_med == 0 else float("inf"))
        flag = worse(o_min, n_min, unit) > tolerance
        if flag:
            flagged.append(name)
        load = " | ".join(" ".join(f"{x:.1f}" for x in loads[name][side]) for side in ("old", "new"))
        print(f"{name:<{width}}  {unit:>5}  {o_min:>10.4g} / {o_med:<8.4g}  {n_min:>10.4g} / {n_med:<8.4g}  "
              f"{ratio:>12.3f}  {ratio_med:>7.3f}  {load}{'  FLAG' if flag else ''}")
    for error in errors:
        print(f"ERROR {error}")
    return flagged, values


def figures(values: Values) -> None:
    """The issue-40 figures for each tree: min walls over the critical path or the floor."""
    floor_rows = values.get("scale: floor: hand-written asyncio, concat 100000 (no outlines)", {})
    floor = min(floor_rows.get("old", []) + floor_rows.get("new", []), default=float("nan"))
    print(f"\nissue 40 figures (min of the runs; critical path {CRITICAL} s; floor {floor:.3f} s, both trees' runs)")
    cases = (
        ("fn-default 20000 chains, cache off", CRITICAL, 1.4, "cp"),
        ("fn-default 20000 chains, cache on", CRITICAL, 1.7, "cp"),
        ("Program concat 100000, cache off (issue 40)", floor, 1.15, "floor"),
        ("Program concat 100000, cache on (issue 40)", floor, 1.35, "floor"),
    )
    for name, base, bound, what in cases:
        sides = values.get(f"scale: {name}")
        if not sides:
            continue
        parts = []
        for side in ("old", "new"):
            if sides[side]:
                low = min(sides[side])
                parts.append(f"{side} {low:.3f} s = {low / base:.2f}x {what}"
                             f" ({'PASS' if low <= bound * base else 'FAIL'})")
        print(f"  {name:<46} {'; '.join(parts)}  target <= {bound}x {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="the tree whose outlines package is 'old' (default: this tree)")
    parser.add_argument("--new", type=Path, default=HERE.parent, help="the tree whose package is 'new' (default: this)")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per job and tree")
    parser.add_argument("--only", default="", help="only the jobs whose name contains this text")
    parser.add_argument("--tolerance", type=float, default=0.05, help="FLAG when new is worse by more than this")
    parser.add_argument("--confirm", type=int, default=0, metavar="N",
                        help="then run each job with a FLAG N more times per tree (interleaved) before the table")
    parser.add_argument("--out", type=Path, help="also write every run's rows and loads to this JSON file")
    parser.add_argument("--slow", action="store_true", help="also the 5k refine loops / routed chains unstacked")
    parser.add_argument("--list", action="store_true", help="list the jobs and exit")
    args = parser.parse_args()
    trees = {"old": (args.old or HERE.parent).resolve(), "new": args.new.resolve()}
    selected = [job for job in jobs(args.slow) if args.only.lower() in job.name.lower()]
    if args.list:
        for job in selected:
            print(job.name)
        return
    for side, tree in trees.items():
        head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
        env = {**os.environ, "OUTLINES_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
        package = subprocess.run([sys.executable, "-c", "import _compat, outlines; print(outlines.__file__)"],
                                 capture_output=True, text=True, cwd=HERE, env=env)
        print(f"{side}: {tree} ({head.stdout.strip()[:60] or 'not a git tree'}); imports "
              f"{package.stdout.strip() or package.stderr.strip()[-200:]}")
    print(f"scripts: {HERE}; {len(selected)} jobs x {args.runs} runs x 2 trees, interleaved; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}", flush=True)
    start = time.perf_counter()
    rounds(selected, trees, args.runs)
    if args.confirm:
        flagged, _ = table(selected, args.tolerance, quiet=True)
        again = [job for job in selected if any(name in flagged for name in job_rows(job))]
        print(f"confirming {len(again)} jobs with a FLAG: {args.confirm} more runs per tree", flush=True)
        rounds(again, trees, args.confirm, first=args.runs)
    elapsed = time.perf_counter() - start
    flagged, values = table(selected, args.tolerance)
    figures(values)
    print("\nnot compared:")
    for what, why in NOT_COMPARED:
        print(f"  {what}: {why}")
    print(f"\n{len(values)} rows, {len(flagged)} FLAG (new worse than old by > {args.tolerance:.0%} at the min); "
          f"{elapsed / 60:.1f} min, load {os.getloadavg()[0]:.2f} at the end")
    for name in flagged:
        print(f"  FLAG {name}")
    if args.out:
        args.out.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()}, "elapsed_s": elapsed,
                                        "jobs": {job.name: job.results for job in selected}}, indent=1))


if __name__ == "__main__":
    main()
