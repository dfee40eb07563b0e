"""Loops and branches at run time, seen from a recording fake backend.

Each iteration is one batched schedule over the elements still active; draws
carry the iteration; a re-run replays from the cache and resumes where a
failure stopped it; ``cond`` sends each branch only its elements; a loop
equals the same program unrolled in plain Python (hypothesis).
"""
from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.cache import Cache
from tests.fixtures.recording import RecordingBackend
from tests.runtime.test_scheduler import reply


@outlines.fn(name="need")
def need(question: str) -> int:
    """How many steps a question takes: the digit after its last ``q``."""
    return int(question.rsplit("q", 1)[1][0])


@outlines.fn(name="more")
def more(steps: int, question: str) -> bool:
    return steps < need.target(question)


@outlines.fn(name="inc")
def inc(steps: int) -> int:
    return steps + 1


def agent(llm: models.Model, max_iter: int = 8) -> tuple[outlines.Variable, outlines.Variable]:
    """A ReAct-shaped loop: (transcript, steps) per question."""
    question = outlines.string("question")

    def step(transcript, steps):  # noqa: ANN001, ANN202
        return transcript + llm(question + "|" + transcript) + "\n", inc(steps)

    return outlines.while_loop(lambda t, s: more(s, question), step, init=("", 0), max_iter=max_iter)


def python_agent(question: str, max_iter: int) -> tuple[str, int]:
    transcript, steps = "", 0
    while steps < need.target(question) and steps < max_iter:
        transcript, steps = transcript + reply(question + "|" + transcript) + "\n", steps + 1
    return transcript, steps


def recording_backend(tag: str = "", *, name: str = "rec", delay: float = 0.005) -> RecordingBackend:
    """The shared recording fake answering ``reply(prompt, tag)``, each batch after ``delay`` seconds."""
    return RecordingBackend(lambda prompt: reply(prompt, tag), name=name, delay=delay)


def sizes(recording: RecordingBackend) -> list[int]:
    return [len(batch) for batch in recording.batches]


def test_calls_per_iteration_shrink_exactly_as_elements_finish() -> None:
    recording = recording_backend()
    transcript, steps = agent(recording.model())
    questions = ["q2", "q0", "q3", "q1", "q3-again"]
    texts, counts = outlines.eval(transcript, steps, givens={"question": questions}, cache=False)
    assert sizes(recording) == [4, 3, 2]  # q0 never enters; one backend call per iteration
    assert list(counts) == [2, 0, 3, 1, 3]
    assert [tuple(x) for x in zip(texts, counts)] == [python_agent(q, 8) for q in questions]


def test_max_iter_ends_every_element() -> None:
    recording = recording_backend()
    _, steps = agent(recording.model(), max_iter=2)
    assert list(steps.eval({"question": ["q5", "q1", "q9"]}, cache=False)) == [2, 1, 2]
    assert sizes(recording) == [3, 2]


def agent_loop(llm: models.Model, on_max_iter: str) -> tuple[outlines.Variable, outlines.Variable]:
    """``agent`` with ``max_iter=2`` and ``on_max_iter``."""
    question = outlines.string("question")

    def step(transcript, steps):  # noqa: ANN001, ANN202
        return transcript + llm(question + "|" + transcript) + "\n", inc(steps)

    return outlines.while_loop(lambda t, s: more(s, question), step, init=("", 0), max_iter=2,
                               on_max_iter=on_max_iter)


#: q5 and q9 run out of turns; q2 finishes on its last one; q1 before.
CUT = ["q5", "q1", "q9", "q2"]


def test_keep_counts_the_elements_max_iter_stopped_in_the_trace_and_progress(
        capsys: pytest.CaptureFixture[str]) -> None:
    recording = recording_backend()
    transcript, steps = agent_loop(recording.model(), "keep")
    with outlines.trace() as trace:
        texts, counts = outlines.eval(transcript, steps, givens={"question": CUT}, cache=False, progress=True)
    assert list(counts) == [2, 1, 2, 2] and texts[0] == python_agent("q5", 2)[0]  # the last state, kept
    loop = transcript.owner.label
    assert trace.loops_limited == {loop: {"stopped": 2, "elements": 4, "max_iter": 2}}
    assert f"{loop}: 2 of 4 stopped at max_iter=2" in trace.summary()
    assert f"{loop}: 2 of 4 stopped at max_iter=2" in capsys.readouterr().err
    assert sizes(recording) == [4, 3]


def test_fail_turns_the_elements_max_iter_stopped_into_failures_naming_it() -> None:
    transcript, steps = agent_loop(recording_backend().model(), "fail")
    loop = transcript.owner.label
    texts, counts = outlines.eval(transcript, steps, givens={"question": CUT}, cache=False, errors="return")
    failed = [isinstance(t, outlines.Failure) for t in texts]
    assert failed == [True, False, True, False] and list(counts[[1, 3]]) == [1, 2]
    assert texts[0].node == loop and texts[0].error_type == "MaxIterError" and "max_iter=2" in texts[0].message
    with pytest.raises(outlines.NodeError, match=rf"node {loop} \(while_loop\) failed: MaxIterError: .*max_iter=2"):
        outlines.eval(transcript, givens={"question": CUT}, cache=False)
    assert list(outlines.eval(steps, givens={"question": ["q1", "q2"]}, cache=False)) == [1, 2]  # none cut: no error


def test_init_broadcasts_against_the_outer_values_and_scalars_stay_scalars() -> None:
    recording = recording_backend()
    _, steps = agent(recording.model())
    assert steps.eval({"question": "q2"}, cache=False) == 2
    assert np.shape(steps.eval({"question": [["q1", "q2"], ["q3", "q0"]]}, cache=False)) == (2, 2)


def roll_loop(llm: models.Model, iterations: int = 3) -> outlines.Variable:
    question = outlines.string("question")
    count = outlines.fn(lambda rolls: rolls.count(";") < iterations, name="count")
    return outlines.while_loop(count, lambda rolls: rolls + llm(question) + ";", init="", max_iter=9)


def test_the_same_prompt_every_iteration_is_a_new_draw_and_a_rerun_replays(tmp_path: Any) -> None:
    counter = iter(range(1000))

    def dice(prompts: list[str]) -> list[str]:
        return [f"{p}={next(counter)}" for p in prompts]

    llm = models.from_function(dice, batched=True, name="dice", version="1")  # its counter is state the identity cannot hash
    cache = Cache(tmp_path)
    first = roll_loop(llm).eval({"question": ["a", "b"]}, cache=cache)
    assert [r.count(";") for r in first] == [3, 3]
    rolls = [r.split(";")[:3] for r in first]
    assert all(len(set(row)) == 3 for row in rolls)  # same prompt, three iterations, three draws
    drawn = next(counter)
    again = roll_loop(llm).eval({"question": ["a", "b"]}, cache=cache)
    assert list(again) == list(first) and next(counter) == drawn + 1  # zero calls on the re-run


FLAKY: dict[str, Any] = {"fail_at": None, "log": []}


def flaky(prompts: list[str]) -> list[str]:
    FLAKY["log"].append(list(prompts))
    if len(FLAKY["log"]) == FLAKY["fail_at"]:
        raise RuntimeError("backend down")
    return [reply(p) for p in prompts]


def test_a_rerun_after_a_failure_at_iteration_k_sends_only_iterations_from_k(tmp_path: Any) -> None:
    questions = ["q4", "q2", "q3"]
    transcript, _ = agent(models.from_function(flaky, batched=True, name="flaky"))
    cache = Cache(tmp_path)
    FLAKY.update(fail_at=3, log=[])
    with pytest.raises(outlines.NodeError, match=r"while_loop#\d+ \(while_loop, iteration 3\).*backend down"):
        transcript.eval({"question": questions}, cache=cache)
    assert [len(b) for b in FLAKY["log"]] == [3, 3, 2]
    FLAKY.update(fail_at=None, log=[])
    resumed = transcript.eval({"question": questions}, cache=cache)
    assert [len(b) for b in FLAKY["log"]] == [2, 1]  # iterations 3 and 4 only
    assert list(resumed) == [python_agent(q, 8)[0] for q in questions]


def test_errors_return_a_failing_element_leaves_holding_its_failure() -> None:
    recording = recording_backend()
    llm = recording.model()
    question = outlines.string("question")
    check = outlines.fn(lambda t, q, n: t if not ("bad" in q and n == 1) else 1 / 0, name="check")

    def step(transcript, steps):  # noqa: ANN001, ANN202  (fails for "bad" at its second iteration)
        return check(transcript + llm(question + "|" + transcript) + "\n", question, steps), inc(steps)

    final = outlines.while_loop(lambda t, s: more(s, question), step, init=("", 0), max_iter=8)
    texts, steps = outlines.eval(*final, givens={"question": ["q3", "q3bad", "q2"]}, cache=False, errors="return")
    assert isinstance(texts[1], outlines.Failure) and texts[1].error_type == "ZeroDivisionError"
    assert list(steps) == [3, 2, 2]  # the failing element's counter is from its last iteration
    assert texts[0] == python_agent("q3", 8)[0] and texts[2] == python_agent("q2", 8)[0]
    assert sizes(recording) == [3, 3, 1]


def test_an_element_whose_input_failed_never_enters_the_loop() -> None:
    recording = recording_backend()
    llm = recording.model()
    question = outlines.string("question")
    parsed = outlines.fn(lambda q: q if "bad" not in q else int(q), name="parse")(question)
    lines = outlines.fn(lambda t: t.count("\n"), name="lines")
    final = outlines.while_loop(lambda t: more(lines(t), parsed), lambda t: t + llm(parsed + t) + "\n",
                                init="", max_iter=5)
    out = final.eval({"question": ["q1", "bad q1"]}, cache=False, errors="return")
    assert out[0] == reply("q1") + "\n"
    assert isinstance(out[1], outlines.Failure) and out[1].root.error_type == "ValueError"
    assert sizes(recording) == [1]


def test_cond_sends_each_branch_only_its_elements_in_one_schedule() -> None:
    maths, chat = recording_backend("m", name="solver"), recording_backend("c", name="chatter")
    solver, chatter = maths.model(), chat.model()
    question = outlines.string("question")
    is_math = outlines.fn(lambda q: any(c.isdigit() for c in q), name="is_math")
    answer = outlines.cond(is_math(question), lambda q: solver(q), lambda q: chatter("chat: " + q), question)
    questions = ["2+2", "hello", "3*7", "bye", "hi"]
    out = answer.eval({"question": questions}, cache=False)
    assert maths.batches == [["2+2", "3*7"]]
    assert chat.batches == [["chat: hello", "chat: bye", "chat: hi"]]
    assert list(out) == [reply("2+2", "m"), reply("chat: hello", "c"), reply("3*7", "m"), reply("chat: bye", "c"),
                         reply("chat: hi", "c")]
    shared = recording_backend(name="shared")
    llm = shared.model()
    both = outlines.cond(is_math(question), lambda q: llm("solve " + q), lambda q: llm("answer " + q), question)
    both.eval({"question": questions}, cache=False)
    assert sizes(shared) == [5]  # both branches' draws in one backend call


def test_where_evaluates_both_and_selects() -> None:
    q = outlines.string("q")
    is_long = outlines.fn(lambda s: len(s) > 2, name="is_long")
    assert list(outlines.where(is_long(q), q + "!", "short").eval({"q": ["ab", "abc"]})) == ["short", "abc!"]


def test_a_loop_does_not_stall_independent_work() -> None:
    state: dict[str, Any] = {}

    async def independent(text: str) -> str:
        state["event"].set()
        return text

    async def waits(text: str) -> str:  # the body's first iteration waits for the other branch
        await asyncio.wait_for(state["event"].wait(), timeout=10)
        return text + "x"

    async def main() -> Any:
        state["event"] = asyncio.Event()
        q = outlines.string("q")
        short = outlines.fn(lambda s: len(s) < 3, name="short")
        loop = outlines.while_loop(short, outlines.fn(waits), init=q, max_iter=5)
        slow_side = outlines.fn(independent)(outlines.fn(waits)(q) + "y")  # not ready before the loop starts
        return await outlines.aeval(loop, slow_side, outlines.fn(independent)(q), givens={"q": "a"}, cache=False)

    loop, _, _ = asyncio.run(main())
    assert loop == "axx"


def test_traces_hold_one_record_per_iteration_and_explain_shows_the_loop() -> None:
    recording = recording_backend()
    transcript, steps = agent(recording.model())
    questions = {"question": ["q2", "q3", "q1"]}
    with outlines.trace() as trace:
        outlines.eval(transcript, steps, givens=questions, cache=False)
    records = [r for r in trace.iterations if r.loop == transcript.owner.label]
    assert [(r.iteration, r.active, r.batches) for r in records] == [(1, 3, 1), (2, 2, 1), (3, 1, 1)]
    assert len(trace.batches) == 3 and "iterations" in trace.to_dict()
    assert "while_loop" in trace.summary()
    plan = outlines.explain(transcript, steps, givens=questions, cache=False)
    assert plan.nodes_by_kind.get("control") == 1
    text = plan.summary()
    assert transcript.owner.label in text and "max_iter=8" in text and "Generate[recording:rec]" in text
    assert not plan.exact and "prediction: an estimate" in text  # the body's calls are not counted


def test_compile_chain_and_elemwise_compose_with_loops() -> None:
    recording = recording_backend()
    llm = recording.model()

    @outlines.chain
    def solve(question, prefix):  # noqa: ANN001, ANN202
        lines = outlines.fn(lambda t: t.count("\n"), name="lines")
        return outlines.while_loop(lambda t: more(lines(t), question), lambda t: t + llm(prefix + question) + "\n",
                                   init="", max_iter=4)

    out = solve(["q1", "q2", "q3"], ["a:", "b:", "c:"])
    assert [t.count("\n") for t in out] == [1, 2, 3]
    assert sizes(recording) == [3, 2, 1]
    assert recording.batches[1:] == [["b:q2", "c:q3"], ["c:q3"]]  # the same prompt each iteration: new draws

    @outlines.elemwise
    async def shout(text: str, mark: str = "!") -> str:
        await asyncio.sleep(0)
        return text.upper() + mark

    assert list(shout(["a", "b"], mark="?")) == ["A?", "B?"]
    assert shout("a") == "A!"
    assert isinstance(shout(outlines.string("t")), outlines.Variable)


def test_a_loop_nested_in_a_loop_draws_anew_at_each_outer_iteration() -> None:
    counter = iter(range(1000))
    llm = models.from_function(lambda p: f"{next(counter)}", name="counter_model", version="1")
    few = outlines.fn(lambda s: s.count(",") < 2, name="few")
    rounds = outlines.fn(lambda s: s.count("|") < 2, name="rounds")
    inner = lambda: outlines.while_loop(few, lambda s: s + llm("same") + ",", init="", max_iter=3)  # noqa: E731
    out = outlines.while_loop(rounds, lambda s: s + inner() + "|", init="", max_iter=3).eval(cache=False)
    draws = out.replace("|", ",").split(",")
    assert len([d for d in draws if d]) == 4 and len(set(d for d in draws if d)) == 4


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    needs=st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=12),
    max_iter=st.integers(min_value=1, max_value=6),
)
def test_a_loop_equals_the_program_unrolled_in_python(needs: list[int], max_iter: int) -> None:
    recording = recording_backend(delay=0)
    transcript, steps = agent(recording.model(), max_iter=max_iter)
    questions = [f"q{n}-{i}" for i, n in enumerate(needs)]
    texts, counts = outlines.eval(transcript, steps, givens={"question": questions}, cache=False)
    assert list(zip(texts, counts)) == [python_agent(q, max_iter) for q in questions]
    expected = [sum(1 for n in needs if n > i) for i in range(max_iter)]
    assert sizes(recording) == [s for s in expected if s]


def shout_all(prompts: list[str]) -> list[str]:
    return [reply(p) for p in prompts]


def test_loops_run_their_iterations_on_a_dask_executor() -> None:
    distributed = pytest.importorskip("distributed")
    llm = models.from_function(shout_all, batched=True, name="shout_all")
    transcript, steps = agent(llm)
    questions = ["q2", "q1", "q3"]
    with distributed.Client(n_workers=1, processes=False, threads_per_worker=1, dashboard_address=":0") as client:
        with outlines.trace() as trace:
            texts, counts = outlines.eval(transcript, steps, givens={"question": questions}, cache=False,
                                          executor=client)
    assert [tuple(x) for x in zip(texts, counts)] == [python_agent(q, 8) for q in questions]
    assert [b.size for b in trace.batches] == [3, 2, 1]
    assert all(b.worker for b in trace.batches)  # each iteration's batch ran on a worker


def test_a_body_value_of_the_wrong_shape_fails_naming_the_loop_and_iteration() -> None:
    pair = outlines.fn(lambda s: [s + "a", s + "b"], signature="()->(n)", name="pair")
    first = outlines.fn(lambda xs: xs[0], signature="(n)->()", name="first")
    short = outlines.fn(lambda s: len(s) < 2, name="short")
    ok = outlines.while_loop(short, lambda s: first(pair(s)), init=["", "x"], max_iter=3)
    assert list(ok.eval(cache=False)) == ["aa", "xa"]
    bad = outlines.while_loop(short, lambda s: pair(s), init=["", "x"], max_iter=3)
    with pytest.raises(outlines.NodeError, match=r"while_loop#\d+: body output 0 has shape \(2, 2\) for 2 active"):
        bad.eval(cache=False)


def test_cond_with_errors_return_keeps_what_succeeded() -> None:
    q = outlines.string("q")
    above = outlines.fn(lambda s: int(s) > 2, name="above")
    boom = outlines.fn(lambda s: s if s != "1" else 1 / 0, name="boom")
    out = outlines.cond(above(q), lambda s: s + "!", boom, q).eval({"q": ["5", "x", "1", "0"]}, errors="return")
    assert out[0] == "5!" and out[3] == "0"
    assert out[1].error_type == "UpstreamFailure" and out[1].root.error_type == "ValueError"  # its pred failed
    assert out[2].error_type == "ZeroDivisionError"  # its branch failed; the other elements did not care


class _InFlight(RecordingBackend):
    """One prompt per batch; counts the batches in flight at once."""

    def __init__(self) -> None:
        super().__init__(reply, name="in_flight", delay=0.01, max_batch=1)
        self.now = self.peak = 0

    async def generate(self, draws: Any, report: Any) -> list[str]:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await super().generate(draws, report)
        finally:
            self.now -= 1


@pytest.mark.parametrize("limit", [None, 2])
def test_max_concurrency_bounds_calls_inside_and_outside_a_loop_together(limit: int | None) -> None:
    backend = _InFlight()
    transcript, _ = agent(backend.model())
    aside = backend.model()(outlines.string("question") + " aside")  # outer calls, running beside the loop
    outlines.eval(transcript, aside, givens={"question": ["q2", "q3", "q1", "q2b"]}, cache=False,
                  max_concurrency=limit)
    assert len(backend.batches) == 4 + 4 + 3 + 1
    assert backend.peak == 2 if limit else backend.peak >= 4  # one bound for the loop's schedules and the outer one


def test_two_loops_making_the_same_calls_draw_apart_and_the_first_alone_replays(tmp_path: Any) -> None:
    counter = iter(range(1000))

    def dice(prompts: list[str]) -> list[str]:
        return [f"{p}={next(counter)}" for p in prompts]

    llm = models.from_function(dice, batched=True, name="dice2", version="1")
    cache = Cache(tmp_path)
    question = outlines.string("question")
    count = outlines.fn(lambda rolls: rolls.count(";") < 2, name="count")
    first = outlines.while_loop(count, lambda rolls: rolls + llm(question) + ";", init="", max_iter=5)
    second = outlines.while_loop(count, lambda rolls: rolls + llm(question) + ";", init="", max_iter=5)
    one, two = outlines.eval(first, second, givens={"question": "a"}, cache=cache)
    assert one != two  # two loops are two calls: independent draws, as two calls outside loops are
    drawn = next(counter)
    assert first.eval({"question": "a"}, cache=cache) == one  # alone, the first loop replays its draws
    assert next(counter) == drawn + 1  # nothing sent
