"""The cache across processes: replay, concurrent writers, kills and Ctrl-C.

Programs run as real subprocesses (tests/fixtures/cache_program.py and
cache_workers.py) against a cache under ``tmp_path``.
"""
from __future__ import annotations

import json
import multiprocessing
import random
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from outlines.cache import Cache, CacheWarning
from tests.fixtures import cache_workers
from tests.fixtures.subprocesses import ROOT, python_env, sigint_default

def _env(tmp_path: Path) -> dict[str, str]:
    return python_env(OUTLINES_CACHE_DIR=str(tmp_path / "default"))


def run_program(tmp_path: Path, log: str, *options: str) -> tuple[list[Any], list[str]]:
    """Run the fixture program; its printed values and the prompts it sent."""
    log_file = tmp_path / log
    command = [sys.executable, "-m", "tests.fixtures.cache_program", "--cache", str(tmp_path / "cache"),
               "--log", str(log_file), *options]
    done = subprocess.run(command, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    sent = [json.loads(line) for line in log_file.read_text().splitlines()] if log_file.exists() else []
    return json.loads(done.stdout.splitlines()[-1]), sent


def test_a_full_disk_skips_writes_with_a_warning_and_eval_goes_on(tmp_path: Path) -> None:
    options = ["--items", "300", "--max-batch", "10"]
    log_file = tmp_path / "full.log"
    command = [sys.executable, "-m", "tests.fixtures.cache_program", "--cache", str(tmp_path / "cache"),
               "--log", str(log_file), "--file-limit", "40000", *options]
    done = subprocess.run(command, cwd=ROOT, env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # every value came back
    assert json.loads(done.stdout.splitlines()[-1]) == [f"Q: item {i} => done" for i in range(300)]
    assert "CacheWarning" in done.stderr and "write skipped" in done.stderr
    file = Cache(tmp_path / "cache").file
    assert integrity(file) == "ok"
    stored = Cache(tmp_path / "cache").stats()["entries"]
    assert 0 < stored < 300  # the disk filled up part way
    values, sent = run_program(tmp_path, "after.log", *options)  # room again: only the rest is sent
    assert len(sent) == 300 - stored and values == [f"Q: item {i} => done" for i in range(300)]


def integrity(file: Path) -> str:
    with sqlite3.connect(file) as connection:
        return connection.execute("PRAGMA integrity_check").fetchone()[0]


def test_a_second_run_replays_and_more_samples_send_only_the_new_ones(tmp_path: Path) -> None:
    first, sent = run_program(tmp_path, "one.log", "--items", "2", "--samples", "5", "--random")
    assert len(sent) == 10
    second, sent = run_program(tmp_path, "two.log", "--items", "2", "--samples", "5", "--random")
    assert sent == [] and second == first
    eight, sent = run_program(tmp_path, "three.log", "--items", "2", "--samples", "8", "--random")
    assert len(sent) == 6  # 3 new samples for each of the 2 items
    assert [row[:5] for row in eight] == first
    assert all(len(set(row)) == 8 for row in eight)  # the new draws are new draws


def test_concurrent_writer_processes_and_a_reader(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    Cache(directory).put_many(cache_workers.entries(["warm-up"]))  # create the file before the race
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    names, count = ["left", "right"], 200
    processes = [context.Process(target=cache_workers.writer, args=(directory, n, count, queue)) for n in names]
    processes.append(context.Process(target=cache_workers.reader, args=(directory, names, count, queue)))
    for process in processes:
        process.start()
    messages = [queue.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    (reader_report,) = [m for m in messages if m[0] == "reader"]
    assert reader_report[2] == []  # every value read was complete
    cache = Cache(directory)
    wanted = cache_workers.entries([f"shared-{i}" for i in range(count)] + [f"{n}-{i}" for n in names for i in range(count)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        found = cache.get_many(list(wanted))
    assert found == wanted
    assert cache.stats()["entries"] == 3 * count + 1
    assert integrity(cache.file) == "ok"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_child_process_that_returns_at_once_keeps_its_puts(tmp_path: Path, method: str) -> None:
    directory = str(tmp_path / "cache")
    parent = Cache(directory)
    parent.put_many({cache_workers.key("parent"): "p"})  # the parent's writer thread exists when it forks
    context = multiprocessing.get_context(method)
    child = context.Process(target=cache_workers.put_and_leave, args=(directory, method, 300))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    wanted = cache_workers.entries([f"{method}-{i}" for i in range(300)])
    assert Cache(directory, memory_entries=0).get_many(list(wanted)) == wanted
    assert parent.get_many([cache_workers.key("parent")]) == {cache_workers.key("parent"): "p"}


@pytest.mark.slow
def test_a_writer_killed_at_random_points_leaves_whole_entries(tmp_path: Path) -> None:
    directory = tmp_path / "cache"
    rng = random.Random(1234)
    for _ in range(10):
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.cache_workers", str(directory)],
            cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        assert writer.stdout is not None
        writer.stdout.readline()  # it has written at least one batch
        time.sleep(rng.uniform(0.0, 0.3))
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
        writer.stdout.close()
        writer.stderr.close()  # type: ignore[union-attr]
        cache = Cache(directory, memory_entries=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            batches = [cache_workers.entries(cache_workers.batch_names(b)) for b in range(2000)]
            found = cache.get_many([k for batch in batches for k in batch])
        assert all(value == batch[k] for batch in batches for k, value in found.items() if k in batch)
        present = [sum(k in found for k in keys) for keys in batches]
        assert set(present) <= {0, cache_workers.BATCH}  # each put_many is all or nothing
        assert present[0] == cache_workers.BATCH
        cache.close()
        assert integrity(cache.file) == "ok"


@pytest.mark.parametrize(
    "batch_options",
    [
        (),
        ("--max-batch", "1"),
    ],
    ids=["default", "max_batch=1"],
)
def test_ctrl_c_mid_run_keeps_what_finished(tmp_path: Path, batch_options: tuple[str, ...]) -> None:
    options = ["--items", "100", "--delay", "0.02", "--max-concurrency", "4", *batch_options]
    log = tmp_path / "interrupted.log"
    command = [sys.executable, "-m", "tests.fixtures.cache_program", "--cache", str(tmp_path / "cache"),
               "--log", str(log), *options]
    process = subprocess.Popen(command, cwd=ROOT, env=_env(tmp_path), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= 40:
            break
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - interrupted < 5.0, "Ctrl-C took too long"
    assert process.returncode != 0 and "KeyboardInterrupt" in stderr
    sent_before = len(log.read_text().splitlines())
    assert sent_before < 100
    stored = Cache(tmp_path / "cache").stats()["entries"]
    assert 30 <= stored <= sent_before
    assert integrity(Cache(tmp_path / "cache").file) == "ok"

    values, sent = run_program(tmp_path, "rerun.log", *options)
    assert len(sent) == 100 - stored  # only the rest
    clean_run = tmp_path / "clean"
    clean_run.mkdir()
    clean, _ = run_program(clean_run, "clean.log", *options)
    assert values == clean
