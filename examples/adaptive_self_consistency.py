"""Adaptive self-consistency: sample more only where the vote is still close.

Draw 4 answers per question; while the leading answer is ahead of the
runner-up by fewer than 2 votes, draw 4 more, up to 16. The loop is one
batched model call per round over the questions still undecided, so easy
questions stop paying after the first round. Offline by default: a fake model
that answers each question correctly with its own probability.

    python examples/adaptive_self_consistency.py [--model openai:gpt-4o-mini --base-url URL]
"""
import argparse
import collections
import random
import re

import outlines
from outlines import models

QUESTIONS = [f"What is {a} * {b}?" for a, b in [(3, 4), (17, 3), (12, 12), (23, 19), (7, 8), (46, 37), (9, 9),
                                                 (58, 61), (6, 5), (84, 97)]]
ROUND, LIMIT = 4, 16


@outlines.prompt
def solve(question):
    """Q: {{ question }}
    A: Let's think step by step."""


@outlines.fn(signature="(n)->()")
def ballot(completions):
    """The answers of one round, as a comma-separated string."""
    return ",".join((re.findall(r"-?\d+", c) or ["?"])[-1] for c in completions)


def margin(votes):
    counts = collections.Counter(votes.split(",")).most_common(2) + [("", 0)]
    return counts[0][1] - counts[1][1]


undecided = outlines.fn(lambda votes: margin(votes) < 2 and votes.count(",") + 1 < LIMIT, name="undecided")
majority = outlines.fn(lambda votes: collections.Counter(votes.split(",")).most_common(1)[0][0], name="majority")
spent = outlines.fn(lambda votes: votes.count(",") + 1, name="spent")


def noisy_arithmetic(prompts, rng=random.Random(0)):
    """The offline fake: right with a probability that falls as the numbers grow, else off by a little."""
    answers = []
    for prompt in prompts:
        a, b = map(int, re.findall(r"\d+", prompt)[:2])
        right = rng.random() < (0.95 if a * b < 100 else 0.55)
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
        llm = models.from_function(noisy_arithmetic, batched=True, name="noisy_arithmetic")

    @outlines.chain
    def adaptive(question):
        more = lambda votes: votes + "," + ballot(llm(solve(question), num_samples=ROUND))  # noqa: E731
        votes = outlines.while_loop(undecided, more, init=ballot(llm(solve(question), num_samples=ROUND)),
                                    max_iter=LIMIT // ROUND - 1)
        return majority(votes), spent(votes)

    with outlines.trace() as trace:
        answers, samples = adaptive(QUESTIONS)
    for question, answer, count in zip(QUESTIONS, answers, samples):
        print(f"{question:22s} -> {answer:6s} ({count} samples)")
    print(f"rounds after the first: {[r.active for r in trace.iterations]} questions still undecided")
    print(f"samples: {sum(samples)} adaptive vs {LIMIT * len(QUESTIONS)} with a fixed {LIMIT} per question")


if __name__ == "__main__":
    main()
