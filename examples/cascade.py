"""A two-stage cascade on the main job's word problems: cheap samples first, the calculator agent where they disagree.

Stage 1 asks SmolLM2-135M-Instruct for 3 samples of each problem (reason
briefly, end with the number, temperature 0.7, as ``examples/word_problems.py``);
a problem whose 3 answers all parse and agree keeps that answer (``outlines.cascade``'s
default acceptance). Stage 2 sends only the others to the calculator agent of
the main job (one ``while_loop``: a calculator call, its observation, the final
answer), which always answers. Both stages are the same model with two
methods, the cheap one first (issue 41 allows it where no second real model is
at hand). Prints each method's accuracy, model draws and backend calls, the
cascade's stages (reached, accepted, escalated), and a re-run from the cache.

    python examples/cascade.py [--problems 20]
    python examples/cascade.py --model function     # a deterministic fake: fast, checks the plumbing
"""
import argparse
import os
import re
import time

import numpy as np

import outlines
from outlines import models

import word_problems as job  # the main job: its problems, prompts, parser and agent


DRAWN = {}  # the fake's samples so far, per prompt


def fake(prompt):
    """The main job's fake, except that stage 1's samples of every other problem disagree (so some escalate)."""
    text = job.fake(prompt)
    if "calculator" in prompt:
        return text
    n = DRAWN[prompt] = DRAWN.get(prompt, -1) + 1  # the n-th sample of this prompt
    first = int(re.findall(r"\d+", prompt.rsplit("user\n", 1)[1])[0])
    return text + f" Or {n}." if first % 2 and n % 2 else text  # a second number: the samples disagree


def sampled(llm):
    """Stage 1: reason briefly and end with the number, sampled (the main job's prompt)."""
    prompt = outlines.fn(lambda q: job.chatml(job.SOLVE, q), name="prompt", pure=True)

    def stage(question, num_samples):
        return llm(prompt(question), num_samples=num_samples)

    stage.__name__ = "sampled reasoning"  # the stage's name in the trace
    return stage


def calculator_agent(llm):
    """Stage 2: the main job's calculator agent; its answer is the calculator's last result, as text."""
    prompt = outlines.fn(lambda q: job.chatml(job.TOOL, q, [job.EXAMPLE]), name="few-shot prompt", pure=True)
    as_text = outlines.fn(lambda answer: "no answer" if answer is None else str(answer), name="as text", pure=True)

    def stage(question, num_samples):  # one answer per problem (the agent is greedy), whatever num_samples
        answer, _ = job.agent(llm, prompt(question))
        return as_text(answer)

    stage.__name__ = "calculator agent"
    return stage


def evaluate(outputs, truths):
    """(values, right, draws, backend calls, wall without the model load, trace) of one evaluation."""
    start = time.perf_counter()
    with outlines.trace() as trace:
        values = outlines.eval(*outputs)
    values = values if len(outputs) > 1 else [values]
    loaded = sum(m.end - m.start for m in trace.model_loads)
    right = sum(str(a) == t for a, t in zip(values[0], truths))
    return values, right, sum(b.size for b in trace.batches), len(trace.batches), time.perf_counter() - start - loaded, trace


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2[:GGUF] | function")
    parser.add_argument("--problems", type=int, default=len(job.PROBLEMS), help="how many of the problems")
    parser.add_argument("--samples", type=int, default=3, help="stage 1's samples per problem")
    args = parser.parse_args()

    started = time.perf_counter()
    problems = job.PROBLEMS[: args.problems]
    questions = np.array([p["question"] for p in problems], dtype=object)
    truths = [str(p["answer"]) for p in problems]
    if args.model == "function":
        llm = models.from_function(fake, name="cascade_fake", version="1")
    else:
        llm = job.load_model(args.model, 40)
    stages = [sampled(llm), calculator_agent(llm)]
    result = outlines.cascade(questions, stages, samples=(args.samples, 1), parse=job.parse_answer.target)

    print(f"{'method':30s} {'right':>7s} {'draws':>6s} {'calls':>6s} {'wall s':>7s}")
    (answers, stage), right, draws, calls, wall, trace = evaluate([result.answer, result.stage], truths)
    print(f"{'cascade':30s} {right:>3d}/{len(problems):<3d} {draws:>6d} {calls:>6d} {wall:>7.1f}")
    alone = {f"majority of {args.samples} alone": job.majority(job.parse_answer(stages[0](questions, args.samples))),
             "calculator agent alone": stages[1](questions, 1)}
    for name, answer in alone.items():  # each method draws its own samples (the agent's greedy ones replay)
        _, right_, draws_, calls_, wall_, _ = evaluate([answer], truths)
        print(f"{name:30s} {right_:>3d}/{len(problems):<3d} {draws_:>6d} {calls_:>6d} {wall_:>7.1f}")
    loop = [record.active for record in trace.iterations]  # the agent: one batched call per iteration
    batches = sorted(trace.batches, key=lambda b: b.start)
    loads = sum(m.end - m.start for m in trace.model_loads)  # in stage 1's first call
    parts = [batches[: len(batches) - len(loop)], batches[len(batches) - len(loop):]]  # the agent runs last
    print(f"\n{'stage':5s} {'method':18s} {'reached':>8s} {'accepted':>9s} {'escalated':>10s} {'right':>6s} "
          f"{'draws':>6s} {'calls':>6s} {'model s':>8s}")
    tally = {counts["stage"]: counts for counts in trace.cascades()}  # a stage no problem reached has no entry
    for index, (method, part) in enumerate(zip(stages, parts)):
        counts = tally.get(index, {"reached": 0, "accepted": 0, "escalated": 0})
        mine = [i for i, s in enumerate(stage) if s == index]
        seconds = sum(b.end - b.start for b in part) - (loads if index == 0 else 0)
        print(f"{index + 1:5d} {method.__name__:18s} {counts['reached']:>8d} {counts['accepted']:>9d} "
              f"{counts['escalated']:>10d} {sum(str(answers[i]) == truths[i] for i in mine):>6d} "
              f"{sum(b.size for b in part):>6d} {len(part):>6d} {seconds:>8.1f}")
    print(f"(the agent's iterations, problems still working: {loop})")
    _, _, _, again, _, _ = evaluate([result.answer], truths)
    print(f"re-run: {again} backend call(s)")
    print(f"model load {loads:.1f} s (not in the walls); whole run {time.perf_counter() - started:.1f} s, "
          f"{time.process_time():.0f} CPU s, load average {os.getloadavg()[0]:.1f}")
    print(trace.summary())


if __name__ == "__main__":
    main()
