"""Adaptive voting with ``outlines.vote``: more samples only where the vote is still close.

Each iteration draws 4 answers for every question still undecided, in one
batched call; a stopping rule then decides who leaves. Compared on the same
questions: a fixed majority of 16, Adaptive-Consistency's Beta rule
(``stop_when_confident``, the default) and ESC's rule (``stop_when_iteration_agrees``).
Offline by default: a fake model that answers each question right with its
own probability (lower for larger numbers), else off by a little.

    python examples/adaptive_vote.py [--model openai:gpt-4o-mini --base-url URL]
"""
import argparse
import random
import re

import outlines
from outlines import models
from outlines.voting import stop_when_confident, stop_when_iteration_agrees

PAIRS = [(3, 4), (17, 3), (12, 12), (23, 19), (7, 8), (46, 37), (9, 9), (58, 61), (6, 5), (84, 97), (8, 6), (31, 27)]
QUESTIONS = [f"What is {a} * {b}?" for a, b in PAIRS]
TRUTH = [str(a * b) for a, b in PAIRS]
RULES = {"fixed 16": None, "Beta 0.95": stop_when_confident(0.95), "ESC": stop_when_iteration_agrees()}


def last_number(text):
    numbers = re.findall(r"-?\d+", text.replace(",", ""))
    return numbers[-1] if numbers else None  # None: an unparsable sample, not a vote


DRAWN = {}  # the fake's memory: how many draws of each prompt it answered in this run


def noisy_arithmetic(prompts):
    """The offline fake: right with a probability that falls as the numbers grow, else off by a little.

    The n-th draw of a prompt answers the same in every run, so every rule sees the same samples.
    """
    answers = []
    for prompt in prompts:
        n = DRAWN[prompt] = DRAWN.get(prompt, -1) + 1
        rng = random.Random(f"{prompt}#{n}")
        a, b = map(int, re.findall(r"\d+", prompt)[:2])
        right = rng.random() < (0.95 if a * b < 100 else 0.6)
        answers.append(f" {a} * {b} = {a * b if right else a * b + rng.choice([-10, -1, 1, 10])}.")
    return answers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="function", help="function | openai:NAME")
    parser.add_argument("--base-url", default=None)
    args = parser.parse_args()
    if args.model.startswith("openai:"):
        llm = models.openai(args.model[7:], base_url=args.base_url, max_tokens=160, temperature=0.7)
    else:
        llm = models.from_function(noisy_arithmetic, batched=True, name="noisy_arithmetic", version="1")

    print(f"{'rule':10s} {'right':>6s} {'samples':>8s} {'calls':>6s}  draws per iteration")
    for name, rule in RULES.items():
        result = outlines.vote(llm, QUESTIONS, parse=last_number, stop=rule, per_iteration=4, max_samples=16)
        DRAWN.clear()
        with outlines.trace() as trace:
            answers, samples = outlines.eval(result.answer, result.samples, cache=False)
        right = sum(a == t for a, t in zip(answers, TRUTH))
        iterations = [4 * record.active for record in trace.iterations]
        print(f"{name:10s} {right:>3d}/{len(QUESTIONS)} {sum(samples):>8d} {len(trace.batches):>6d}  {iterations}")

    program = outlines.compile(lambda question: outlines.vote(llm, question, parse=last_number))
    DRAWN.clear()
    for attempt in ("first run", "re-run"):
        with outlines.trace() as trace:
            answer, samples, _ = program(QUESTIONS)
        print(f"{attempt}: {len(trace.batches)} backend call(s), {trace.cache_hits} draws from the cache")
    for question, truth, got, spent in zip(QUESTIONS, TRUTH, answer, samples):
        print(f"{question:20s} -> {got:>5s} ({spent:2d} samples){'' if got == truth else '  wrong: ' + truth}")


if __name__ == "__main__":
    main()
