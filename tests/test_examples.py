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


def test_map_reduce_batches_the_map_and_replays_from_the_cache(tmp_path):
    first = run_example("map_reduce.py", cache_dir=str(tmp_path))
    assert "result: Batching merges sibling model calls." in first
    assert "requests: 3" in first  # explain: 4 map prompts at max_batch 2, then 1 reduce
    assert "cache: 0 hit(s), 5 miss(es)" in first
    second = run_example("map_reduce.py", cache_dir=str(tmp_path))
    assert "cache: 5 hit(s), 0 miss(es)" in second
    assert "result: Batching merges sibling model calls." in second


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
