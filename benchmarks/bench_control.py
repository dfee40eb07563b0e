"""Batched loops (issue 12): 1,000 agent trajectories of up to 8 steps.

Each trajectory is a ReAct-shaped loop: the model proposes a step, a Python
tool appends its observation, until the model says "Final Answer". Trajectory
``i`` takes a seeded random 1-8 steps (the longest takes 8). The model is an
async fake that sleeps 100 ms per call, whatever the call's size, so no
implementation can beat 8 x 100 ms = 0.8 s. Variants, same fake, cache off:

1. ``outlines.while_loop``: one batched schedule per iteration (target: wall
   within 1.2x of 0.8 s, 8 backend calls).
2. A Python ``for`` loop around a compiled ``Program`` called on the
   still-active trajectories each turn (batched by hand).
3. A Python loop per trajectory (``asyncio.gather`` of ``Program.acall``):
   what one writes without batched loops; one backend call per step.
4. LangGraph (if installed: extra ``bench``): a ``StateGraph`` with a
   conditional edge back to the agent node, ``abatch`` over the 1,000 inputs;
   one model call per step, all concurrent.

Each variant runs 3 times, each in a fresh process; min and median walls are
printed with backend calls, the ratios to the ideal and to variant 1, and the
least CPU seconds of the process during the run (on a shared machine, the
wall above the ideal is at most this CPU time).

Run: ``.venv/bin/python benchmarks/bench_control.py [--quick]``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from _compat import ROOT  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

LATENCY = 0.1
MAX_STEPS = 8
RUNS = 3


def trajectories(n: int) -> list[str]:
    rng = random.Random(12)
    steps = [rng.randint(1, MAX_STEPS) for _ in range(n)]
    steps[0] = MAX_STEPS
    return [f"task {i} needs {k}" for i, k in enumerate(steps)]


def next_step(prompt: str) -> str:
    needed = int(prompt.split(" needs ", 1)[1].split("\n", 1)[0])
    done = prompt.count("Observation:")
    return "Final Answer: done" if done + 1 >= needed else f"Action: lookup[{done}]"


def act(step: str) -> str:
    return step + "\n" if step.startswith("Final Answer") else step + "\nObservation: ok\n"


class Fake:
    """The async model: 100 ms per call; counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def batch(self, prompts: list[str]) -> list[str]:
        self.calls += 1
        await asyncio.sleep(LATENCY)
        return [next_step(p) for p in prompts]

    async def one(self, prompt: str) -> str:
        self.calls += 1
        await asyncio.sleep(LATENCY)
        return next_step(prompt)


def run_outlines_loop(tasks: list[str]) -> tuple[float, int]:
    import outlines
    from outlines import models

    fake = Fake()
    llm = models.from_function(fake.batch, batched=True, name="fake")
    tool = outlines.fn(act, name="act", blocking=False)
    running = outlines.fn(lambda t: "Final Answer" not in t, name="running", blocking=False)
    task = outlines.string("task")
    final = outlines.while_loop(running, lambda t: t + tool(llm("Question: " + task + "\n" + t)), init="",
                                max_iter=MAX_STEPS)
    start = time.perf_counter()
    out = final.eval({"task": tasks}, cache=False)
    wall = time.perf_counter() - start
    assert all(t.endswith("Final Answer: done\n") for t in out)
    return wall, fake.calls


def _step_program(fake: Fake) -> Any:
    import outlines
    from outlines import models

    llm = models.from_function(fake.batch, batched=True, name="fake")
    tool = outlines.fn(act, name="act", blocking=False)
    return outlines.compile(lambda task, transcript: transcript + tool(llm("Question: " + task + "\n" + transcript)),
                            cache=False)


def run_python_loop(tasks: list[str]) -> tuple[float, int]:
    import numpy as np

    fake = Fake()
    program = _step_program(fake)
    start = time.perf_counter()
    questions = np.array(tasks, dtype=object)
    transcripts = np.array([""] * len(tasks), dtype=object)
    active = np.arange(len(tasks))
    for _ in range(MAX_STEPS):
        if not active.size:
            break
        transcripts[active] = program(questions[active], transcripts[active])
        active = active[[("Final Answer" not in t) for t in transcripts[active]]]
    wall = time.perf_counter() - start
    assert all(t.endswith("Final Answer: done\n") for t in transcripts)
    return wall, fake.calls


def run_per_trajectory(tasks: list[str]) -> tuple[float, int]:
    fake = Fake()
    program = _step_program(fake)

    async def one(task: str) -> str:
        transcript = ""
        for _ in range(MAX_STEPS):
            transcript = await program.acall(task, transcript)
            if "Final Answer" in transcript:
                break
        return transcript

    async def main() -> list[str]:
        return await asyncio.gather(*(one(t) for t in tasks))

    start = time.perf_counter()
    out = asyncio.run(main())
    wall = time.perf_counter() - start
    assert all(t.endswith("Final Answer: done\n") for t in out)
    return wall, fake.calls


def run_langgraph(tasks: list[str]) -> tuple[float, int]:
    from typing import TypedDict

    from langgraph.graph import END, StateGraph

    class State(TypedDict):
        task: str
        transcript: str

    fake = Fake()

    async def agent(state: State) -> dict[str, str]:
        step = await fake.one("Question: " + state["task"] + "\n" + state["transcript"])
        return {"transcript": state["transcript"] + act(step)}

    graph = StateGraph(State)
    graph.add_node("agent", agent)
    graph.set_entry_point("agent")
    graph.add_conditional_edges("agent", lambda s: END if "Final Answer" in s["transcript"] else "agent")
    app = graph.compile()
    inputs = [{"task": t, "transcript": ""} for t in tasks]
    start = time.perf_counter()
    out = asyncio.run(app.abatch(inputs, config={"max_concurrency": len(tasks), "recursion_limit": 4 * MAX_STEPS}))
    wall = time.perf_counter() - start
    assert all(o["transcript"].endswith("Final Answer: done\n") for o in out)
    return wall, fake.calls


VARIANTS = {
    "outlines.while_loop": run_outlines_loop,
    "Python loop around a compiled Program": run_python_loop,
    "Python loop per trajectory (gather of acall)": run_per_trajectory,
    "LangGraph StateGraph abatch": run_langgraph,
}


def child(name: str, n: int) -> None:
    tasks = trajectories(n)
    import outlines  # noqa: F401  (imports are not part of the run)

    # Nor is collecting what the imports left: the first full collection after them falls in the run or
    # not by a few hundred allocations (two trees importing alike differed by 12-25 ms of CPU on this row).
    gc.collect()
    cpu = time.process_time()
    wall, calls = VARIANTS[name](tasks)
    print(json.dumps({"wall": wall, "calls": calls, "cpu": time.process_time() - cpu}))


def measure(name: str, n: int) -> dict[str, Any] | None:
    walls, cpus, calls = [], [], 0
    for _ in range(RUNS):
        done = subprocess.run([sys.executable, __file__, "--child", name, "-n", str(n)], capture_output=True, text=True,
                              cwd=ROOT, timeout=600)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"  {name}: skipped ({last})")
            return None
        result = json.loads(done.stdout.strip().splitlines()[-1])
        walls.append(result["wall"])
        cpus.append(result["cpu"])
        calls = result["calls"]
    return {"min": min(walls), "median": statistics.median(walls), "calls": calls, "cpu": min(cpus)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="trajectories")
    parser.add_argument("--quick", action="store_true", help="100 trajectories")
    parser.add_argument("--only", default=None, help="run the variants whose name contains this text")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = 100 if args.quick else args.n
    if args.child:
        child(args.child, n)
        return
    ideal = MAX_STEPS * LATENCY
    print(f"{n} trajectories of 1-{MAX_STEPS} steps, {LATENCY * 1000:.0f} ms per call: ideal {ideal:.2f} s; "
          f"walls over {RUNS} fresh processes")
    print(f"  {'variant':<46}{'min s':>8}{'median s':>10}{'calls':>8}{'min/ideal':>11}{'vs loop':>9}{'CPU s':>8}")
    ours = None
    for name in VARIANTS:
        if args.only and args.only not in name:
            continue
        result = measure(name, n)
        if result is None:
            continue
        ours = ours or result["min"]
        print(f"  {name:<46}{result['min']:>8.2f}{result['median']:>10.2f}{result['calls']:>8}"
              f"{result['min'] / ideal:>10.2f}x{result['min'] / ours:>8.2f}x{result['cpu']:>8.2f}", flush=True)
        if name == "outlines.while_loop":
            verdict = "PASS" if result["min"] <= 1.2 * ideal else "FAIL"
            print(f"  {'':<46}target: within 1.2x of {ideal:.2f} s: {verdict}")


if __name__ == "__main__":
    main()
