"""The progress bar: nodes done / total and batches in flight; on, off or automatic."""
from __future__ import annotations

import asyncio

import pytest
import tqdm.auto

import outlines
from outlines import models
from outlines.runtime import progress


class FakeBar:
    """Stands in for tqdm: records what the bar was told."""

    bars: list[FakeBar] = []

    def __init__(self, total: int, **kwargs: object) -> None:
        self.total = total
        self.kwargs = kwargs
        self.n = 0
        self.seen: list[tuple[int, int]] = []  # (n, in_flight) at each refresh
        self.in_flight = 0
        self.closed_at: int | None = None
        FakeBar.bars.append(self)

    def set_postfix(self, refresh: bool = True, **values: int) -> None:
        self.in_flight = values["in_flight"]

    def refresh(self) -> None:
        self.seen.append((self.n, self.in_flight))

    def close(self) -> None:
        self.closed_at = self.n


@pytest.fixture
def bars(monkeypatch: pytest.MonkeyPatch) -> list[FakeBar]:
    FakeBar.bars = []
    monkeypatch.setattr(tqdm.auto, "tqdm", FakeBar)
    monkeypatch.setattr(progress, "REFRESH", 0.005)
    return FakeBar.bars


def _slow_chain(delay: float, fail: bool = False) -> tuple[outlines.Variable, dict[str, list[str]]]:
    async def slow(prompts: list[str]) -> list[str]:
        await asyncio.sleep(delay)
        if fail:
            raise RuntimeError("backend down")
        return [p + "." for p in prompts]

    llm = models.from_function(slow, batched=True, max_batch=2)
    q = outlines.string("q")
    return llm(llm(q)), {"q": ["a", "b", "c", "d"]}


def test_forced_bar_counts_nodes_and_batches_in_flight(bars: list[FakeBar]) -> None:
    out, givens = _slow_chain(0.03)
    out.eval(givens, cache=False, progress=True)
    (bar,) = bars
    assert bar.total == 2 and bar.kwargs["unit"] == "node"
    assert bar.closed_at == 2  # the bar ends full
    assert max(in_flight for _, in_flight in bar.seen) == 2  # two batches of two prompts
    assert [n for n, _ in bar.seen] == sorted(n for n, _ in bar.seen)


def test_no_bar_with_progress_false(bars: list[FakeBar]) -> None:
    out, givens = _slow_chain(0.03)
    out.eval(givens, cache=False, progress=False)
    assert bars == []


def test_automatic_bar_only_for_long_evaluations(bars: list[FakeBar], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "AUTO_DELAY", 0.04)
    quick, givens = _slow_chain(0.0)
    quick.eval(givens, cache=False)
    assert bars == []
    slow, givens = _slow_chain(0.05)
    slow.eval(givens, cache=False)
    assert len(bars) == 1 and bars[0].closed_at == 2


def test_bar_closes_when_the_evaluation_fails(bars: list[FakeBar]) -> None:
    out, givens = _slow_chain(0.02, fail=True)
    with pytest.raises(outlines.NodeError):
        out.eval(givens, cache=False, progress=True)
    assert len(bars) == 1 and bars[0].closed_at is not None


def test_bar_task_does_not_outlive_aeval(bars: list[FakeBar]) -> None:
    out, givens = _slow_chain(0.01)

    async def main() -> int:
        await out.aeval(givens, cache=False, progress=True)
        return len([t for t in asyncio.all_tasks() if t is not asyncio.current_task()])

    assert asyncio.run(main()) == 0


def test_real_tqdm_writes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    out, givens = _slow_chain(0.01)
    out.eval(givens, cache=False, progress=True)
    err = capsys.readouterr().err
    assert "outlines" in err and "node" in err
