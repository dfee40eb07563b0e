"""The benchmark harness (``benchmarks/compare.py``, ``benchmarks/_compat.py``): what it reads and flags.

The benchmarks themselves are not timed tests; these check that a comparison
of two trees imports the tree it names, reads the rows the scripts print and
flags the right ones, and that the issue-40 case runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import compare  # noqa: E402


def _job(old: list[float], new: list[float], unit: str = "s") -> compare.Job:
    job = compare.Job("j", ["x.py"], compare.bench_lines(""))
    for side, values in (("old", old), ("new", new)):
        job.results[side] = [{"rows": {"r": [v, unit]}, "load": 0.5, "seconds": 1.0} for v in values]
    return job


def test_flags_a_row_worse_by_more_than_the_tolerance_at_the_min() -> None:
    flagged, values = compare.table([_job([1.00, 1.20, 1.10], [1.06, 1.00 * 1.5, 1.07])], 0.05, quiet=True)
    assert flagged == ["r"] and values["r"]["new"] == [1.06, 1.5, 1.07]
    flagged, _ = compare.table([_job([1.00, 1.20], [1.04, 2.0])], 0.05, quiet=True)  # the min is within 5%
    assert flagged == []


def test_a_percentage_is_worse_when_lower() -> None:
    assert compare.table([_job([94.0], [90.0], "%")], 0.05, quiet=True)[0] == []  # 4.3% lower
    assert compare.table([_job([94.0], [80.0], "%")], 0.05, quiet=True)[0] == ["r"]
    assert compare.worse(10.0, 9.0, "%") == pytest.approx(0.1)
    assert compare.worse(10.0, 9.0, "s") == pytest.approx(-0.1)
    assert compare.worse(0, 0, "calls") == 0.0


def test_reads_bench_lines_and_a_last_json_line() -> None:
    out = 'human text\nBENCH {"row": "a", "value": 1.5, "unit": "us"}\nBENCH {"row": "b", "value": 2, "unit": "%"}\n'
    assert compare.bench_lines("p: ")(out) == {"p: a": (1.5, "us"), "p: b": (2.0, "%")}
    parse = compare.last_json("q", {"wall": ("", "s"), "dask": (": dask", "s"), "calls": (": calls", "calls")})
    assert parse('x\n{"wall": 0.3, "dask": NaN, "calls": 3}\n') == {"q": (0.3, "s"), "q: calls": (3.0, "calls")}
    assert compare.last_json("j ", {"cost": ("cost", "$")})('{"result": {"cost": 0.5}}') == {"j cost": (0.5, "$")}


def test_every_job_names_a_script_that_exists() -> None:
    names = [job.name for job in compare.jobs()]
    assert len(names) == len(set(names))
    assert all((BENCHMARKS / job.argv[0]).is_file() for job in compare.jobs())
    assert any("Program concat 100000" in name for name in names)
    assert any("fn-default 20000 chains" in name for name in names)


def test_the_scripts_import_the_tree_named_by_the_environment(tmp_path: Path) -> None:
    (tmp_path / "outlines").mkdir()
    (tmp_path / "outlines" / "__init__.py").write_text("MARK = 'the other tree'\n")
    env = {**os.environ, "OUTLINES_BENCH_TREE": str(tmp_path)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([sys.executable, "-c", "import _compat, outlines; print(outlines.MARK, _compat.ROOT)"],
                          capture_output=True, text=True, cwd=BENCHMARKS, env=env, check=True)
    assert done.stdout.split("\n")[0] == f"the other tree {tmp_path.resolve()}"


def _child(spec: dict[str, object]) -> dict[str, float]:
    env = {**os.environ, "OUTLINES_BENCH_TREE": str(BENCHMARKS.parent)}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "bench_scale.py"), "--child", json.dumps(spec)],
                          capture_output=True, text=True, cwd=BENCHMARKS.parent, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_set_stack_min_reaches_the_planner() -> None:
    """Loops built one by one stack into one loop node; with the threshold out of reach each runs alone."""
    stacked = _child({"kind": "loops", "n": 150, "cache": False, "stack": True})
    alone = _child({"kind": "loops", "n": 150, "cache": False, "stack": False})
    assert stacked["calls"] <= 5 < alone["calls"]


def test_the_issue_40_program_case_runs() -> None:
    result = _child({"kind": "program-concat", "n": 300, "cache": False})
    assert result["calls"] == 3 and result["wall"] >= 0.3
