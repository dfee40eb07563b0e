"""The offline examples run as scripts and print what they promise."""
from __future__ import annotations

import os
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


def test_adaptive_self_consistency_spends_fewer_samples_than_a_fixed_budget(tmp_path):
    out = run_example("adaptive_self_consistency.py", cache_dir=str(tmp_path))
    assert "What is 3 * 4?         -> 12     (4 samples)" in out
    spent = int(out.split("samples: ")[1].split()[0])
    assert 40 <= spent < 160 and "vs 160 with a fixed 16 per question" in out
    rounds = [int(n) for n in out.split("rounds after the first: [")[1].split("]")[0].split(", ")]
    assert rounds == sorted(rounds, reverse=True) and len(rounds) <= 3


def test_refine_regenerates_only_the_rejected_drafts(tmp_path):
    out = run_example("refine.py", cache_dir=str(tmp_path))
    assert 'Alan Turing, 41      3 draft(s) -> {"name": "Alan Turing", "age": 41}' in out
    assert "REJECTED" not in out
    assert "drafts sent per round: [5, 3, 2]" in out


def test_best_of_n_judges_each_task_with_its_own_candidates(tmp_path):
    out = run_example("best_of_n.py", cache_dir=str(tmp_path))
    assert "2 + 3 = 5\n10 + 7 = 17\n4 + 4 = 8\n" in out  # 3 tasks, 3 samples: rows not mixed
    assert "judge" in out and "9/9.0/9" in out  # one solver call for every sample of every task


def test_extract_gives_50_valid_typed_records_in_batches(tmp_path):
    out = run_example("extract.py", "--model", "tiny", "--max-tokens", "40", cache_dir=str(tmp_path))
    assert "valid: 50/50" in out
    assert "backend calls: 2" in out  # 50 prompts at the transformers max_batch of 32
