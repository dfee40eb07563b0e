"""``outlines.cascade``: the cheap model first, the next one only for the elements it rejects.

Two recording fakes, ``small`` and ``strong``, answer from the prompt: an
"easy" question gets the same answer on every draw from the small model (so
the default rule, all samples equal, accepts it), a "hard" one gets a new
answer per draw (rejected). Each backend records its batches, so every test
counts what each stage sent.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

import outlines
from outlines.cache import Cache
from outlines.common.errors import BudgetExceeded, Failure, NodeError
from outlines.runtime.jobs import Jobs
from outlines.voting import Route, Votes, cascade, stop_when_ahead, unanimous
from tests.fixtures.recording import RecordingBackend

QUESTIONS = ["easy 1", "hard 2", "easy 3", "hard 4", "easy 5", "hard 6"]
HARD = [q for q in QUESTIONS if q.startswith("hard")]


def small_reply() -> Any:
    """Easy questions: their number on every draw; hard ones: a new number per draw (draws never agree)."""
    counter = itertools.count(100)

    def reply(prompt: str) -> str:
        if "boom" in prompt:
            raise RuntimeError("small down")
        if prompt.startswith("easy"):
            return prompt.split()[-1]
        if prompt.startswith("blank"):
            return "no number here"
        return str(next(counter))

    return reply


def strong_reply(prompt: str) -> str:
    if "bang" in prompt:
        raise RuntimeError("strong down")
    return str(10 * int(prompt.split()[-1]))


def backends(**options: Any) -> tuple[RecordingBackend, RecordingBackend]:
    return (RecordingBackend(small_reply(), name="small", **options),
            RecordingBackend(strong_reply, name="strong", **options))


def run(questions: list[str] = QUESTIONS, **options: Any) -> tuple[list[Any], RecordingBackend, RecordingBackend]:
    small, strong = backends(max_batch=options.pop("max_batch", None))
    kwargs = {k: options.pop(k) for k in ("samples", "accept", "max_samples") if k in options}
    result = cascade(questions, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int, **kwargs)
    values = outlines.eval(result.answer, result.stage, result.samples, result.route, **{"cache": False, **options})
    return [list(v) for v in values], small, strong


def test_each_stage_is_one_batch_over_the_elements_that_reached_it() -> None:
    (answers, stages, samples, routes), small, strong = run()
    assert answers == [1, 20, 3, 40, 5, 60]
    assert stages == [0, 1, 0, 1, 0, 1]
    assert samples == [3, 6, 3, 6, 3, 6]
    assert len(small.batches) == 1 and sorted(small.batches[0]) == sorted(QUESTIONS * 3)
    assert len(strong.batches) == 1 and sorted(strong.batches[0]) == sorted(HARD * 3)  # only the rejected
    assert [r.kept for r in routes] == ["accepted", "accepted", "accepted", "accepted", "accepted", "accepted"]
    assert isinstance(routes[1], Route) and [len(r.stages) for r in routes] == [1, 2, 1, 2, 1, 2]
    assert dict(routes[0].stages[0]) == {1: 3} and routes[0].stages[0].decided
    assert not routes[1].stages[0].decided and routes[1].escalations == 1


def test_the_trace_counts_each_stage() -> None:
    with outlines.trace() as trace:
        run()
    first, second = trace.cascades()
    assert first == {"stage": 0, "model": "recording:small", "backend": first["backend"], "reached": 6, "accepted": 3, "escalated": 3,
                     "answered": 0, "kept: budget": 0, "failed": 0}
    assert (second["stage"], second["reached"], second["accepted"], second["escalated"]) == (1, 3, 3, 0)
    assert "cascade stage 0 (recording:small): reached 6, accepted 3, escalated 3" in trace.summary()
    assert trace.to_dict()["cascades"] == [first, second]


def test_accepted_says_which_answers_a_stage_accepted_rather_than_the_last_model_gave() -> None:
    small, strong = backends()
    scattered = itertools.count(1)
    last = RecordingBackend(lambda p: str(next(scattered)), name="last")
    result = cascade(["easy 1", "hard 2"], [small.model(), last.model()], parse=int)
    accepted, routes = outlines.eval(result.accepted, result.route, cache=False)
    assert accepted.tolist() == [True, False] and routes[1].kept == "last" and routes[1].answer == 1


def test_nothing_reaches_a_later_model_when_the_first_accepts_everything() -> None:
    (answers, stages, _, _), small, strong = run(["easy 7", "easy 8"])
    assert answers == [7, 8] and stages == [0, 0]
    assert strong.batches == []


def test_three_stages_send_each_only_what_the_one_before_rejected() -> None:
    small = RecordingBackend(small_reply(), name="small")
    scattered = itertools.count(500)
    middle = RecordingBackend(lambda p: "7" if p == "hard 2" else str(next(scattered)), name="middle")
    strong = RecordingBackend(strong_reply, name="strong")
    result = cascade(QUESTIONS, [small.model(), middle.model(), strong.model()], parse=int, samples=2)
    answers, stages = outlines.eval(result.answer, result.stage, cache=False)
    assert answers.tolist() == [1, 7, 3, 40, 5, 60] and stages.tolist() == [0, 1, 0, 2, 0, 2]
    assert [len(b) for b in small.batches] == [12]
    assert [sorted(set(b)) for b in middle.batches] == [HARD] and [len(b) for b in middle.batches] == [6]
    assert [sorted(set(b)) for b in strong.batches] == [["hard 4", "hard 6"]]


def test_the_last_model_always_answers_and_a_stage_with_nothing_parsable_escalates() -> None:
    small = RecordingBackend(small_reply(), name="small")
    strong = RecordingBackend(lambda p: "12" if p.startswith("blank") else str(next(counter)), name="strong")
    counter = itertools.count(1)
    result = cascade(["blank 1", "hard 2"], [small.model(), strong.model()], parse=int)
    answers, routes = outlines.eval(result.answer, result.route, cache=False)
    assert answers.tolist() == [12, 1]  # hard 2: the strong model's draws 1, 2, 3 disagree; its first seen answers
    assert [r.kept for r in routes] == ["accepted", "last"]
    assert dict(routes[0].stages[0]) == {} and routes[0].stages[0].samples == 3  # no sample parsed: escalated


def test_samples_may_differ_per_stage() -> None:
    (answers, _, samples, _), small, strong = run(samples=(2, 5))
    assert answers == [1, 20, 3, 40, 5, 60] and samples == [2, 7, 2, 7, 2, 7]
    assert [len(b) for b in small.batches] == [12] and [len(b) for b in strong.batches] == [15]


def test_a_rerun_replays_every_stage_from_the_cache(tmp_path: Path) -> None:
    first, small, strong = run(cache=Cache(tmp_path))
    assert len(small.batches) == 1 and len(strong.batches) == 1
    with outlines.trace() as trace:
        again, small, strong = run(cache=Cache(tmp_path))  # fresh fakes: what they were sent is recorded
    assert small.batches == [] and strong.batches == []
    assert trace.cache_misses == 0 and trace.cache_hits == 6 * 3 + 3 * 3
    assert again[:3] == first[:3]


def test_a_run_that_failed_at_the_second_stage_resumes_there(tmp_path: Path) -> None:
    small, strong = backends()
    state = {"fail": True}

    def flaky(prompt: str) -> str:
        if state["fail"]:
            raise RuntimeError("strong down")
        return strong_reply(prompt)

    strong = RecordingBackend(flaky, name="strong")
    result = cascade(QUESTIONS, [small.model(), strong.model()], parse=int)
    with pytest.raises(NodeError, match="strong down"):
        outlines.eval(result.answer, cache=Cache(tmp_path))
    state["fail"] = False
    small.batches.clear()
    strong.batches.clear()
    assert outlines.eval(result.answer, cache=Cache(tmp_path)).tolist() == [1, 20, 3, 40, 5, 60]
    assert small.batches == [] and [sorted(set(b)) for b in strong.batches] == [HARD]


# -- failures -------------------------------------------------------------------------------------------------------
def test_a_failing_stage_escalates_and_only_the_last_stage_failure_is_the_element_s() -> None:
    # max_batch=3: one batch per prompt, so a failing prompt fails alone
    questions = ["easy 1", "hard boom 2", "hard boom bang 3"]
    for errors in ("return", "raise"):
        small, strong = backends(max_batch=3)
        result = cascade(questions, [small.model(), strong.model()], parse=int)
        if errors == "raise":
            with pytest.raises(NodeError, match=r"Generate\[recording:strong\].*RuntimeError: strong down") as caught:
                outlines.eval(result.answer, cache=False)
            assert isinstance(caught.value.cause, RuntimeError)
            continue
        answers, routes = outlines.eval(result.answer, result.route, cache=False, errors="return")
        assert answers[0] == 1 and answers[1] == 20  # small failed on "boom": the strong model answered
        failure = answers[2]
        assert isinstance(failure, Failure) and failure.message == "strong down"
        assert failure.node.startswith("Generate[recording:strong]")  # the last stage's failure, not the small one's
        assert routes[1].kept == "accepted" and isinstance(routes[1].stages[0], Failure)
        assert routes[2].kept == "failed" and routes[2].failure == failure and routes[2].stage is None
        assert [sorted(set(b)) for b in strong.batches] == [["hard boom 2"], ["hard boom bang 3"]]


def test_under_errors_raise_a_failing_first_stage_still_escalates() -> None:
    small, strong = backends(max_batch=3)
    result = cascade(["easy 1", "hard boom 2"], [small.model(), strong.model()], parse=int)
    assert outlines.eval(result.answer, cache=False).tolist() == [1, 20]


def test_a_bug_in_parse_fails_that_element_only() -> None:
    small, strong = backends()
    parse = lambda text: 1 / 0 if text == "3" else int(text)  # noqa: E731 - a bug, not "unparsable"
    result = cascade(["easy 1", "easy 3"], [small.model(), strong.model()], parse=parse)
    answers = outlines.eval(result.answer, cache=False, errors="return")
    assert answers[0] == 1 and isinstance(answers[1], Failure)
    assert answers[1].root.error_type == "ZeroDivisionError"
    with pytest.raises(NodeError, match="ZeroDivisionError"):
        outlines.eval(result.answer, cache=False)


# -- budgets --------------------------------------------------------------------------------------------------------
PRICES = {"small": (1, 1), "strong": (100, 100)}


def test_an_escalation_the_budget_cannot_pay_keeps_the_earlier_answer_and_never_raises() -> None:
    small, strong = backends()
    result = cascade(QUESTIONS, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int)
    # stage 1: 18 draws of ~2 prompt tokens + 4 completion tokens at 1 per million: ~1e-4; stage 2 needs 100x that
    budget = outlines.Budget(cost=0.0005, prices=PRICES)
    with outlines.trace() as trace:
        answers, routes = outlines.eval(result.answer, result.route, cache=False, budget=budget)
    assert strong.batches == [] and len(small.batches) == 1
    assert answers.tolist() == [1, 100, 3, 103, 5, 106]  # the small model's first seen answer of each hard one
    assert [r.kept for r in routes] == ["accepted", "budget"] * 3
    assert all(r.stage == 0 and isinstance(r.stages[1], Failure) for r in routes[1::2])
    assert routes[1].stages[1].error_type == "BudgetExceeded"
    first, second = trace.cascades()
    assert (first["reached"], first["accepted"], first["escalated"]) == (6, 3, 3)
    assert (second["reached"], second["kept: budget"], second["answered"]) == (3, 3, 0)
    assert "cascade stage 1 (recording:strong): reached 3, kept: budget 3" in trace.summary()


def test_a_budget_that_pays_stage_two_pays_it_whole() -> None:
    small, strong = backends()
    result = cascade(QUESTIONS, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int)
    answers = outlines.eval(result.answer, cache=False, budget=outlines.Budget(cost=1.0, prices=PRICES))
    assert answers.tolist() == [1, 20, 3, 40, 5, 60] and len(strong.batches) == 1


def test_a_first_stage_the_budget_refuses_raises_budget_exceeded() -> None:
    small, strong = backends()
    result = cascade(QUESTIONS, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int)
    budget = outlines.Budget(cost=1e-9, prices=PRICES)
    with pytest.raises(BudgetExceeded, match="budget exhausted"):
        outlines.eval(result.answer, cache=False, budget=budget)
    answers = outlines.eval(result.answer, cache=False, budget=budget, errors="return")
    assert all(isinstance(a, Failure) and a.error_type == "BudgetExceeded" for a in answers)
    assert small.batches == [] and strong.batches == []


# -- accept: rules, checks, verifiers -------------------------------------------------------------------------------
def test_a_python_check_decides_per_element() -> None:
    seen: list[Votes] = []

    def at_least_100(votes: Votes) -> bool:
        seen.append(votes)
        return votes.leader is not None and votes.leader >= 100

    (answers, stages, _, _), _, strong = run(accept=at_least_100)
    assert stages == [1, 0, 1, 0, 1, 0]  # easy answers (1, 3, 5) are rejected, hard ones (>= 100) accepted
    assert answers == [10, 100, 30, 103, 50, 106]
    assert len(seen) == 6 + 3 and all(isinstance(v, Votes) and v.samples == 3 for v in seen)
    assert sorted(set(strong.batches[0])) == ["easy 1", "easy 3", "easy 5"]


def test_a_stopping_rule_with_max_samples_votes_within_a_stage() -> None:
    # ahead by 2 with samples of 2, up to 6: easy ones decide after 2 draws; hard ones never lead, so they go on
    (answers, stages, samples, routes), small, strong = run(accept=stop_when_ahead(2, give_up=0), samples=2,
                                                             max_samples=(6, None))
    assert answers == [1, 20, 3, 40, 5, 60] and stages == [0, 1, 0, 1, 0, 1]
    assert samples == [2, 6 + 2, 2, 6 + 2, 2, 6 + 2]
    assert [len(b) for b in small.batches] == [12, 6, 6]  # a vote: iterations shrink to the undecided
    assert [sorted(set(b)) for b in strong.batches] == [HARD]
    assert routes[0].stages[0].decided and not routes[1].stages[0].decided


def test_confident_rule_gives_up_early_and_escalates() -> None:
    (answers, stages, samples, _), small, _ = run(accept=outlines.stop_when_confident(0.9), samples=2, max_samples=8)
    assert answers == [1, 20, 3, 40, 5, 60] and stages == [0, 1, 0, 1, 0, 1]
    assert samples[0] == 4  # 4 votes of 4 agree: 0.97 > 0.9
    assert samples[1] < 8 + 8  # hard: 1-1 after 2 draws, out of reach: it gives up and goes on


def test_a_verifier_model_accepts_and_is_asked_only_about_the_stage_s_answers() -> None:
    checker = RecordingBackend(lambda p: "yes" if "answer 1?" in p or "answer 3?" in p else "no", name="checker")

    def verify(prompt: outlines.Variable, answer: outlines.Variable) -> outlines.Variable:
        asked = "Is " + prompt + " answer " + outlines.fn(str)(answer) + "?"
        return outlines.fn(lambda text: text == "yes")(checker.model()(asked))

    (answers, stages, _, _), small, strong = run(accept=verify, samples=1)
    assert stages == [0, 1, 0, 1, 1, 1]  # easy 5's answer (5) is not verified
    assert answers == [1, 20, 3, 40, 50, 60]
    assert [len(b) for b in checker.batches] == [6]  # one batched check of every answer of the stage
    assert sorted(set(strong.batches[0])) == ["easy 5", *HARD]


def test_a_verifier_that_fails_rejects() -> None:
    checker = RecordingBackend(lambda p: "yes", name="checker", fail_on="easy 3", max_batch=1)

    def verify(prompt: outlines.Variable, answer: outlines.Variable) -> outlines.Variable:
        return outlines.fn(lambda text: text == "yes")(checker.model()(prompt))

    (_, stages, _, _), _, _ = run(["easy 1", "easy 3"], accept=verify, samples=1, max_batch=1)
    assert stages == [0, 1]


@pytest.mark.parametrize("kwargs, message", [
    ({"models": []}, "models must be a non-empty list"),
    ({"samples": 0}, r"samples must be an integer >= 1"),
    ({"samples": (1, 2, 3)}, r"samples has 3 value\(s\) for 2 model\(s\)"),
    ({"samples": 3, "max_samples": 4}, "max_samples=4 is not a multiple of it"),
    ({"accept": 0.9}, "accept must be a function"),
    ({"accept": lambda prompt, answer: prompt, "max_samples": 6}, "a verifier accept"),
])
def test_bad_arguments_fail_when_the_cascade_is_built(kwargs: dict[str, Any], message: str) -> None:
    small, strong = backends()
    models = kwargs.pop("models", [small.model(), strong.model()])
    with pytest.raises(outlines.GraphBuildError, match=message):
        cascade("q 1", models, **kwargs)


# -- shapes, compile, jobs ------------------------------------------------------------------------------------------
def test_scalar_and_2d_prompts_keep_their_shape() -> None:
    small, strong = backends()
    result = cascade("hard 7", [small.model(), strong.model()], parse=int)
    assert outlines.eval(result.answer, cache=False) == 70
    grid = np.array([["easy 1", "hard 2"], ["hard 3", "easy 4"]], dtype=object)
    result = cascade(grid, [small.model(), strong.model()], parse=int)
    assert outlines.eval(result.answer, cache=False).tolist() == [[1, 20], [30, 4]]


def test_cascade_composes_with_compile() -> None:
    small, strong = backends()
    program = outlines.compile(lambda question: cascade(question, [small.model(), strong.model()], parse=int).answer)
    assert program(QUESTIONS).tolist() == [1, 20, 3, 40, 5, 60]


def test_unanimous_needs_every_sample_parsed_and_equal() -> None:
    assert unanimous(Votes().added([4, 4]))
    assert not unanimous(Votes().added([4, 5])) and not unanimous(Votes().added([4, None])) and not unanimous(Votes())


@pytest.fixture
def provider() -> Iterator[Any]:
    from tests.fixtures.fake_batches import FakeBatches, FakeClock

    def reply(prompt: str, sample: int, body: Any) -> str:
        if body.get("model") == "small-model":
            return prompt.split()[-1] if prompt.startswith("easy") else str(100 + sample)
        return str(10 * int(prompt.split()[-1]))

    clock = FakeClock()
    with FakeBatches(clock=clock, reply=reply) as fake:
        yield fake, clock


def test_in_jobs_mode_each_stage_is_one_round_of_one_job(provider: Any, tmp_path: Path) -> None:
    from outlines.backends.jobs import Backoff

    server, clock = provider
    small = outlines.models.openai("small-model", base_url=server.base_url, api_key="sk-x", max_tokens=4)
    strong = outlines.models.openai("strong-model", base_url=server.base_url, api_key="sk-x", max_tokens=4)
    result = cascade(QUESTIONS, [small, strong], parse=int)
    jobs = Jobs(clock=clock, backoff=Backoff(first=1.0, cap=5.0))
    answers = outlines.eval(result.answer, jobs=jobs, cache=Cache(tmp_path))
    assert answers.tolist() == [1, 20, 3, 40, 5, 60]
    assert server.count == 0  # nothing went live
    made = sorted(server.jobs.values(), key=lambda job: job.id)
    assert len(made) == 2  # one round per stage
    assert {line.body["model"] for line in made[0].lines} == {"small-model"}
    assert {line.body["model"] for line in made[1].lines} == {"strong-model"}
    assert sorted(line.body["messages"][-1]["content"] for line in made[1].lines) == HARD  # only the rejected


def test_the_docstring_examples_hold() -> None:
    import doctest

    import outlines.voting

    failures, _ = doctest.testmod(outlines.voting, optionflags=doctest.ELLIPSIS)
    assert failures == 0


# -- calibration ----------------------------------------------------------------------------------------------------
def votes(*answers: Any) -> Votes:
    return Votes().added(answers)


#: Five labelled examples through both stages: the small model's agreement, and whether it and the strong one are right.
ROUTES = [
    Route((votes(1, 1, 1), votes(1))),  # sure and right
    Route((votes(2, 2, 2), votes(3))),  # sure and wrong; the strong model is right (3)
    Route((votes(4, 4, 9), votes(4))),  # 2/3 and right
    Route((votes(5, 6, 7), votes(8))),  # scattered and wrong; strong right (8)
    Route((votes(None, None, None), votes(9))),  # nothing parsed: escalates at any threshold
]
LABELS = [1, 3, 4, 8, 9]


def test_calibrate_replays_the_cascade_at_each_threshold() -> None:
    chosen = outlines.voting.calibrate(ROUTES, LABELS, costs=[1, 20], target_accuracy=0.8)
    assert [p.reached for p in chosen.curve] == [(1.0, 0.2), (1.0, 0.4), (1.0, 0.6), (1.0, 1.0)]
    assert [(p.threshold, p.accuracy, p.cost, p.escalated) for p in chosen.curve] == [
        (1 / 3, 0.6, 1 + 20 / 5, 0.2),  # everything with an answer accepted: 1, 2 (wrong), 4, 5 (wrong); 9 escalated
        (2 / 3, 0.8, 1 + 40 / 5, 0.4),  # 5 6 7 escalated too: right (8); 2 2 2 still wrong
        (1.0, 0.8, 1 + 60 / 5, 0.6),  # 4 4 9 escalated too: the strong model is right as well
        (float("inf"), 1.0, 21.0, 1.0),  # the strong model alone (after paying the small one)
    ]
    assert (chosen.threshold, chosen.accuracy, chosen.cost, chosen.unit) == (2 / 3, 0.8, 9.0, "cost")  # the cheaper
    assert chosen.accept(votes(3, 3, 4)) and not chosen.accept(votes(3, 4, 5))
    assert chosen.expected_cost(1000) == 9_000
    within = outlines.voting.calibrate(ROUTES, LABELS, costs=[1, 20], target_cost=10)
    assert within.threshold == 2 / 3 and within.accuracy == 0.8  # the most accurate within the cost
    assert outlines.voting.calibrate(ROUTES, LABELS, costs=[1, 20], target_cost=8).threshold == 1 / 3


def test_calibrate_refuses_an_unreachable_target_and_bad_arguments() -> None:
    calibrate = outlines.voting.calibrate
    with pytest.raises(ValueError, match=r"no threshold reaches a cost of 2.*cheapest costs 5 at 0.6"):
        calibrate(ROUTES, LABELS, costs=[1, 20], target_cost=2)
    with pytest.raises(ValueError, match="one of them"):
        calibrate(ROUTES, LABELS, costs=[1, 20])
    with pytest.raises(ValueError, match="one label per example"):
        calibrate(ROUTES, LABELS[:2], costs=[1, 20], target_accuracy=0.5)
    with pytest.raises(ValueError, match="every route must hold the 3 stage"):
        calibrate(ROUTES, LABELS, costs=[1, 2, 3], target_accuracy=0.5)


def test_calibrate_cascade_measures_on_the_models_and_its_rule_runs_from_the_cache(tmp_path: Path) -> None:
    def sometimes(prompt: str) -> str:  # agrees 3/3 on "easy", 2/3 on "fair", never on "hard"; right on easy only
        kind, number = prompt.split()
        draws = seen.setdefault(prompt, itertools.count())
        n = next(draws)
        if kind == "easy":
            return number
        if kind == "fair":
            return "0" if n < 2 else "1"
        return str(100 + n)

    seen: dict[str, Any] = {}
    small = RecordingBackend(sometimes, name="small", usage=True)
    strong = RecordingBackend(strong_reply, name="strong", usage=True)
    small.price, strong.price = (1, 1), (20, 20)  # per million tokens; each draw: 3 prompt + 1 completion token
    questions = ["easy 1", "fair 2", "hard 3", "easy 4"]
    labels = [1, 20, 30, 4]
    cache = Cache(tmp_path)
    calibration = outlines.calibrate_cascade(questions, labels, [small.model(), strong.model()], parse=int,
                                             target_accuracy=1.0, cache=cache)
    assert calibration.unit == "cost"
    assert [p.threshold for p in calibration.curve] == [1 / 3, 2 / 3, 1.0, float("inf")]
    assert calibration.threshold == 1.0 and calibration.accuracy == 1.0 and calibration.escalated == 0.5
    small_cost, strong_cost = 3 * 4e-6, 3 * 4 * 20e-6  # per example: 3 draws of 4 tokens
    assert calibration.cost == pytest.approx(small_cost + strong_cost / 2)
    small.batches.clear()
    strong.batches.clear()
    result = cascade(questions, [small.model(), strong.model()], parse=int, accept=calibration.accept)
    assert outlines.eval(result.answer, cache=cache).tolist() == [1, 20, 30, 4]
    assert small.batches == [] and strong.batches == []  # every draw was paid for by the calibration


def test_calibrate_cascade_counts_draws_where_a_model_has_no_price() -> None:
    small, strong = backends()
    calibration = outlines.calibrate_cascade(QUESTIONS, [1, 20, 3, 40, 5, 60], [small.model(), strong.model()],
                                             parse=int, target_accuracy=1.0, samples=(3, 1), cache=False)
    assert calibration.unit == "draws" and calibration.threshold == 1.0 and calibration.cost == 3 + 0.5


# -- explain --------------------------------------------------------------------------------------------------------
def test_explain_ranges_the_cost_from_all_accepted_at_stage_0_to_all_escalated() -> None:
    small, strong = backends()
    question = outlines.string("question")
    result = cascade(question, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int, samples=(3, 1))
    prices = {"small": (1, 1), "strong": (100, 100)}
    plan = outlines.explain(result.answer, givens={question: QUESTIONS}, cache=False, prices=prices)
    (estimate,) = plan.cascades
    assert estimate.elements == 6 and len(estimate.stages) == 2
    (first,), (second,) = (list(stage.values()) for stage in estimate.stages)
    assert (first.draws, second.draws) == (18, 6)  # every element at every stage: 3 draws, then 1
    low, high = estimate.cost
    assert low == first.cost and high == pytest.approx(first.cost + second.cost, abs=1e-6)
    assert high > 20 * low  # the strong model is 100x the price for a third of the draws
    half = outlines.voting.Calibration(1.0, 1.0, 0.0, 0.5, (), "cost", reached=(1.0, 0.5))
    assert estimate.expected_cost(half) == pytest.approx(first.cost + second.cost / 2, abs=1e-6)
    assert f"cost {low:.6g} (all accepted at stage 0) to {high:.6g} (all escalated)" in plan.summary()
    assert small.batches == [] and strong.batches == []  # a dry run
    budget = outlines.Budget(cost=high, prices=prices)  # what explain says the worst case costs is enough
    assert outlines.eval(result.answer, givens={question: QUESTIONS}, cache=False, budget=budget).tolist() == [
        1, 20, 3, 40, 5, 60]


def test_explain_ranges_a_voting_stage_from_one_iteration_to_max_samples() -> None:
    small, strong = backends()
    result = cascade(QUESTIONS, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int, samples=2,
                     max_samples=(6, None), accept=stop_when_ahead(2))
    (estimate,) = outlines.explain(result.answer, cache=False).cascades
    (loop,) = estimate.stage_loops[0]
    assert loop.max_iter == 3 and [loop.draws(name) for name in loop.iteration] == [(12, 36)]
    assert estimate.cost is None  # no prices: unknown, not zero


def test_pictures_draw_each_stage_with_its_model() -> None:
    small, strong = backends()
    result = cascade(QUESTIONS, [small.model(), strong.model()], parse=int)
    text = outlines.visualize(result.answer, format="ascii")
    assert "cascade stage 0  recording:small  failures caught" in text
    assert "cascade stage 1  recording:strong  failures caught" in text
    assert "cascade stage 0" in outlines.visualize(result.answer, format="mermaid")


def test_jobs_without_waiting_raise_jobs_running_once_per_stage_and_pay_each_draw_once(provider: Any,
                                                                                        tmp_path: Path) -> None:
    from outlines.backends.jobs import Backoff
    from outlines.common.errors import JobsRunning

    server, clock = provider
    small = outlines.models.openai("small-model", base_url=server.base_url, api_key="sk-x", max_tokens=4)
    strong = outlines.models.openai("strong-model", base_url=server.base_url, api_key="sk-x", max_tokens=4)
    result = cascade(QUESTIONS, [small, strong], parse=int)
    jobs = Jobs(clock=clock, wait=False, backoff=Backoff(first=1.0, cap=5.0))
    cache = Cache(tmp_path)
    for stage in range(2):  # each call collects the last stage's job and submits the next stage's
        with pytest.raises(JobsRunning):
            outlines.eval(result.answer, jobs=jobs, cache=cache)
        assert len(server.jobs) == stage + 1
        clock.advance(3600)  # the job finishes meanwhile
    assert outlines.eval(result.answer, jobs=jobs, cache=cache).tolist() == [1, 20, 3, 40, 5, 60]
    assert len(server.jobs) == 2 and set(server.paid().values()) == {1}


def test_a_stage_may_be_a_function_giving_one_text_per_element() -> None:
    small, strong = backends()

    def agent(prompt: outlines.Variable, num_samples: int) -> outlines.Variable:  # one final answer per element
        return strong.model()("think: " + prompt)

    result = cascade(QUESTIONS, [small.model(), agent], parse=lambda text: int(text.split()[-1]), samples=(3, 1))
    answers, routes = outlines.eval(result.answer, result.route, cache=False)
    assert answers.tolist() == [1, 20, 3, 40, 5, 60]
    assert [len(b) for b in strong.batches] == [3] and routes[1].stages[1].samples == 1
    scalar = cascade("hard 7", [small.model(), agent], parse=lambda text: int(text.split()[-1]), samples=(3, 1))
    assert scalar.answer.eval(cache=False) == 70


def test_a_budget_that_pays_part_of_a_stage_sends_what_fits_and_the_rest_keep_their_answer() -> None:
    small, strong = backends()
    result = cascade(QUESTIONS, [small.model(max_tokens=4), strong.model(max_tokens=4)], parse=int)
    (estimate,) = outlines.explain(result.answer, cache=False, prices=PRICES).cascades
    low, high = estimate.cost
    budget = outlines.Budget(cost=low + (high - low) / 4, prices=PRICES)  # stage 1 for 1.5 of its 6 elements
    answers, routes = outlines.eval(result.answer, result.route, cache=False, budget=budget)
    escalated = routes[1::2]
    sent = [len(b) for b in strong.batches]
    assert 0 < sum(sent) < 9  # some of the 9 draws of stage 1 went, not all
    answered = [r for r in escalated if r.stage == 1]
    kept = [r for r in escalated if r.kept == "budget"]
    assert answered and kept and len(answered) + len(kept) == 3
    assert all(r.answer == 10 * int(q.split()[-1]) for r, q in zip(escalated, HARD) if r.stage == 1)
    assert all(r.stage == 0 and r.answer >= 100 for r in kept)
