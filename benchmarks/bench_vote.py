"""Adaptive voting (issues 28, 42): samples spent and accuracy per rule, on a calibrated fake and on SmolLM2.

Two figures: (a) the calibrated fake below, adaptive rules against fixed
majorities at equal accuracy; (b) a model whose samples scatter, SmolLM2 on
the main job's word problems, the main job's vote against a fixed majority
of 5.

Each of 1,000 questions is answered right with its own probability ``p``,
drawn from a spread; a wrong sample picks one of ten wrong answers with
Zipf weights (1/j^1.5), so wrong answers cluster on a few distractors as real
models' do, and a question with a low ``p`` can have a wrong majority. Two
spreads, as Beta distributions of ``p``:

- strong: Beta(0.8, 0.3), mean 0.73, most questions near 1 and a tail near 0
  (the U shape per-question accuracy takes on GSM8K-like sets for capable models);
- weak: Beta(0.6, 0.9), mean 0.40 (a small model such as SmolLM2-135M).

Every method runs through ``outlines.vote`` on a batched ``from_function``
model with the cache off. The fake answers the n-th draw of a question with
the n-th sample of that question's seeded stream, so every method of one run
sees the same samples: an adaptive rule's samples are a prefix of the fixed
k's, and the comparison is paired. Methods: one sample; majority of a fixed
16 and 40; Adaptive-Consistency's Beta rule at 0.95, ``vote``'s default, which
gives up on an element with under a 10% chance to be decided within the cap
(round 1 as in the paper, and round 4) capped at 40, and round 4 capped at 16;
the paper's rule, which never gives up (``give_up=0``), round 1 cap 40; ESC
(round = window = 5, cap 40). Target: >= 3x fewer samples than a fixed 40 at
<= 0.5 point accuracy loss (the paper's average: 3.3x at under 0.1 point).

(b) A model whose samples scatter: the main job's 20 word problems
(``examples/word_problems.json``) as SmolLM2-135M-Instruct answers them at
temperature 0.7 (40 tokens, as ``examples/word_problems.py``), a fixed
majority of 5 against the main job's vote (rounds of 4, cap 8) with the
default rule and with the paper's rule, which never gives up. By default on a
fake that answers each problem with one of SmolLM2's measured answers to it
(``benchmarks/smollm2_word_problem_answers.json``: 8 samples per problem,
unparsable ones included), ``--scatter-runs`` (50) runs of every problem;
``--scatter-smollm2`` runs SmolLM2 itself, one seed per run (3), the vote that
never gives up drawing first and the default one replaying a prefix of its
samples from the cache (``OUTLINES_CACHE_DIR``), a paired comparison;
``--record`` rewrites the fake's answers from its first run. Target: no more
samples than the fixed majority of 5 on average.

Run: ``.venv/bin/python benchmarks/bench_vote.py [--questions 1000] [--runs 5]
[--scatter-runs 50]`` (about 20 s a run on 2 cores), ``--scatter-smollm2
[--scatter-runs 3] [--record]`` (minutes a run: SmolLM2 generates).

``--smollm2 [--runs 3] [--answer-step]``: the same comparison on
SmolLM2-135M-Instruct over the main job's 20 word problems
(``examples/word_problems.json``, 40 tokens at temperature 0.7): a fixed
majority of 16 against the Beta rule and ESC (round 4, cap 16), one seed per
run. The fixed vote draws first; the adaptive rules draw the same samples
(same seed, same rounds), so they replay them from the cache
(``OUTLINES_CACHE_DIR``) and the comparison is paired; a second sitting
replays everything. ``--answer-step`` adds the constrained final answer:
after each reasoning, a second greedy call writes only a number
(``regex=-?[0-9]{1,6}``), and the vote counts those.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

import _compat  # noqa: E402
from _compat import ROOT, emit  # noqa: E402  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path

import outlines  # noqa: E402
from outlines import models  # noqa: E402
from outlines.voting import DEFAULT_RULE, stop_when_confident, stop_when_iteration_agrees  # noqa: E402

SPREADS = {"strong": (0.8, 0.3), "weak": (0.6, 0.9)}
WRONG = 10
ZIPF = [1 / j**1.5 for j in range(1, WRONG + 1)]
CAP = 40

#: name -> (stop rule, round, max_samples)
METHODS: dict[str, tuple[Any, int, int]] = {
    "one sample": (None, 1, 1),
    "fixed k = 16": (None, 16, 16),
    "fixed k = 40": (None, 40, 40),
    "Beta 0.95, round 1": (DEFAULT_RULE, 1, CAP),
    "Beta 0.95, round 4": (DEFAULT_RULE, 4, CAP),
    "Beta 0.95, round 4, cap 16": (DEFAULT_RULE, 4, 16),
    "never gives up, round 1": (stop_when_confident(0.95, give_up=0), 1, CAP),
    "ESC, round 5": (stop_when_iteration_agrees(), 5, CAP),
}


def questions(n: int, spread: str, seed: int) -> tuple[list[str], list[float]]:
    rng = random.Random(f"{spread}-{seed}")
    alpha, beta = SPREADS[spread]
    probabilities = [rng.betavariate(alpha, beta) for _ in range(n)]
    return [f"question {i} of run {seed}" for i in range(n)], probabilities


class Streams:
    """The fake model: the n-th draw of a question answers the n-th sample of its seeded stream."""

    def __init__(self, prompts: list[str], probabilities: list[float]) -> None:
        self.p = dict(zip(prompts, probabilities))
        self.drawn: dict[str, int] = {}
        self.calls = 0

    def reset(self) -> None:
        self.drawn.clear()
        self.calls = 0

    def sample(self, prompt: str, n: int) -> str:
        rng = random.Random(f"{prompt}#{n}")
        if rng.random() < self.p[prompt]:
            return "right"
        return f"wrong {rng.choices(range(WRONG), weights=ZIPF)[0]}"

    def __call__(self, prompts: list[str]) -> list[str]:
        self.calls += 1
        out = []
        for prompt in prompts:
            n = self.drawn.get(prompt, 0)
            self.drawn[prompt] = n + 1
            out.append(self.sample(prompt, n))
        return out


def run_method(streams: Streams, prompts: list[str], rule: Any, round_: int, cap: int) -> dict[str, float]:
    streams.reset()
    llm = models.from_function(streams, batched=True, name="calibrated", version="1")
    result = outlines.vote(llm, prompts, stop=rule, per_iteration=round_, max_samples=cap)
    start = time.perf_counter()
    answers, samples = outlines.eval(result.answer, result.samples, cache=False, progress=False)
    wall = time.perf_counter() - start
    return {
        "accuracy": 100 * sum(a == "right" for a in answers) / len(prompts),
        "samples": sum(samples) / len(prompts),
        "calls": streams.calls,
        "wall": wall,
    }


def smollm2(runs: int, answer_step: bool) -> None:
    """Fixed 16 vs the adaptive rules on SmolLM2, one seed per run, paired through the cache."""
    from outlines.testing import smollm2_gguf

    example = word_problems()
    truths = [str(p["answer"]) for p in example.PROBLEMS]
    prompts = outlines.constant(np.array([example.chatml(example.SOLVE, p["question"]) for p in example.PROBLEMS],
                                         dtype=object))
    llm = models.transformers(smollm2_gguf(), chat=False, max_tokens=40, temperature=0.7)
    parse = example.parse_answer.target

    def final(reasoning: Any) -> Any:  # the model's own answer after its reasoning, a number only
        return llm(prompts + reasoning + "\nThe answer is ", regex=r"-?[0-9]{1,6}", temperature=0, max_tokens=6)

    rules = {"fixed k = 16": None, "Beta 0.95, round 4": stop_when_confident(0.95), "ESC, round 4": stop_when_iteration_agrees()}
    steps = {"free text, last number": None, **({"constrained answer step": final} if answer_step else {})}
    print(f"{'run':>3s} {'answers':24s} {'rule':20s} {'right':>6s} {'samples':>8s} {'unparsed':>9s} {'calls':>6s} {'wall s':>7s}"
          f"  load")
    for seed in range(runs):
        for step_name, step in steps.items():
            for name, rule in rules.items():
                result = outlines.vote(llm, prompts, parse=parse, stop=rule, per_iteration=4, max_samples=16, seed=seed,
                                       answer=step)
                start = time.perf_counter()
                with outlines.trace() as trace:
                    answers, samples, votes = outlines.eval(*result, progress=False)
                wall = time.perf_counter() - start
                right = sum(a == t for a, t in zip(answers, truths))
                unparsed = sum(v.samples - sum(v.values()) for v in votes)
                print(f"{seed:>3d} {step_name:24s} {name:20s} {right:>3d}/{len(truths)} {sum(samples):>8d} "
                      f"{unparsed:>9d} {len(trace.batches):>6d} {wall:>7.1f}  {os.getloadavg()[0]:.1f}", flush=True)


def word_problems() -> Any:
    """The main job's module (examples/word_problems.py): its problems, prompt and parser."""
    return _compat.example("word_problems")


#: (b): name -> vote settings; the vote that never gives up draws first, the default one replays its prefix
SCATTER_METHODS: dict[str, dict[str, Any]] = {
    "fixed majority of 5": {"stop": None, "per_iteration": 5, "max_samples": 5},
    "vote, never gives up": {"stop": stop_when_confident(0.95, give_up=0), "per_iteration": 4, "max_samples": 8},
    "vote, default rule": {"per_iteration": 4, "max_samples": 8},
}
#: SmolLM2's answers to the main job's problems (``--scatter-smollm2 --record``): the scattering fake's streams
MEASURED = ROOT / "benchmarks" / "smollm2_word_problem_answers.json"


def scatter_row(label: str, name: str, answers: Any, samples: Any, votes: Any, truths: list[str], calls: int,
                wall: float) -> int:
    right = sum(a == t for a, t in zip(answers, truths))
    decided, gave_up = sum(v.decided for v in votes), sum(v.gave_up for v in votes)
    fixed = SCATTER_METHODS[name].get("stop", DEFAULT_RULE) is None  # every problem draws its 5: no cap to reach
    at_cap = 0 if fixed else len(votes) - decided - gave_up
    print(f"{label:>5s} {name:22s} {right:>4d}/{len(truths):<4d} {sum(samples):>8d} {sum(samples) / len(truths):>12.2f} "
          f"{decided:>8d} {gave_up:>8d} {at_cap:>7d} {calls:>6d} {wall:>7.1f}  {os.getloadavg()[0]:.1f}", flush=True)
    return int(sum(samples))


def scatter_header(title: str) -> None:
    print(f"\n(b) {title}")
    print(f"{'run':>5s} {'method':22s} {'right':>9s} {'samples':>8s} {'per problem':>12s} {'decided':>8s} "
          f"{'gave up':>8s} {'at cap':>7s} {'calls':>6s} {'wall s':>7s}  load")


def scatter_verdict(totals: dict[str, list[int]], problems: int) -> None:
    fixed, adaptive = statistics.fmean(totals["fixed majority of 5"]), statistics.fmean(totals["vote, default rule"])
    before = statistics.fmean(totals["vote, never gives up"])
    print(f"the default vote: {adaptive / problems:.2f} samples per problem ({before / problems:.2f} if it never gave "
          f"up), a fixed majority of 5: {fixed / problems:.2f}: {'PASS' if adaptive <= fixed else 'FAIL'} "
          f"(target: no more)")
    emit("(b) default vote: samples per problem", adaptive / problems, "calls")
    emit("(b) fixed majority of 5: samples per problem", fixed / problems, "calls")


class Measured:
    """The scattering fake: the n-th draw of a problem picks one of SmolLM2's measured answers to it (seeded)."""

    def __init__(self, answers: dict[str, list[Any]]) -> None:
        self.answers = answers  # prompt -> SmolLM2's parsed answers, None where a sample did not parse
        self.drawn: dict[str, int] = {}

    def __call__(self, prompts: list[str]) -> list[str]:
        out = []
        for prompt in prompts:
            n = self.drawn[prompt] = self.drawn.get(prompt, -1) + 1
            answer = random.Random(f"{prompt}#{n}").choice(self.answers[prompt])
            out.append("no answer" if answer is None else f"The answer is {answer}.")
        return out


def scattered_fake(runs: int) -> None:
    """(b) offline: the main job's vote against a fixed majority of 5 on SmolLM2's measured answers."""
    import json

    example = word_problems()
    measured = json.loads(MEASURED.read_text())
    truths = [str(p["answer"]) for p in example.PROBLEMS] * runs
    prompts = [f"problem {i}, run {seed}" for seed in range(runs) for i in range(len(example.PROBLEMS))]
    streams = Measured({p: measured["answers"][i % len(example.PROBLEMS)] for i, p in enumerate(prompts)})
    llm = models.from_function(streams, batched=True, name="smollm2 measured", version="1")
    scatter_header(f"a fake that answers each of the main job's {len(example.PROBLEMS)} problems with one of "
                   f"SmolLM2's {measured['samples']} measured answers to it ({measured['measured']}), {runs} runs "
                   "of every problem")
    totals: dict[str, list[int]] = {}
    for name, settings in SCATTER_METHODS.items():
        streams.drawn.clear()
        result = outlines.vote(llm, prompts, parse=example.parse_answer.target, **settings)
        start = time.perf_counter()
        with outlines.trace() as trace:
            answers, samples, votes = outlines.eval(*result, cache=False, progress=False)
        totals[name] = [scatter_row("all", name, answers, samples, votes, truths, len(trace.batches),
                                    time.perf_counter() - start)]
    scatter_verdict(totals, len(prompts))


def scattered_smollm2(runs: int, record: bool) -> None:
    """(b) on SmolLM2 itself, one seed per run; ``record`` writes the fake's answers from the first run."""
    import json

    from outlines.testing import smollm2_gguf

    example = word_problems()
    truths = [str(p["answer"]) for p in example.PROBLEMS]
    prompts = [example.chatml(example.SOLVE, p["question"]) for p in example.PROBLEMS]
    llm = models.transformers(smollm2_gguf(), chat=False, max_tokens=40, temperature=0.7)
    scatter_header(f"SmolLM2-135M-Instruct, the main job's {len(prompts)} word problems (40 tokens, temperature "
                   "0.7), one seed per run")
    totals: dict[str, list[int]] = {name: [] for name in SCATTER_METHODS}
    for seed in range(runs):
        for name, settings in SCATTER_METHODS.items():
            result = outlines.vote(llm, prompts, parse=example.parse_answer.target, seed=seed, **settings)
            start = time.perf_counter()
            with outlines.trace() as trace:
                answers, samples, votes = outlines.eval(*result, progress=False)
            wall = time.perf_counter() - start - sum(m.end - m.start for m in trace.model_loads)
            totals[name].append(scatter_row(str(seed), name, answers, samples, votes, truths, len(trace.batches), wall))
            if record and seed == 0 and name == "vote, never gives up":
                answers_of = [[a for a, n in v.items() for _ in range(n)] + [None] * (v.samples - sum(v.values()))
                              for v in votes]
                MEASURED.write_text(json.dumps({"measured": f"seed 0, {time.strftime('%Y-%m-%d')}", "samples": 8,
                                                "answers": answers_of}, indent=1) + "\n")
    scatter_verdict(totals, len(prompts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5, help="independent question sets and sample streams")
    parser.add_argument("--spread", choices=[*SPREADS, "both"], default="both")
    parser.add_argument("--smollm2", action="store_true", help="fixed 16 vs adaptive on SmolLM2 (default 3 runs)")
    parser.add_argument("--answer-step", action="store_true", help="with --smollm2: also a constrained answer step")
    parser.add_argument("--scatter-runs", type=int, default=50, help="(b): runs of the fake (on SmolLM2: seeds, 3)")
    parser.add_argument("--scatter-smollm2", action="store_true", help="(b) on SmolLM2 itself (minutes a run)")
    parser.add_argument("--record", action="store_true", help=f"with --scatter-smollm2: write {MEASURED.name}")
    parser.add_argument("--json", action="store_true", help="also print the fakes' figures as BENCH {json}")
    args = parser.parse_args()
    _compat.JSON = args.json
    if args.smollm2:
        return smollm2(args.runs if "--runs" in sys.argv else 3, args.answer_step)
    if args.scatter_smollm2:
        return scattered_smollm2(args.scatter_runs if "--scatter-runs" in sys.argv else 3, args.record)
    spreads: list[str] = list(SPREADS) if args.spread == "both" else [args.spread]
    for spread in spreads:
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in METHODS}
        for seed in range(args.runs):
            prompts, probabilities = questions(args.questions, spread, seed)
            streams = Streams(prompts, probabilities)
            for name, (rule, round_, cap) in METHODS.items():
                rows[name].append(run_method(streams, prompts, rule, round_, cap))
        report(spread, args.questions, args.runs, rows)
    scattered_fake(args.scatter_runs)


def report(spread: str, n: int, runs: int, rows: dict[str, list[dict[str, float]]]) -> None:
    alpha, beta = SPREADS[spread]
    mean: Callable[[str, str], float] = lambda name, key: statistics.fmean(r[key] for r in rows[name])  # noqa: E731
    base_accuracy, base_samples = mean("fixed k = 40", "accuracy"), mean("fixed k = 40", "samples")
    print(f"\n(a) {spread}: p ~ Beta({alpha}, {beta}), {n} questions, mean of {runs} runs "
          f"(accuracy spread across runs in brackets)")
    print(f"{'method':26s} {'accuracy %':>16s} {'vs k=40':>8s} {'samples/q':>10s} {'k=40 / it':>10s} "
          f"{'calls':>6s} {'wall s':>7s}")
    for name in rows:
        accuracies = [r["accuracy"] for r in rows[name]]
        accuracy, samples = mean(name, "accuracy"), mean(name, "samples")
        print(f"{name:26s} {accuracy:7.2f} [{min(accuracies):5.1f}-{max(accuracies):5.1f}] "
              f"{accuracy - base_accuracy:+8.2f} {samples:10.2f} {base_samples / samples:9.2f}x "
              f"{mean(name, 'calls'):6.1f} {mean(name, 'wall'):7.2f}")
    for name in ("Beta 0.95, round 1", "Beta 0.95, round 4") if spread == "strong" else ():  # the target's spread
        saving, loss = base_samples / mean(name, "samples"), base_accuracy - mean(name, "accuracy")
        verdict = "PASS" if saving >= 3 and loss <= 0.5 else "FAIL"
        print(f"{name}: {saving:.2f}x fewer samples than k = 40 at {-loss:+.2f} points: {verdict} "
              "(target: >= 3x at <= 0.5 point lost)")
        emit(f"(a) {spread}, {name}: samples per question", mean(name, "samples"), "calls")
        emit(f"(a) {spread}, {name}: accuracy", mean(name, "accuracy"), "%")
    emit(f"(a) {spread}: wall of every method", sum(mean(name, "wall") for name in rows))


if __name__ == "__main__":
    main()
