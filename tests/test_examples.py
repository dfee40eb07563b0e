"""The offline examples run as scripts and print what they promise."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.fixtures.subprocesses import ROOT, python_env


def run_example(name: str, *args: str, cache_dir: str) -> str:
    env = python_env(OUTLINES_CACHE_DIR=cache_dir)
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", name), *args],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_map_reduce_batches_every_paragraph_and_replays_from_the_cache(tmp_path):
    first = run_example("map_reduce.py", cache_dir=str(tmp_path))
    # 2 + 1 + 3 paragraphs in one map level (max_batch 4: 2 calls), then 3 combines
    assert "requests: 3" in first and "6  4 2" in first
    assert "-> Batching merges sibling model calls." in first
    assert "-> Branches run concurrently." in first
    assert "cache: 0 hit(s), 9 miss(es)" in first
    second = run_example("map_reduce.py", cache_dir=str(tmp_path))
    assert "cache: 9 hit(s), 0 miss(es)" in second
    assert "-> A content-hash cache replays draws." in second


def test_agent_sends_one_call_per_iteration_and_finished_trajectories_drop_out(tmp_path):
    first = run_example("agent.py", cache_dir=str(tmp_path))
    assert "between Hamlet and 2024?             -> 424" in first
    assert "What is 12 * 8?" in first and "-> 96" in first
    assert "iteration 1: 20 trajectories, 1 backend call(s)" in first
    assert "iteration 2: 19 trajectories, 1 backend call(s)" in first  # "Say hello." finished at once
    assert "iteration 3: 4 trajectories, 1 backend call(s)" in first  # lookup + calculator questions
    assert "backend calls: 3; cache: 0 hit(s), 43 miss(es)" in first
    assert "backend calls: 0; cache: 43 hit(s), 0 miss(es)" in run_example("agent.py", cache_dir=str(tmp_path))


def test_adaptive_vote_spends_fewer_samples_than_a_fixed_budget_and_replays_from_the_cache(tmp_path):
    out = run_example("adaptive_vote.py", cache_dir=str(tmp_path))
    table = {m["rule"]: m for m in re.finditer(
        r"^(?P<rule>fixed 16|Beta 0.95|ESC) +(?P<right>\d+)/12 +(?P<samples>\d+) +(?P<calls>\d+) +\[(?P<rounds>.*)\]$",
        out, re.MULTILINE)}
    assert table["fixed 16"]["rounds"] == "48, 48, 48, 48" and table["fixed 16"]["samples"] == "192"
    for rule in ("Beta 0.95", "ESC"):
        rounds = [int(n) for n in table[rule]["rounds"].split(", ")]
        assert rounds[0] == 48 and rounds == sorted(rounds, reverse=True)  # only the undecided draw again
        assert sum(rounds) == int(table[rule]["samples"]) < 192 and table[rule]["calls"] == "4"
        assert table[rule]["right"] == "12"
    assert "first run: 4 backend call(s), 0 draws from the cache" in out
    assert re.search(r"re-run: 0 backend call\(s\), \d+ draws from the cache", out)
    assert "What is 3 * 4?       ->    12 ( 4 samples)" in out


def test_the_main_job_compares_four_methods_on_the_word_problems_and_replays_from_the_cache(tmp_path):
    cache = str(tmp_path / "cache")
    first = run_example("word_problems.py", "--model", "function", "--out", str(tmp_path), cache_dir=cache)
    rows = {m["method"]: m for m in re.finditer(
        r"^(?P<method>greedy|majority of 5|adaptive vote|calculator agent) +(?P<right>\d+)/20 +\d+% +"
        r"(?P<samples>\d+) +(?P<calls>\d+) +[\d.]+(?:  per iteration: \[(?P<iterations>.*)\])?$", first, re.MULTILINE)}
    assert list(rows) == ["greedy", "majority of 5", "adaptive vote", "calculator agent"]
    assert all(row["right"] == "14" for row in rows.values())  # the fake's own accuracy
    assert [rows[m]["samples"] for m in rows] == ["20", "100", "80", "40"]  # the fake always agrees: 4 samples
    assert [rows[m]["calls"] for m in rows] == ["1", "1", "1", "2"]
    assert rows["calculator agent"]["iterations"] == "20, 20"  # a calculator call, then the final answer
    assert "cache: 0 hit(s), 240 miss(es)" in first
    assert (tmp_path / "word_problems.html").is_file() and "graph picture: " in first
    again = run_example("word_problems.py", "--model", "function", "--out", str(tmp_path), cache_dir=cache)
    assert "cache: 240 hit(s), 0 miss(es)" in again
    assert re.search(r"^calculator agent +14/20 +70% +40 +0 ", again, re.MULTILINE)
    stepped = run_example("word_problems.py", "--model", "function", "--answer-step", "--out", str(tmp_path),
                          cache_dir=cache)
    # the reasoning replays; the fake reasons alike in every sample, so one call answers them all
    assert re.search(r"^greedy +14/20 +70% +20 +1 ", stepped, re.MULTILINE)
    assert re.search(r"^adaptive vote +14/20 +70% +80 +0 ", stepped, re.MULTILINE)


def test_refine_regenerates_only_the_rejected_drafts(tmp_path):
    out = run_example("refine.py", cache_dir=str(tmp_path))
    assert 'Alan Turing, 41      3 draft(s) -> {"name": "Alan Turing", "age": 41}' in out
    assert "REJECTED" not in out
    assert "drafts sent per iteration: [5, 3, 2]" in out


def test_best_of_n_judges_each_task_with_its_own_candidates(tmp_path):
    out = run_example("best_of_n.py", cache_dir=str(tmp_path))
    assert "2 + 3 = 5\n10 + 7 = 17\n4 + 4 = 8\n" in out  # 3 tasks, 3 samples: rows not mixed
    assert "judge" in out and "9/9.0/9" in out  # one solver call for every sample of every task


def test_extract_gives_50_valid_typed_records_in_batches(tmp_path):
    out = run_example("extract.py", "--model", "tiny", "--max-tokens", "40", cache_dir=str(tmp_path))
    assert "valid: 50/50" in out
    assert "backend calls: 1" in out  # 50 prompts within the transformers max_batch of a CPU (128)
