"""outlines.common.config: the process state, tuning values as options, the default executor."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import outlines
from outlines import models
from outlines.common.config import (
    ProcessState, Tuning, current_tuning, process_state, set_executor, set_tuning, tuning, using_process_state,
)
from outlines.runtime.executor import LocalExecutor
from outlines.runtime.session import Evaluation, Options


def test_a_with_block_sets_tuning_values_inside_and_restores_them_after() -> None:
    before = current_tuning()
    with tuning(stack_min=2, progress_refresh=0.01) as inside:
        assert current_tuning() is inside and (inside.stack_min, inside.progress_refresh) == (2, 0.01)
        with tuning(peek_min=3):  # nested: starts from the block around it
            assert (current_tuning().stack_min, current_tuning().peek_min) == (2, 3)
        assert current_tuning().peek_min == before.peek_min
    assert current_tuning() == before == Tuning()


def test_unknown_tuning_names_are_refused_naming_the_closest_one() -> None:
    with pytest.raises(TypeError, match=r"unknown tuning value 'stack_mn'; did you mean stack_min\?"):
        with tuning(stack_mn=1):
            pass
    with pytest.raises(TypeError, match=r"unknown tuning value 'patience'; did you mean thread_patience\?"):
        set_tuning(patience=1.0)
    with pytest.raises(TypeError, match="stack_min must be an int"):
        Tuning().with_changes(stack_min=1.5)
    with pytest.raises(ValueError, match="peek_min must be at least 1"):
        Tuning().with_changes(peek_min=0)
    with pytest.raises(ValueError, match="progress_refresh must be >= 0"):
        Tuning().with_changes(progress_refresh=-1)
    assert current_tuning() == Tuning()  # nothing was set by a refused change


def test_a_with_blocks_tuning_stays_in_its_own_thread_and_task() -> None:
    entered, done = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def other_thread() -> None:
        with tuning(stack_min=7):
            entered.set()
            done.wait(10)
            seen["thread"] = current_tuning().stack_min

    worker = threading.Thread(target=other_thread)
    worker.start()
    assert entered.wait(10)
    seen["main"] = current_tuning().stack_min  # while the other thread is inside its block
    done.set()
    worker.join(10)

    async def task(value: int, ready: asyncio.Event, go: asyncio.Event) -> int:
        with tuning(peek_min=value):
            ready.set()
            await go.wait()  # the other task enters its block meanwhile
            return current_tuning().peek_min

    async def main() -> list[int]:
        events = [asyncio.Event() for _ in range(3)]
        first = asyncio.ensure_future(task(5, events[0], events[2]))
        second = asyncio.ensure_future(task(9, events[1], events[2]))
        await events[0].wait()
        await events[1].wait()
        outside = current_tuning().peek_min
        events[2].set()
        return [await first, await second, outside]

    assert asyncio.run(main()) == [5, 9, Tuning().peek_min]
    assert seen == {"thread": 7, "main": Tuning().stack_min}


def test_set_tuning_is_process_wide_and_gives_back_what_it_replaced(fresh_state: ProcessState) -> None:
    previous = set_tuning(thread_patience=1.5)
    assert previous == Tuning() and fresh_state.tuning.thread_patience == 1.5
    seen: list[float] = []
    worker = threading.Thread(target=lambda: seen.append(current_tuning().thread_patience))
    worker.start()
    worker.join(10)
    assert seen == [1.5]  # another thread sees it
    with tuning(thread_patience=0.5):
        assert current_tuning().thread_patience == 0.5  # a block wins in its context
    set_tuning(previous)
    assert current_tuning() == Tuning()


def test_evaluation_open_reads_the_process_state_it_is_given() -> None:
    state = ProcessState()
    executor = LocalExecutor()
    state.executor, state.cache_enabled = executor, False
    state.tuning = Tuning(peek_min=3)
    evaluation = Evaluation.open(Options(), state=state)
    assert evaluation.state is state and evaluation.executor is executor
    assert evaluation.cache is None and evaluation.tuning.peek_min == 3
    with tuning(peek_min=4):  # a with block in force where it opens wins over the state's
        assert Evaluation.open(Options(cache=False), state=state).tuning.peek_min == 4
    with using_process_state(state):  # an entry point reads the state in force
        assert Evaluation.open(Options()).state is state
    assert process_state() is not state


def test_set_executor_and_the_cache_controls_set_fields_of_the_process_state(fresh_state: ProcessState,
                                                                              tmp_path: Any) -> None:
    executor = LocalExecutor()
    set_executor(executor)
    assert fresh_state.executor is executor and Evaluation.open(Options(cache=False)).executor is executor
    outlines.cache.enable(tmp_path)
    assert (fresh_state.cache_enabled, fresh_state.cache_path) == (True, str(tmp_path))
    default = outlines.cache.resolve(True)
    assert default is not None and list(fresh_state.caches.values()) == [default]
    outlines.cache.disable()
    assert fresh_state.cache_enabled is False and outlines.cache.resolve(True) is None
    with using_process_state():  # a fresh state: no executor, the cache following the environment
        assert process_state().executor is None and Evaluation.open(Options(cache=False)).executor is not executor


def test_tuning_in_force_at_eval_applies_to_its_plan_and_progress(fresh_state: ProcessState) -> None:
    llm = models.from_function(lambda prompt: prompt + ".", name="dot")
    outs = [llm(outlines.constant(f"q{i}")) for i in range(3)]  # 3 uses: far fewer than the default stack_min

    def nodes() -> int:
        with outlines.trace() as trace:
            assert list(outlines.eval(*outs, cache=False)) == ["q0.", "q1.", "q2."]
        return len(trace.nodes)

    assert nodes() == 3
    with tuning(stack_min=2):
        assert nodes() == 1  # the three calls stacked into one node
    set_tuning(stack_min=3)
    assert nodes() == 1


def test_a_loops_body_plan_is_kept_by_the_process_state_not_on_the_op(fresh_state: ProcessState) -> None:
    llm = models.from_function(lambda prompt: prompt + "!", name="bang")
    short = outlines.fn(lambda text: len(text) < 4, name="short", pure=True)
    loop = outlines.while_loop(short, llm, init="a", max_iter=9)
    assert loop.eval(cache=False) == "a!!!"
    op = loop.owner.op
    assert "_plans" not in vars(op)  # nothing set on the op
    kept = dict(fresh_state.plans._plans[op])
    assert kept and loop.eval(cache=False) == "a!!!"
    assert fresh_state.plans._plans[op] == kept and all(fresh_state.plans._plans[op][k] is p for k, p in kept.items())


def test_a_steps_timing_goes_with_the_step(fresh_state: ProcessState) -> None:
    import gc

    step = outlines.fn(lambda text: text + "!", name="bang")
    assert step("a").eval() == "a!"
    assert fresh_state.timings.mean(step) is not None and len(fresh_state.timings._means) == 1
    del step
    for _ in range(3):  # the evaluation's finished coroutines are finalized in one pass, what they held in the next
        if not gc.collect():
            break
    assert fresh_state.timings._means == {}  # nothing kept for a step that is gone
