"""Batch mode at scale (issue 25): N prompts x L levels as provider batch jobs through the fake provider.

The fake (``tests/fixtures/fake_batches.py``, on 127.0.0.1) runs each job for
``--latency`` seconds of a clock ``--speed`` times faster than real time
(validating 20%, in progress 60%, finalizing 20%); the client polls on the
real clock (the fake runs in a process of its own), its pauses (``--poll-first``, ``--poll-factor``, ``--poll-cap``,
in the fake's seconds) scaled by the same factor. Printed:

- requests: live requests (must be 0) and job requests (lines) sent;
- jobs created (must be L: one per round, no limit reached);
- wall, in real seconds and in the fake's seconds, against L x latency;
- cost at the batch price (``Trace.cost()``) against the same tokens at the
  live price (must be 0.50x), and with ``--live`` the live run's own cost;
- with ``--kill`` the kill -9 matrix: the evaluating process (a child) is
  killed after the upload, after create before the ledger write, while
  polling and while downloading, then run again: duplicate paid requests and
  lost results (must both be 0); and the two-process race
  (``tests/fixtures/jobs_race.py``, a 2 s lease): two processes evaluating
  the same graph on one cache, started together, and the first held at each
  step of its job and ``kill -9``-ed there once the second waits for it:
  lines paid twice and lost (must both be 0).

Run ``python benchmarks/bench_jobs.py`` for the issue's sizes (10,000 prompts
x 3 levels, 5 s jobs), ``--quick`` for 1,000 prompts, or set ``--prompts``,
``--levels``, ``--latency`` and ``--speed``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

from _compat import ROOT, job_price  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
from outlines import models  # noqa: E402
from outlines.backends.jobs import Backoff  # noqa: E402
from outlines.backends.usage import Price  # noqa: E402
from outlines.cache import Cache  # noqa: E402
from tests.fixtures.jobs_race import STEPS, Racer  # noqa: E402

PRICE = job_price(0.15, 0.60, 0.5)  # the discount's field under this tree's name


def graph(llm: object, levels: int) -> tuple[object, object]:
    q = outlines.string("q")
    out = q
    for level in range(levels):
        out = llm(f"step {level}: " + out)  # type: ignore[operator]
    return q, out


def scaled_backoff(args: argparse.Namespace) -> Backoff:
    """The polling pauses, in the fake's seconds, on the real clock."""
    return Backoff(first=args.poll_first / args.speed, factor=args.poll_factor, cap=args.poll_cap / args.speed)


@contextlib.contextmanager
def serve(args: argparse.Namespace) -> Iterator[tuple[str, Callable[[], dict[str, Any]]]]:
    """The fake provider in a process of its own (its work does not share this process's GIL): URL, stats."""
    command = [sys.executable, "-m", "tests.fixtures.fake_batches", "--speed", str(args.speed),
               "--validate-s", str(0.2 * args.latency), "--run-s", str(0.6 * args.latency),
               "--finalize-s", str(0.2 * args.latency)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        server.stdout.readline()

        def stats() -> dict[str, Any]:
            root = url.rsplit("/v1", 1)[0]
            with urllib.request.urlopen(f"{root}/stats/batches") as answer:
                return json.loads(answer.read())  # type: ignore[no-any-return]

        yield url, stats
    finally:
        server.terminate()
        server.wait(30)


def run_batch(args: argparse.Namespace) -> dict[str, Any]:
    prompts = [f"prompt {i}" for i in range(args.prompts)]
    with serve(args) as (url, stats):
        llm = models.openai("gpt-4o-mini", base_url=url, api_key="sk-bench", max_tokens=16, price=PRICE)
        q, out = graph(llm, args.levels)
        cache = Cache(tempfile.mkdtemp(prefix="bench-jobs-"))
        start = time.perf_counter()
        with outlines.trace() as trace:
            outlines.eval(out, givens={q: prompts}, cache=cache, progress=False,
                          jobs=outlines.Jobs(run="bench", backoff=scaled_backoff(args)))
        wall = time.perf_counter() - start
        seen = stats()
    prompt_tokens, completion_tokens = trace.tokens
    result: dict[str, Any] = {
        "live_requests": seen["live"],
        "job_requests": seen["submitted"],
        "jobs": seen["counts"].get("batches.create", 0),
        "paid": seen["paid"],
        "paid_twice": len(seen["paid_twice"]),
        "wall_s": wall,
        "wall_fake_s": wall * args.speed,
        "ideal_fake_s": args.levels * args.latency,
        "cost": trace.cost(),
        "cost_at_live_price": Price.of(PRICE).cost(prompt_tokens, completion_tokens),
    }
    if args.live:
        with serve(args) as (url, stats):
            llm = models.openai("gpt-4o-mini", base_url=url, api_key="sk-bench", max_tokens=16, price=PRICE)
            q, out = graph(llm, args.levels)
            with outlines.trace() as live:
                outlines.eval(out, givens={q: prompts}, cache=False, progress=False)
            result["live_run_cost"] = live.cost()
            result["live_run_requests"] = stats()["live"]
    return result


CHILD = textwrap.dedent('''
    import os, signal, sys
    sys.path.insert(0, {root!r})
    import outlines
    from outlines import models
    from outlines.backends.jobs import Backoff
    from outlines.backends.jobs.openai import OpenAIJobs
    from outlines.cache import Cache
    from outlines.cache.ledger import Ledger

    url, folder, kill_at, prompts, levels = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if kill_at == "upload":
        upload = OpenAIJobs._upload
        async def killed_upload(*a, **k):
            await upload(*a, **k); die()
        OpenAIJobs._upload = killed_upload
    elif kill_at == "create":
        Ledger.record_created = lambda *a, **k: die()
    elif kill_at == "poll":
        advance = Ledger.advance
        def killed_advance(*a, **k):
            advance(*a, **k); die()
        Ledger.advance = killed_advance
    elif kill_at == "download":
        results = OpenAIJobs.results
        async def killed_results(*a, **k):
            await results(*a, **k); die()
        OpenAIJobs.results = killed_results
    llm = models.openai("gpt-4o-mini", base_url=url, api_key="sk-bench", max_tokens=16)
    q = outlines.string("q")
    out = q
    for level in range(levels):
        out = llm(f"step {{level}}: " + out)
    values = outlines.eval(out, givens={{q: [f"prompt {{i}}" for i in range(prompts)]}}, cache=Cache(folder),
                           progress=False, jobs=outlines.Jobs(backoff=Backoff(first=0.02, cap=0.1), lease=2.0,
                                                               heartbeat=0.2))
    print(sum(1 for v in values if v))
''')


def kill_matrix(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    script = Path(tempfile.mkdtemp(prefix="bench-jobs-kill-")) / "child.py"
    script.write_text(CHILD.format(root=str(ROOT)))
    out = {}
    for step in ("upload", "create", "poll", "download"):
        with serve(args) as (url, stats):
            folder = tempfile.mkdtemp(prefix="bench-jobs-cache-")
            command = [sys.executable, str(script), url, folder]
            sizes = [str(args.kill_prompts), str(args.levels)]
            killed = subprocess.run([*command, step, *sizes], capture_output=True, text=True, timeout=600)
            done = subprocess.run([*command, "never", *sizes], capture_output=True, text=True, timeout=600)
            seen = stats()
            expected = args.kill_prompts * args.levels
            out[step] = {
                "killed": int(killed.returncode == -signal.SIGKILL),
                "paid_twice": len(seen["paid_twice"]),
                "lost": expected - seen["paid"] + len(seen["paid_twice"]) if done.returncode == 0 else expected,
                "values": int(done.stdout.strip() or 0),
                "jobs": seen["counts"].get("batches.create", 0),
            }
    return out


def race_matrix(args: argparse.Namespace) -> dict[str, dict[str, int]]:
    """Two processes on one cache: started together, or the first killed at each step while the second waits."""
    out = {}
    sizes = ["--prompts", str(args.kill_prompts), "--levels", str(args.levels)]
    for case in ("together", *STEPS):
        with serve(args) as (url, stats):
            folder = tempfile.mkdtemp(prefix="bench-jobs-race-")
            first = Racer(url, folder, None if case == "together" else case, *sizes)
            second = Racer(url, folder, None, *sizes)
            try:
                first.go()
                if case != "together":
                    assert first.reads(f"at {case}"), first.lines
                    if case == "collected":  # closed: the second finds the draws in the cache
                        first.signal(signal.SIGKILL)
                    second.go()
                    if case != "collected":
                        assert second.reads("waiting"), second.lines
                        first.signal(signal.SIGKILL)
                else:
                    second.go()
                values = [second.values()] + ([first.values()] if case == "together" else [])
            finally:
                first.close()
                second.close()
            seen = stats()
            expected = args.kill_prompts * args.levels
            out[case] = {
                "paid_twice": len(seen["paid_twice"]),
                "lost": expected - seen["paid"] + len(seen["paid_twice"]),
                "values": min(sum(1 for v in row if v) for row in values),
                "jobs": seen["counts"].get("batches.create", 0),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=10_000)
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--latency", type=float, default=5.0, help="seconds of the fake's clock per job")
    parser.add_argument("--speed", type=float, default=10.0, help="how much faster the fake's clock runs")
    parser.add_argument("--quick", action="store_true", help="1,000 prompts")
    parser.add_argument("--live", action="store_true", help="also run live (N x L requests) and compare costs")
    parser.add_argument("--kill", action="store_true", help="the kill -9 matrix")
    parser.add_argument("--kill-prompts", type=int, default=200)
    parser.add_argument("--poll-first", type=float, default=0.5, help="first polling pause, fake seconds "
                        "(the library's default is 5 s, then x1.5 up to 120 s: right for real jobs of minutes to "
                        "hours, coarse for 5 s ones)")
    parser.add_argument("--poll-factor", type=float, default=1.2)
    parser.add_argument("--poll-cap", type=float, default=5.0)
    args = parser.parse_args()
    if args.quick:
        args.prompts = 1_000
    os.environ.setdefault("OUTLINES_CACHE_DIR", tempfile.mkdtemp(prefix="bench-jobs-default-"))
    result = run_batch(args)
    n, levels = args.prompts, args.levels
    print(f"bench_jobs: {n:,} prompts x {levels} levels, {args.latency:g} s jobs, clock x{args.speed:g}, polls "
          f"every {args.poll_first:g} s x{args.poll_factor:g} up to {args.poll_cap:g} s")
    print(f"  live requests: {result['live_requests']} (must be 0); job requests: {result['job_requests']:,} "
          f"(= {n * levels:,} draws); paid: {result['paid']:,}, twice: {result['paid_twice']}")
    print(f"  jobs created: {result['jobs']} (one per round: {levels})")
    ratio = float(result["wall_fake_s"]) / float(result["ideal_fake_s"])  # type: ignore[arg-type]
    print(f"  wall: {result['wall_s']:.2f} s real = {result['wall_fake_s']:.1f} s of the fake's clock; "
          f"{levels} x latency = {result['ideal_fake_s']:.1f} s: {ratio:.2f}x")
    overhead = float(result["wall_s"]) - float(result["ideal_fake_s"]) / args.speed
    print(f"  beyond the jobs' latency: {overhead:.2f} s real ({overhead / levels:.2f} s a round: lines, uploads, "
          f"polls, results, cache and ledger), which the compressed clock multiplies by {args.speed:g}")
    cost, live = float(result["cost"]), float(result["cost_at_live_price"])  # type: ignore[arg-type]
    print(f"  cost: {cost:.6f} at the batch price vs {live:.6f} for the same tokens live: {cost / live:.2f}x")
    if "live_run_cost" in result:
        print(f"  live run: {result['live_run_requests']:,} requests, cost {result['live_run_cost']:.6f}: "
              f"batch / live = {cost / float(result['live_run_cost']):.2f}x")  # type: ignore[arg-type]
    if args.kill:
        matrix = kill_matrix(args)
        print(f"  kill -9 matrix ({args.kill_prompts} prompts x {levels} levels):")
        for step, row in matrix.items():
            print(f"    {step:<9} killed: {'yes' if row['killed'] else 'NO'}; duplicate paid requests: "
                  f"{row['paid_twice']}; lost results: {row['lost']}; jobs: {row['jobs']}")
        race = race_matrix(args)
        print(f"  two-process race on one cache ({args.kill_prompts} prompts x {levels} levels; 'together': both "
              "start at once, else the first is killed -9 at that step while the second waits):")
        for case, row in race.items():
            print(f"    {case:<9} lines paid twice: {row['paid_twice']}, lost: {row['lost']}; values: "
                  f"{row['values']}/{args.kill_prompts}; jobs: {row['jobs']}")
        result["race"] = race
    print(json.dumps({"result": result}, default=str))


if __name__ == "__main__":
    main()
