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


def test_best_of_n_judges_each_task_with_its_own_candidates(tmp_path):
    out = run_example("best_of_n.py", cache_dir=str(tmp_path))
    assert "2 + 3 = 5\n10 + 7 = 17\n4 + 4 = 8\n" in out  # 3 tasks, 3 samples: rows not mixed
    assert "judge" in out and "9/9.0/9" in out  # one solver call for every sample of every task
