"""benchmarks/bench_cascade.py: the calibrated fakes are what its docstring says, and the comparison runs.

The figures themselves are the benchmark's (benchmarks/README.md); these
check the fakes' stated properties (accuracy, agreement, price ratio), that
the money comes from the backends' own prices through the trace, and that a
small run prints every row and verdict.
"""
from __future__ import annotations

import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

import outlines

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_cascade as bench  # noqa: E402


def test_the_fakes_are_calibrated_as_stated() -> None:
    prompts, truths, small, strong = bench.pair(2000, 7, "test")
    array = np.array(prompts, dtype=object)
    (small_texts, strong_texts), _, _, _ = bench.run([small(array), strong(array)])
    small_right = bench.accuracy([bench.parse(t) for t in small_texts], truths)
    strong_right = bench.accuracy([bench.parse(t) for t in strong_texts], truths)
    assert 60 <= small_right <= 75 and 87 <= strong_right <= 93
    assert 0.03 <= sum(bench.parse(t) is None for t in small_texts) / len(prompts) <= 0.07
    assert all(bench.parse(t) is not None for t in strong_texts)
    # the small model's samples agree more often when their majority is right
    votes = outlines.eval(outlines.vote(small, array, parse=bench.parse, stop=None, per_iteration=3,
                                        max_samples=3).votes, cache=False, progress=False)
    agree: dict[bool, list[bool]] = {True: [], False: []}
    for v, truth in zip(votes, truths):
        if v:
            agree[v.leader == truth].append(v.most_common(1)[0][1] == 3)
    assert statistics.fmean(agree[True]) > 5 * statistics.fmean(agree[False])


def test_money_comes_from_the_backends_own_prices_through_the_trace() -> None:
    prompts, _, small, strong = bench.pair(100, 0, "test")
    array = np.array(prompts, dtype=object)
    _, strong_cost, _, _ = bench.run([strong(array)])
    _, small_cost, _, _ = bench.run([small(array)])
    _, three, _, _ = bench.run([small(array, num_samples=3)])
    one = (120 * 3.00 + 150 * 12.00) / 1e6  # a 120-token prompt and 150 completion tokens, per 1M prices
    assert strong_cost == round(100 * one, 6) and round(small_cost * 20, 6) == strong_cost
    assert three == round(100 * (120 * 0.15 + 3 * 150 * 0.60) / 1e6, 6)  # the prompt billed once per request
    budget = outlines.Budget(cost=strong_cost / 2)
    refused = outlines.eval(strong(array), cache=False, progress=False, budget=budget, errors="return")
    assert sum(isinstance(x, outlines.Failure) for x in refused) == 50


def test_a_small_run_prints_every_row_and_verdict(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_cascade.py"), "--questions", "200", "--seeds", "2"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    ratios = dict(re.findall(r"^(strong only|small only|small, majority of 3) .*? ([\d.]+)x ", out, re.MULTILINE))
    assert ratios == {"strong only": "1.000", "small only": "0.050", "small, majority of 3": "0.133"}
    for rule in ("all agree", "agreement, calibrated", "confident, calibrated"):
        # accuracy +- sd, against strong, money, x strong, share sent to the strong model
        assert re.search(rf"^cascade, {rule} +[\d.]+ \+- [\d.]+ +[-+][\d.]+ +[\d.]+ +0\.\d+x +\d+\.\d ", out, re.MULTILINE)
        assert re.search(rf"^cascade, {rule}: [-+][\d.]+ points against the strong model at [\d.]+% of its cost: "
                         r"(PASS|FAIL)", out, re.MULTILINE)
        for baseline in ("random routing", "small, majority of k"):
            assert re.search(rf"^  vs {baseline} at {rule}'s cost \([\d.]+% of strong\): ", out, re.MULTILINE)
    assert out.count("held-out curve, mean over the seeds") == 2
    spent = re.search(r"^under Budget\(cost=50% of the strong model's\): no error; ([\d.]+)% spent, \d+ escalations "
                      r"paid, (\d+) of 200 kept the small stage's answer", out, re.MULTILINE)
    assert spent and float(spent[1]) <= 50 and int(spent[2]) > 0, out
