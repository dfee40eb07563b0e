"""Best-of-n with a judge: sample n answers per task, let a judge pick each task's best.

``model(prompt, num_samples=n)`` appends a sample axis: answers have shape
(tasks, n). The judge prompt iterates ``candidates``, so each task's prompt
receives that task's own n answers (values pair on their LEADING axes), even
when there are as many tasks as samples. Offline by default with a fake
solver that is sometimes wrong and a fake judge that picks the right sum.

    python examples/best_of_n.py [-n 3]
"""
import argparse
import re

import outlines
from outlines import models

TASKS = ["2 + 3", "10 + 7", "4 + 4"]


@outlines.prompt
def solve(task):
    """Compute {{ task }}. Answer with a number."""


@outlines.prompt
def judge(task, candidates):
    """Which answer to {{ task }} is right?
    {% for c in candidates %}{{ loop.index }}. {{ c }}
    {% endfor %}Best:"""


@outlines.fn(signature="(),(n)->()")
def pick(choice, candidates):
    number = re.findall(r"\d+", choice)
    return candidates[int(number[0]) - 1] if number else candidates[0]


def sloppy_solver(prompts):
    """The offline fake solver (batched): off by one on every other prompt of a batch."""
    sums = [sum(int(n) for n in re.findall(r"\d+", p)) for p in prompts]
    return [str(s + (i % 2)) for i, s in enumerate(sums)]


def fake_judge(prompt):
    """The offline fake judge: the number of the first candidate equal to the true sum."""
    question, _, listing = prompt.partition("?")
    truth = sum(int(n) for n in re.findall(r"\d+", question.split("to")[-1]))
    answers = re.findall(r"^(\d+)\. (\S+)$", listing, flags=re.M)
    return next((i for i, a in answers if a == str(truth)), "1")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=3, help="samples per task")
    args = parser.parse_args()
    solver = models.from_function(sloppy_solver, batched=True, name="solver")
    referee = models.from_function(fake_judge, name="judge")

    @outlines.compile
    def best_of_n(task):
        candidates = solver(solve(task), num_samples=args.n)  # shape (tasks, n)
        return pick(referee(judge(task, candidates)), candidates)

    with outlines.trace() as trace:
        best = best_of_n(TASKS)
    for task, answer in zip(TASKS, best):
        print(f"{task} = {answer}")
    print()
    print(trace.summary())


if __name__ == "__main__":
    main()
