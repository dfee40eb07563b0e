"""Model cascades (issue 41): the cheap model first, the strong one only where it is needed, against the baselines.

A calibrated fake of two models, a small one and a strong one, priced 1:20,
answers 1,000 questions per seed (5 seeds, each seed in a fresh process).
Printed side by side, accuracy as mean +- sd over the seeds and cost
relative to the strong model alone:

- strong only (one sample a question); small only (one sample);
- majority of k on the small model: k = 3 (the cascade's first stage alone)
  and k at the cascade's cost (the most samples its money buys);
- random routing at equal cost: a random share of the questions goes to the
  strong model, the rest to one small sample, the share chosen per seed so
  the money equals the cascade's (RouteLLM's random baseline);
- the cascade, small then strong (1 sample), three acceptance rules:
  ``outlines.cascade``'s default (3 small samples, accepted when all parse
  and agree); an agreement threshold over 5 small samples chosen by
  ``outlines.calibrate_cascade`` on a held-out split of 1,000 labelled
  questions per seed; and the small stage decided by ``vote``'s
  ``stop_when_confident`` (2 samples a round, up to 6), its threshold chosen
  on the same split by running the cascade at each of a grid of thresholds
  (``calibrate_cascade`` replays stages that draw once, not a vote). Both
  calibrations take the cheapest threshold whose held-out accuracy is at
  least the strong model's held-out accuracy minus half a point (else the
  most accurate);
- the default cascade under ``Budget(cost=)`` of half the strong model's
  cost: the escalations the budget cannot pay keep the small stage's answer
  (the trace's "kept: budget"), and nothing raises.

The fake (parameters fixed before any cascade ran; not tuned to pass):

- each question has a per-sample probability of a right answer per model:
  small ~ Beta(1.4, 0.6) (mean 0.70), strong ~ Beta(2.7, 0.3) (mean 0.90);
  the two are tied by a Gaussian rank correlation of 0.5 (a question hard for
  one model tends to be hard for the other);
- a wrong sample picks one of the question's 10 wrong answers with Zipf
  weights (1/j^1.5), the same distractors for both models, so wrong answers
  cluster and a hard question can have a wrong majority; because every
  question has its own probability, the small model's samples agree more
  often when its answer is right (printed: agreement of its 3 samples when
  their majority is right against when it is wrong);
- 5% of the small model's samples say nothing parsable ("I am not sure.");
- every draw is a seeded function of (model, question, draw number); the
  library numbers each call site's draws apart, so two methods see
  independent samples of the same per-question probabilities (hence the
  spread over seeds, not a paired difference);
- price per 1M tokens: small (0.15, 0.60), strong (3.00, 12.00), 1:20; each
  request bills a 120-token prompt once and 150 completion tokens per sample
  (reported as usage, so budgets, ``explain`` and ``Trace.cost()`` count it
  through the backends' own ``price``).

Every method runs through the library (``vote``, ``cascade``, model calls on
arrays), cache off; cost is ``Trace.cost()`` of the run.

Run: ``.venv/bin/python benchmarks/bench_cascade.py [--questions 1000] [--seeds 5]``
(each seed a fresh process; walls min / median over the seeds; the load
average printed).
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

import numpy as np

import _compat  # noqa: F401  # the measured tree (OUTLINES_BENCH_TREE), first on sys.path
from _compat import ROOT, emit

import outlines  # noqa: E402
from outlines.backends.base import Backend, BatchReport  # noqa: E402
from outlines.backends.usage import Price  # noqa: E402
from outlines.draws import Draw, DrawColumns  # noqa: E402
from outlines.models import Model  # noqa: E402
from outlines.voting import TopTwoRule, at_least, stop_when_confident  # noqa: E402

#: name -> (Beta(a, b) of the per-question probability of a right sample, price per 1M (in, out), unparsable share)
MODELS: dict[str, tuple[tuple[float, float], tuple[float, float], float]] = {
    "small": ((1.4, 0.6), (0.15, 0.60), 0.05),
    "strong": ((2.7, 0.3), (3.00, 12.00), 0.0),
}
RANK_CORRELATION = 0.5
WRONG = 10
ZIPF = [1 / j**1.5 for j in range(1, WRONG + 1)]
PROMPT_TOKENS, COMPLETION_TOKENS = 120, 150
SAMPLES = 3  # the small stage's samples
BUDGET = 0.5  # the budget row's cost bound, a share of the strong model's cost
CALIBRATION_MARGIN = 0.5  # points below the strong model's held-out accuracy the calibrated rule may aim
THRESHOLDS = (0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99)
SMALL_PRICE, STRONG_PRICE = MODELS["small"][1], MODELS["strong"][1]
CONFIDENT_ROUND, CONFIDENT_CAP = 2, 6  # stop_when_confident's small stage: 2 samples a round, up to 6
AGREEMENT_SAMPLES = 5  # the agreement threshold's small stage (3 samples leave only 1/3, 2/3, 1 to choose from)


class Calibrated(Backend):
    """The fake: the n-th draw of a question is right with the question's probability for this model."""

    kind = "calibrated"

    def __init__(self, name: str, questions: dict[str, tuple[str, float]], tag: str) -> None:
        _, price, unparsable = MODELS[name]
        self.name, self.questions, self.unparsable = name, questions, unparsable
        self.price = Price.of(price)  # the backend's own price: budgets, explain and Trace.cost() read it
        self.tag = tag  # which question set: equal backends batch together and share cache entries

    @property
    def identity(self) -> tuple[Any, ...]:
        return ("calibrated", self.name, self.tag)

    @property
    def model_name(self) -> str:
        return self.name

    def count_tokens(self, prompt: str) -> int:
        return PROMPT_TOKENS

    def sample(self, prompt: str, number: int) -> str:
        truth, p = self.questions[prompt]
        rng = random.Random(f"{self.name}|{prompt}|{number}")
        if rng.random() < self.unparsable:
            return "I am not sure."
        if rng.random() < p:
            return f"The answer is {truth}."
        return f"The answer is {int(truth) + 1 + rng.choices(range(WRONG), weights=ZIPF)[0]}."

    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        columns = DrawColumns.of(draws)
        requests = {(params, prompt) for params, prompt in zip(columns.params, columns.prompts)}
        report.usage(PROMPT_TOKENS * len(requests), COMPLETION_TOKENS * len(columns))
        return [self.sample(prompt, number) for prompt, number in zip(columns.prompts, columns.numbers)]


def parse(text: str) -> str | None:
    return text.rsplit(" ", 1)[-1].rstrip(".") if text.startswith("The answer is ") else None


def questions(n: int, seed: int, split: str) -> tuple[list[str], list[str], dict[str, np.ndarray]]:
    """``n`` questions: prompts, right answers, and each model's per-question probability of a right sample."""
    rng = np.random.default_rng([seed, 0 if split == "test" else 1])
    latent = rng.multivariate_normal([0, 0], [[1, RANK_CORRELATION], [RANK_CORRELATION, 1]], size=n)
    probabilities = {}
    for column, (name, (beta, _, _)) in enumerate(MODELS.items()):
        spread = np.sort(rng.beta(*beta, size=n))  # the model's Beta marginal, given out by the latent's rank
        probabilities[name] = spread[np.argsort(np.argsort(latent[:, column]))]
    prompts = [f"{split} question {i} of seed {seed}: how many?" for i in range(n)]
    truths = [str(int(x)) for x in rng.integers(10, 1000, size=n)]
    return prompts, truths, probabilities


def pair(n: int, seed: int, split: str) -> tuple[list[str], list[str], Model, Model]:
    prompts, truths, probabilities = questions(n, seed, split)
    small, strong = (Model(Calibrated(name, {p: (t, float(q)) for p, t, q in zip(prompts, truths, probabilities[name])},
                                      f"{split}-{seed}"), temperature=0.7, max_tokens=COMPLETION_TOKENS)
                     for name in MODELS)
    return prompts, truths, small, strong


def run(outputs: Sequence[Any], **options: Any) -> tuple[list[Any], float, float, Any]:
    """Evaluate, cache off: (values, money from the trace, wall, trace)."""
    start = time.perf_counter()
    with outlines.trace() as trace:
        values = outlines.eval(*outputs, cache=False, progress=False, **options)
    wall = time.perf_counter() - start
    return list(values) if len(outputs) > 1 else [values], float(trace.cost() or 0.0), wall, trace


def accuracy(answers: Sequence[Any], truths: Sequence[str]) -> float:
    return 100 * sum(a == t for a, t in zip(answers, truths)) / len(truths)


def majority(model: Model, prompts: list[str], k: int) -> Any:
    return outlines.vote(model, np.array(prompts, dtype=object), parse=parse, stop=None, per_iteration=k,
                         max_samples=k).answer


def cascade(small: Model, strong: Model, prompts: list[str], rule: Any = None, samples: int = SAMPLES,
            budget: float | None = None) -> tuple[list[Any], float, float, list[dict[str, Any]]]:
    """``outlines.cascade``, small then strong: answers, money, wall, each stage's counts (``Trace.cascades``).

    ``samples`` small draws judged by ``rule`` (default: all parsed and
    equal); a ``TopTwoRule`` (``stop_when_confident``) makes the small stage a
    ``vote`` instead (rounds of 2, up to 6), accepted where the rule held.
    """
    array = np.array(prompts, dtype=object)
    if isinstance(rule, TopTwoRule):
        result = outlines.cascade(array, [small, strong], samples=(CONFIDENT_ROUND, 1), parse=parse, accept=rule,
                                  max_samples=(CONFIDENT_CAP, None))
    else:
        result = outlines.cascade(array, [small, strong], samples=(samples, 1), parse=parse, accept=rule)
    options = {} if budget is None else {"budget": outlines.Budget(cost=budget)}
    values, money, wall, trace = run([result.answer], **options)
    return list(values[0]), money, wall, trace.cascades()


def row(name: str, answers: Sequence[Any], truths: Sequence[str], cost: float, wall: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "accuracy": accuracy(answers, truths), "cost": cost, "wall": wall, **extra}


def random_routing(small: Model, strong: Model, prompts: list[str], truths: list[str], cost: float, seed: int,
                   label: str) -> dict[str, Any]:
    """A random share to the strong model, one small sample for the rest, the share set so the money is ``cost``."""
    one_small, one_strong = (PROMPT_TOKENS * p[0] + COMPLETION_TOKENS * p[1] for p in (SMALL_PRICE, STRONG_PRICE))
    n = len(prompts)
    share = min(1.0, max(0.0, (cost * 1e6 / n - one_small) / (one_strong - one_small)))
    chosen = set(random.Random(f"routing {seed}").sample(range(n), round(share * n)))
    to_strong = [p for i, p in enumerate(prompts) if i in chosen]
    to_small = [p for i, p in enumerate(prompts) if i not in chosen]
    outputs = [m(np.array(ps, dtype=object)) for m, ps in ((strong, to_strong), (small, to_small)) if ps]
    values, money, wall, _ = run(outputs)
    texts = iter([t for v in values for t in v])
    answers_of = {p: parse(next(texts)) for p in to_strong + to_small}
    return row(f"random routing at {label}'s cost", [answers_of[p] for p in prompts], truths, money, wall,
               share=100 * share)


def held_out(n: int, seed: int) -> tuple[list[str], list[str], Model, Model, float, float]:
    """The held-out split: prompts, labels, the models, the strong model's accuracy (a share) and money on it."""
    prompts, truths, small, strong = pair(n, seed, "held-out")
    values, strong_cost, _, _ = run([strong(np.array(prompts, dtype=object))])
    return prompts, truths, small, strong, accuracy([parse(t) for t in values[0]], truths) / 100, strong_cost


def calibrate_agreement(n: int, seed: int) -> dict[str, Any]:
    """``outlines.calibrate_cascade`` on the held-out split: the agreement threshold of 5 small samples."""
    prompts, truths, small, strong, strong_accuracy, strong_cost = held_out(n, seed)
    array = np.array(prompts, dtype=object)
    target = strong_accuracy - CALIBRATION_MARGIN / 100
    try:
        chosen = outlines.calibrate_cascade(array, truths, [small, strong], samples=(AGREEMENT_SAMPLES, 1), parse=parse,
                                            target_accuracy=target, cache=False)
    except ValueError:  # no threshold reaches the target: the most accurate
        chosen = outlines.calibrate_cascade(array, truths, [small, strong], samples=(AGREEMENT_SAMPLES, 1), parse=parse,
                                            target_cost=math.inf, cache=False)
    curve = [(p.threshold, 100 * p.accuracy, p.cost * n / strong_cost) for p in chosen.curve]
    return {"threshold": chosen.threshold, "target": 100 * target, "curve": curve}


def calibrate_confident(n: int, seed: int) -> dict[str, Any]:
    """``stop_when_confident``'s threshold (a voting stage, which ``calibrate_cascade`` does not replay): the
    cascade run on the held-out split at each threshold, the cheapest reaching the target, else the most accurate."""
    prompts, truths, small, strong, strong_accuracy, strong_cost = held_out(n, seed)
    target = 100 * strong_accuracy - CALIBRATION_MARGIN
    curve = []
    for threshold in THRESHOLDS:
        answers, money, _, _ = cascade(small, strong, prompts, stop_when_confident(threshold))
        curve.append((threshold, accuracy(answers, truths), money / strong_cost))
    meeting = [point for point in curve if point[1] >= target]
    chosen = min(meeting, key=lambda p: p[2]) if meeting else max(curve, key=lambda p: p[1])
    return {"threshold": chosen[0], "target": target, "curve": curve}


#: the cascades measured: label -> (how its rule is chosen on the held-out split, or None, and the small samples)
CASCADES = {
    "all agree": (None, SAMPLES),
    "agreement, calibrated": (calibrate_agreement, AGREEMENT_SAMPLES),
    "confident, calibrated": (calibrate_confident, CONFIDENT_ROUND),
}


def child(n: int, seed: int) -> list[dict[str, Any]]:
    """Every method on one seed's questions, in this (fresh) process."""
    prompts, truths, small, strong = pair(n, seed, "test")
    array = np.array(prompts, dtype=object)
    rows = []
    values, strong_cost, wall, _ = run([strong(array)])
    rows.append(row("strong only", [parse(t) for t in values[0]], truths, strong_cost, wall))
    values, cost, wall, _ = run([small(array)])
    rows.append(row("small only", [parse(t) for t in values[0]], truths, cost, wall))
    values, cost, wall, _ = run([majority(small, prompts, SAMPLES)])
    rows.append(row(f"small, majority of {SAMPLES}", values[0], truths, cost, wall))
    # the small stage's agreement: all 3 samples equal, when their majority is right / wrong
    votes = outlines.eval(outlines.vote(small, array, parse=parse, stop=None, per_iteration=SAMPLES,
                                        max_samples=SAMPLES).votes, cache=False, progress=False)
    agree: dict[bool, list[bool]] = {True: [], False: []}
    for v, truth in zip(votes, truths):
        if v:
            agree[v.leader == truth].append(v.most_common(1)[0][1] == SAMPLES)
    agreement = {k: 100 * statistics.fmean(v) if v else float("nan") for k, v in agree.items()}
    for label, (calibrate, samples) in CASCADES.items():
        calibration = calibrate(n, seed) if calibrate is not None else {}
        rule = None
        if calibrate is calibrate_agreement:
            rule = at_least(calibration["threshold"])
        elif calibrate is calibrate_confident:
            rule = stop_when_confident(calibration["threshold"])
        answers, cost, wall, counts = cascade(small, strong, prompts, rule, samples)
        rows.append(row(f"cascade, {label}", answers, truths, cost, wall, escalated=100 * counts[0]["escalated"] / n,
                        **calibration))
        rows.append(random_routing(small, strong, prompts, truths, cost, seed, label))
        k = max(1, round((cost * 1e6 / n - PROMPT_TOKENS * SMALL_PRICE[0]) / (COMPLETION_TOKENS * SMALL_PRICE[1])))
        values, money, wall, _ = run([majority(small, prompts, k)])
        rows.append(row(f"small, majority of k at {label}'s cost", values[0], truths, money, wall, k=k))
    # under a budget of half the strong model's cost: the escalations it cannot pay keep the small stage's answer
    budget = strong_cost * BUDGET
    answers, cost, wall, counts = cascade(small, strong, prompts, budget=budget)
    rows.append(row(f"cascade, all agree, budget {BUDGET:.0%} of strong", answers, truths, cost, wall,
                    escalated=100 * counts[0]["escalated"] / n, counts=counts))
    rows[0]["agreement"] = agreement
    return rows


# -- the parent: fresh processes, the table, the verdicts ------------------------------------------
def spawn(n: int, seed: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="outlines-bench-") as cache_dir:
        env = {**os.environ, "OUTLINES_CACHE_DIR": cache_dir, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, __file__, "--child", json.dumps([n, seed])], capture_output=True,
                             text=True, cwd=ROOT, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"seed {seed} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):6.2f} +- {sd:4.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=5, help="question sets, each in a fresh process")
    parser.add_argument("--json", action="store_true", help="also print the figures as BENCH {json}")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    _compat.JSON = args.json
    if args.child:
        print(json.dumps(child(*json.loads(args.child))))
        return
    n = args.questions
    print(f"cascade benchmark: {n} questions x {args.seeds} seeds, each seed a fresh process; "
          f"load {os.getloadavg()[0]:.1f}")
    started, loads = time.perf_counter(), []
    per_seed = []
    for seed in range(args.seeds):
        per_seed.append(spawn(n, seed))
        loads.append(os.getloadavg()[0])
    by_name: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for rows in per_seed:
        for r in rows:
            by_name[r["name"]].append(r)
    strong_cost = statistics.fmean(r["cost"] for r in by_name["strong only"])
    strong_accuracy = statistics.fmean(r["accuracy"] for r in by_name["strong only"])
    print(f"\n{'method':66s} {'accuracy %':>15s} {'vs strong':>9s} {'cost $':>8s} {'x strong':>8s} "
          f"{'to strong %':>11s} {'wall s min/med':>15s}")
    for name, rows in by_name.items():
        accuracies = [r["accuracy"] for r in rows]
        cost = statistics.fmean(r["cost"] for r in rows)
        walls = [r["wall"] for r in rows]
        routed = [float(r.get("escalated", r.get("share", "nan"))) for r in rows]
        routed_text = f"{statistics.fmean(routed):11.1f}" if not any(map(math.isnan, routed)) else f"{'':11s}"
        label = name + (f" (k = {'/'.join(str(r['k']) for r in rows)})" if "k" in rows[0] else "")
        print(f"{label:66s} {spread(accuracies)} {statistics.fmean(accuracies) - strong_accuracy:+9.2f} "
              f"{cost:8.4f} {cost / strong_cost:7.3f}x {routed_text} {min(walls):6.3f}/{statistics.median(walls):.3f}")
    agreement = [r["agreement"] for r in by_name["strong only"]]
    print(f"\nthe small model's 3 samples all agree: {statistics.fmean(a['true'] for a in agreement):.1f}% of the "
          f"questions whose majority is right, {statistics.fmean(a['false'] for a in agreement):.1f}% of those whose "
          "majority is wrong")
    for label in CASCADES:
        calibrated = by_name[f"cascade, {label}"]
        if "curve" not in calibrated[0]:
            continue
        print(f"\n{label}: thresholds chosen on the held-out split, per seed: "
              + ", ".join(f"{r['threshold']:.3g}" for r in calibrated)
              + f" (target: the strong model's held-out accuracy - {CALIBRATION_MARGIN} point)")
        print("  held-out curve, mean over the seeds that have the point: threshold: accuracy %, x strong's cost")
        points: dict[float, list[tuple[float, float]]] = collections.defaultdict(list)
        for r in calibrated:
            for threshold, right, cost_ in r["curve"]:
                points[round(threshold, 3)].append((right, cost_))
        for threshold, measured in sorted(points.items()):
            print(f"    {threshold:<6}: {statistics.fmean(m[0] for m in measured):6.2f}%, "
                  f"{statistics.fmean(m[1] for m in measured):.3f}x ({len(measured)} seed(s))")
    print()
    for label in CASCADES:
        rows = by_name[f"cascade, {label}"]
        accuracy_ = statistics.fmean(r["accuracy"] for r in rows)
        cost = statistics.fmean(r["cost"] for r in rows) / strong_cost
        close, cheap = accuracy_ >= strong_accuracy - 1 - 1e-9, cost <= 0.60 + 1e-9
        print(f"cascade, {label}: {accuracy_ - strong_accuracy:+.2f} points against the strong model at "
              f"{cost:.1%} of its cost: {'PASS' if close and cheap else 'FAIL'} (target: within 1 point at <= 60%)")
        for baseline in (f"random routing at {label}'s cost", f"small, majority of k at {label}'s cost"):
            other = statistics.fmean(r["accuracy"] for r in by_name[baseline])
            other_cost = statistics.fmean(r["cost"] for r in by_name[baseline]) / strong_cost
            wins = sum(c["accuracy"] > b["accuracy"] for c, b in zip(rows, by_name[baseline]))
            print(f"  vs {baseline} ({other_cost:.1%} of strong): {accuracy_ - other:+.2f} points, ahead on "
                  f"{wins} of {len(rows)} seeds: {'PASS' if accuracy_ > other else 'FAIL'}")
        emit(f"cascade, {label}: accuracy", accuracy_, "%")
        emit(f"cascade, {label}: cost / strong", cost, "calls")
    budgeted = by_name[f"cascade, all agree, budget {BUDGET:.0%} of strong"]
    kept = statistics.fmean(r["counts"][1]["kept: budget"] for r in budgeted)
    paid = statistics.fmean(r["counts"][1]["reached"] - r["counts"][1]["kept: budget"] for r in budgeted)
    spent = statistics.fmean(r["cost"] for r in budgeted) / strong_cost
    print(f"under Budget(cost={BUDGET:.0%} of the strong model's): no error; {spent:.1%} spent, {paid:.0f} escalations "
          f"paid, {kept:.0f} of {n} kept the small stage's answer (kept: budget), accuracy "
          f"{statistics.fmean(r['accuracy'] for r in budgeted):.2f}%")
    print(f"\nwhole run {time.perf_counter() - started:.1f} s, load average {min(loads):.1f}-{max(loads):.1f} "
          "over the seeds")


if __name__ == "__main__":
    main()
