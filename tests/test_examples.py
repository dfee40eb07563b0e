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


def test_extract_gives_50_valid_typed_records_in_batches(tmp_path):
    out = run_example("extract.py", "--max-tokens", "40", cache_dir=str(tmp_path))
    assert "valid: 50/50" in out
    assert "backend calls: 2" in out  # 50 prompts at the transformers max_batch of 32
