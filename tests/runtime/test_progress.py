"""Progress: draws done / total, batches running, tokens; terminal, log and Jupyter views."""
from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import types
from typing import Iterator

import pytest

import outlines
from outlines import models
from outlines.graph.traits import Run, Traits
from outlines.runtime import progress


class Screen(io.StringIO):
    """A stream that says whether it is a terminal."""

    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.fixture
def fast() -> Iterator[None]:
    with outlines.common.config.tuning(progress_refresh=0.005):
        yield


def _slow_chain(delay: float, fail: bool = False) -> tuple[outlines.Variable, dict[str, list[str]]]:
    async def slow(prompts: list[str]) -> list[str]:
        await asyncio.sleep(delay)
        if fail:
            raise RuntimeError("backend down")
        return [p + "." for p in prompts]

    llm = models.from_function(slow, batched=True, max_batch=2)
    q = outlines.string("q")
    return llm(llm(q), num_samples=2), {"q": ["a", "b", "c", "d"]}  # 4 draws, then 8


def _run(monkeypatch: pytest.MonkeyPatch, tty: bool, delay: float = 0.03, **options: object) -> str:
    screen = Screen(tty)
    monkeypatch.setattr(sys, "stderr", screen)
    out, givens = _slow_chain(delay)
    out.eval(givens, cache=False, **options)
    return screen.getvalue()


def test_the_terminal_line_counts_draws_not_nodes(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    text = _run(monkeypatch, tty=True, progress=True)
    frames = [frame.strip() for frame in text.split("\r") if frame.strip()]
    assert len(frames) > 3  # redrawn in place while it ran
    assert frames[-1].startswith("outlines: 12/12 draws | 0 batches running")  # 4 draws, then 4 x 2 samples
    done = [int(frame.split()[1].split("/")[0]) for frame in frames]
    assert done == sorted(done) and done[0] == 0 and any(0 < d < 12 for d in done)
    assert any("batches running" in f and not f.split("|")[1].strip().startswith("0") for f in frames)
    assert text.endswith("\n") and text.count("\n") == 1


def test_a_log_gets_a_start_and_an_end_line_only(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    text = _run(monkeypatch, tty=False, delay=0.05, progress=True)
    lines = text.splitlines()
    assert len(lines) == 2, text
    assert lines[0].startswith("outlines: 0/") and lines[1].startswith("outlines: 12/12 draws")
    assert lines[1].endswith("(finished)")
    assert len(text.encode()) < 300


def test_a_log_line_at_most_every_log_every_seconds(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    with outlines.common.config.tuning(progress_log_every=0.05):
        text = _run(monkeypatch, tty=False, delay=0.06, progress=True)
    lines = text.splitlines()
    assert 3 <= len(lines) <= 8  # ~0.25 s of work: a handful of lines, not one per redraw (~50)


def test_non_tty_progress_output_stays_small() -> None:
    """A real run with stderr piped: a few hundred bytes, where refreshing lines wrote hundreds of KB."""
    script = """
import asyncio, outlines
from outlines import models
async def slow(prompts):
    await asyncio.sleep(0.05)
    return [p + "." for p in prompts]
llm = models.from_function(slow, batched=True, max_batch=1)
q = outlines.string("q")
outlines.eval(llm(q, num_samples=4), givens={q: [str(i) for i in range(10)]}, cache=False, progress=True)
"""
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=True)
    assert "outlines: 40/40 draws" in done.stderr
    assert len(done.stderr.encode()) < 400, done.stderr


def test_no_progress_with_progress_false(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    assert _run(monkeypatch, tty=True, progress=False) == ""


def test_automatic_progress_only_for_long_evaluations(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    with outlines.common.config.tuning(progress_auto_delay=0.04):
        assert _run(monkeypatch, tty=False, delay=0.0) == ""
        assert "12/12 draws" in _run(monkeypatch, tty=False, delay=0.05)


def test_progress_ends_when_the_evaluation_fails(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    screen = Screen(False)
    monkeypatch.setattr(sys, "stderr", screen)
    out, givens = _slow_chain(0.02, fail=True)
    with pytest.raises(outlines.NodeError):
        out.eval(givens, cache=False, progress=True)
    last = screen.getvalue().splitlines()[-1]
    assert "(finished)" not in last and last.endswith(" not run)"), last
    assert "(stopped by NodeError: " in last and " draws (" in last and " failed)" in last


def test_progress_says_when_every_draw_failed(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    screen = Screen(False)
    monkeypatch.setattr(sys, "stderr", screen)
    out, givens = _slow_chain(0.02, fail=True)
    values = out.eval(givens, cache=False, progress=True, errors="return")
    assert all(isinstance(v, outlines.Failure) for v in values.flat)
    last = screen.getvalue().splitlines()[-1]
    assert last.startswith("outlines: 4/4 draws (4 failed) |"), last  # the 8 after them never became draws
    assert last.endswith("(all 4 draws failed)"), last


def test_progress_counts_failures_and_hits_in_the_line(monkeypatch: pytest.MonkeyPatch, fast: None, tmp_path) -> None:
    from outlines.cache import Cache

    async def some_fail(prompts: list[str]) -> list[str]:
        await asyncio.sleep(0.02)
        if any("bad" in p for p in prompts):
            raise RuntimeError("refused")
        return [p + "." for p in prompts]

    llm = models.from_function(some_fail, batched=True, max_batch=1)
    q = outlines.string("q")
    cache = Cache(tmp_path)
    llm(q).eval({"q": ["a"]}, cache=cache, progress=False)
    screen = Screen(True)
    monkeypatch.setattr(sys, "stderr", screen)
    llm(q).eval({"q": ["a", "b", "bad"]}, cache=cache, progress=True, errors="return")
    last = screen.getvalue().split("\r")[-1].strip()
    assert last.startswith("outlines: 3/3 draws (1 failed) | 1 cached |"), last
    assert last.endswith("(finished, 1 of 3 draws failed)"), last


def test_progress_task_does_not_outlive_aeval(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    monkeypatch.setattr(sys, "stderr", Screen(False))
    out, givens = _slow_chain(0.01)

    async def main() -> int:
        await out.aeval(givens, cache=False, progress=True)
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    assert asyncio.run(main()) == 0


def test_cache_hits_count_as_done_draws(monkeypatch: pytest.MonkeyPatch, fast: None, tmp_path) -> None:
    from outlines.cache import Cache

    cache = Cache(tmp_path)
    out, givens = _slow_chain(0.01)
    out.eval(givens, cache=cache, progress=False)
    screen = Screen(False)
    monkeypatch.setattr(sys, "stderr", screen)
    out.eval(givens, cache=cache, progress=True)
    assert screen.getvalue().splitlines()[-1].startswith("outlines: 12/12 draws | 12 cached")


def test_progress_keeps_the_trace_recording(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    monkeypatch.setattr(sys, "stderr", Screen(False))
    out, givens = _slow_chain(0.01)
    with outlines.trace() as trace:
        out.eval(givens, cache=False, progress=True)
    assert len(trace.batches) == 6 and trace.cache_misses == 12


class FakeHandle:
    def __init__(self, log: list) -> None:
        self.log = log

    def update(self, obj: object) -> None:
        self.log.append(("update", obj))


def test_jupyter_shows_one_html_block_updated_in_place(monkeypatch: pytest.MonkeyPatch, fast: None) -> None:
    """In a kernel: display(..., display_id=True) once, then update(); no ipywidgets, nothing on stderr."""
    log: list = []

    class ZMQInteractiveShell:
        pass

    def display(obj: object, display_id: bool = False) -> FakeHandle:
        assert display_id is True
        log.append(("display", obj))
        return FakeHandle(log)

    class HTML:
        def __init__(self, data: str) -> None:
            self.data = data

    ipython = types.ModuleType("IPython")
    ipython.get_ipython = ZMQInteractiveShell  # type: ignore[attr-defined]
    ipython_display = types.ModuleType("IPython.display")
    ipython_display.display, ipython_display.HTML = display, HTML  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    monkeypatch.setitem(sys.modules, "IPython.display", ipython_display)
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # importing it would fail
    text = _run(monkeypatch, tty=False, progress=True)
    assert text == ""
    assert [kind for kind, _ in log][0] == "display" and {kind for kind, _ in log[1:]} == {"update"}
    assert len(log) > 2
    last = log[-1][1].data
    assert last.startswith('<div class="outlines-progress"') and "<progress" in last
    assert "12/12 draws" in last and 'value="1.000"' in last


def _schedule(*outputs: object, queued: int = 0) -> types.SimpleNamespace:
    """A stand-in for the schedule the figures read: a plan of model calls and the draws queued."""
    nodes = [types.SimpleNamespace(op=types.SimpleNamespace(traits=Traits(run=Run.GENERATE)), outputs=[output]) for output in outputs]
    return types.SimpleNamespace(plan=types.SimpleNamespace(nodes=nodes), queued_draws=lambda: queued)


def test_known_shapes_give_the_total_before_the_draws_start() -> None:
    known = progress.Progress(progress.Counter(), _schedule(types.SimpleNamespace(shape=(3, 5))))
    assert known.total() == (15, True)
    assert known.line().startswith("outlines: 0/15 draws | 0 batches running")
    unknown = progress.Progress(progress.Counter(), _schedule(object()))
    assert unknown.line().startswith("outlines: 0/0+ draws")
    queued = progress.Progress(progress.Counter(), _schedule(queued=4))
    assert queued.total() == (4, True)  # draws waiting in the batcher's queues count too
