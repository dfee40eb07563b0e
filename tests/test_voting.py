"""``outlines.vote`` and its stopping rules, on scripted fakes.

The fakes answer each prompt from a script (``"q: 1 1 2 ..."``: the n-th
draw of that prompt answers the n-th word), so every test knows in advance
when each element must stop. The recording backend shows what each round
sent: one batch per round, holding only the undecided elements' draws.
"""
from __future__ import annotations

import itertools
import math
import pickle
import random
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.voting import (
    Votes,
    leader_probability,
    stop_when_ahead,
    stop_when_confident,
    stop_when_iteration_agrees,
    vote,
)
from tests.fixtures.recording import RecordingBackend


class Script:
    """Answers each prompt's draws in turn from the words after its colon."""

    def __init__(self) -> None:
        self.left: dict[str, list[str]] = {}

    def __call__(self, prompt: str) -> str:
        words = self.left.setdefault(prompt, prompt.split(":", 1)[1].split())
        return words.pop(0)


def scripted(fail_at_batch: int | None = None) -> RecordingBackend:
    """A recording backend on a fresh script; it fails its ``fail_at_batch``-th batch (1-based) once."""
    script = Script()
    state = {"fail": fail_at_batch}

    def reply(prompt: str) -> str:
        if state["fail"] is not None and len(backend.batches) == state["fail"]:
            state["fail"] = None
            raise RuntimeError("backend down")
        return script(prompt)

    backend = RecordingBackend(reply, name="scripted")
    return backend


def draws_per_batch(backend: RecordingBackend) -> list[int]:
    return [len(batch) for batch in backend.batches]


# -- the rules, as pure functions ------------------------------------------------------------
def _integrated(first: int, second: int, steps: int = 20_000) -> float:
    """The Beta(first + 1, second + 1) mass above 1/2, by the midpoint rule (what the paper integrates)."""
    density = [((i + 0.5) / steps) ** first * (1 - (i + 0.5) / steps) ** second for i in range(steps)]
    return sum(density[steps // 2 :]) / sum(density)


@pytest.mark.parametrize("first, second", [(0, 0), (1, 0), (4, 0), (3, 1), (5, 1), (6, 4), (10, 2), (20, 17)])
def test_leader_probability_is_the_beta_mass_above_one_half(first: int, second: int) -> None:
    assert leader_probability(first, second) == pytest.approx(_integrated(first, second), abs=1e-6)
    assert leader_probability(first, second) + leader_probability(second, first) == pytest.approx(1.0)


def test_leader_probability_exact_values_and_bad_counts() -> None:
    assert [leader_probability(n, 0) for n in range(5)] == [0.5, 0.75, 0.875, 0.9375, 0.96875]
    assert leader_probability(3, 3) == 0.5  # a tie is a coin flip
    assert 0 < leader_probability(400, 380) < 1  # large counts stay finite
    with pytest.raises(ValueError, match="votes must be >= 0"):
        leader_probability(-1, 0)


def votes_of(*rounds: str) -> Votes:
    votes = Votes()
    for answers in rounds:
        votes = votes.added(None if a == "?" else a for a in answers.split())
    return votes


def test_confident_stops_unanimous_answers_after_four_votes_at_the_default_threshold() -> None:
    confident = stop_when_confident()
    assert [confident(votes_of("7 " * n)) for n in range(1, 6)] == [False, False, False, True, True]
    assert not confident(Votes())  # nothing voted yet
    assert not confident(votes_of("1 2 1 2 1 2"))  # a tie never stops
    assert not confident(votes_of("1 1 1 1 1 2"))  # 5 vs 1: 0.9375
    assert confident(votes_of("1 1 1 1 1 1 2"))  # 6 vs 1: 0.965
    assert not stop_when_confident(0.99)(votes_of("1 1 1 1 1 1 2"))
    assert not confident(votes_of("? ? ? ? ? ?"))  # unparsable samples are no votes


def test_confident_reads_only_the_top_two_answers() -> None:
    # 6 vs 2 with a tail of singletons: the tail does not lower the confidence
    assert stop_when_confident(0.9)(votes_of("1 1 1 1 1 1 2 2 3 4 5 6")) == (leader_probability(6, 2) >= 0.9)
    assert leader_probability(6, 2) == pytest.approx(0.91015625)


@pytest.mark.parametrize("threshold", [0.4, 1.0, 1.5])
def test_confident_rejects_thresholds_outside_one_half_to_one(threshold: float) -> None:
    with pytest.raises(ValueError, match="threshold must be in"):
        stop_when_confident(threshold)


def test_round_agrees_looks_only_at_the_latest_round() -> None:
    agrees = stop_when_iteration_agrees()
    assert agrees(votes_of("1 2 3 4", "5 5 5 5"))  # ESC: the window agrees, whatever came before
    assert not agrees(votes_of("5 5 5 5", "5 5 5 6"))
    assert not agrees(votes_of("5 5 5 ?"))  # an unparsable sample breaks agreement
    assert not agrees(votes_of("? ? ? ?"))
    assert not agrees(Votes())
    assert agrees(votes_of("9"))  # a round of one always agrees: pick round as the window size


def test_ahead_needs_a_lead_of_margin_votes() -> None:
    ahead = stop_when_ahead(2)
    assert not ahead(votes_of("1 2 1 2"))
    assert ahead(votes_of("1 2 1 1"))
    assert ahead(votes_of("1 1"))
    assert not ahead(votes_of("1 ? ? ?"))
    with pytest.raises(ValueError, match="margin must be an integer >= 1"):
        stop_when_ahead(0)


def test_votes_count_parsed_answers_break_ties_by_first_seen_and_survive_pickling() -> None:
    votes = votes_of("8 3 ? 3", "8 ? ? ?")
    assert dict(votes) == {"8": 2, "3": 2} and votes.samples == 8 and votes.latest == ("8", None, None, None)
    assert votes.leader == "8"  # 8 and 3 tie; 8 came first
    assert votes_of("3 8 8 3").leader == "3"
    assert Votes().leader is None and votes_of("? ?").leader is None
    copy = votes.copy()
    copy["3"] += 5
    assert votes["3"] == 2 and copy.samples == 8  # a rule that writes to its copy changes nothing
    again = pickle.loads(pickle.dumps(votes))
    assert again == votes and again.samples == 8 and again.latest == votes.latest and isinstance(again, Votes)


# -- vote: the loop, on a recording fake --------------------------------------------------------
QUESTIONS = [
    "easy: " + "4 " * 16,
    "close: 4 5 4 5 " + "4 " * 12,
    "hard: 1 2 3 4 5 6 7 8 1 2 3 4 5 6 7 8",
]


def run(backend: RecordingBackend, questions: list[str] = QUESTIONS, **kwargs: Any) -> tuple[list[Any], ...]:
    kwargs.setdefault("parse", int)
    cache = kwargs.pop("cache", False)
    result = vote(backend.model(), questions, **kwargs)
    answers, samples, votes = outlines.eval(*result, cache=cache)
    return list(answers), list(samples), list(votes)


RULES: dict[str, tuple[Callable[..., Any] | None, list[int], list[int]]] = {
    # rule: (samples per question, draws per batch, one batch per round)
    "confident": (stop_when_confident(), [4, 12, 12], [12, 8, 8]),  # close: 10 vs 2 after round 3; hard gives up
    "confident, never gives up": (stop_when_confident(give_up=0), [4, 12, 16], [12, 8, 8, 4]),
    "iteration agrees": (stop_when_iteration_agrees(), [4, 8, 16], [12, 8, 4, 4]),  # close: iteration 2 is all 4s
    "ahead by 5": (stop_when_ahead(5), [8, 12, 12], [12, 12, 8]),  # easy: 8 - 0; close: 6 - 2, then 10 - 2; hard gives up
    "user rule": (lambda votes: votes.samples >= 8 and votes.leader == 4, [8, 8, 16], [12, 12, 4, 4]),
    "fixed (None)": (None, [16, 16, 16], [12, 12, 12, 12]),
}


@pytest.mark.parametrize("name", list(RULES))
def test_each_rule_stops_each_element_at_its_round_and_the_batches_shrink(name: str) -> None:
    rule, samples, batches = RULES[name]
    backend = scripted()
    answers, spent, votes = run(backend, stop=rule)
    assert spent == samples
    assert draws_per_batch(backend) == batches
    assert answers[:2] == [4, 4] and answers[2] == 1  # hard: every answer twice, 1 seen first
    assert [v.samples for v in votes] == samples


def test_every_round_sends_only_the_undecided_prompts() -> None:
    backend = scripted()
    run(backend)
    assert [sorted(set(batch)) for batch in backend.batches] == [sorted(QUESTIONS), QUESTIONS[1:], QUESTIONS[1:]]
    assert all(batch.count(prompt) == 4 for batch in backend.batches for prompt in batch)  # a round is 4 draws


def test_round_of_one_checks_the_rule_after_every_sample() -> None:
    backend = scripted()
    questions = ["a: 2 2 2 2", "b: 2 3 2 2 2 2 2 2"]
    answers, spent, _ = run(backend, questions, per_iteration=1, max_samples=8)
    assert answers == [2, 2] and spent == [4, 7]  # b: 6 vs 1 after 7 samples (0.965)
    assert draws_per_batch(backend) == [2, 2, 2, 2, 1, 1, 1]


def test_max_samples_caps_an_undecided_element() -> None:
    backend = scripted()
    answers, spent, _ = run(backend, per_iteration=4, max_samples=4)
    assert spent == [4, 4, 4] and answers == [4, 4, 1]
    assert draws_per_batch(backend) == [12]


def test_unparsable_samples_count_as_samples_but_not_as_votes() -> None:
    backend = scripted()
    questions = ["mixed: 6 x 6 6 6 y 6 z", "none: a b c d e f g h"]
    answers, spent, votes = run(backend, questions, max_samples=8)  # int() raises ValueError: unparsable
    assert answers == [6, None] and spent == [8, 4]  # mixed: 3 votes after round 1, 5 after round 2
    assert dict(votes[0]) == {6: 5} and dict(votes[1]) == {}
    assert votes[1].gave_up  # no vote in 4 samples: a 1% chance of 4 votes in the next 4
    none_backend = scripted()
    parsed = run(none_backend, questions, max_samples=8, parse=lambda t: t if t.isdigit() else None)
    assert parsed[0] == ["6", None] and parsed[1] == [8, 4]


def test_a_rerun_replays_every_round_from_the_cache_with_no_backend_call(tmp_path: Any) -> None:
    first_backend = scripted()
    first = run(first_backend, cache=Cache(tmp_path))
    assert draws_per_batch(first_backend) == [12, 8, 8]
    again_backend = scripted()  # a fresh script: had anything been sent, the answers would differ
    with outlines.trace() as trace:
        again = run(again_backend, cache=Cache(tmp_path))
    assert again_backend.batches == [] and trace.cache_misses == 0 and trace.cache_hits == 28
    assert again[:2] == first[:2] and [dict(v) for v in again[2]] == [dict(v) for v in first[2]]


def test_a_run_that_failed_at_round_three_resumes_at_round_three(tmp_path: Any) -> None:
    backend = scripted(fail_at_batch=3)
    with pytest.raises(outlines.NodeError, match=r"while_loop, iteration 3\).*backend down"):
        run(backend, cache=Cache(tmp_path))
    assert draws_per_batch(backend) == [12, 8, 8]
    backend.batches.clear()
    answers, spent, _ = run(backend, cache=Cache(tmp_path))
    assert draws_per_batch(backend) == [8]  # rounds 1 and 2 came from the cache
    assert spent == [4, 12, 12] and answers == [4, 4, 1]


def test_errors_return_a_failing_element_leaves_with_its_failure_and_the_others_finish() -> None:
    backend = scripted()
    parse = lambda text: int(text) if text != "boom" else 1 / 0  # noqa: E731 - a bug in the parser, not "unparsable"
    questions = ["ok: 3 3 3 3", "bad: 1 2 boom 4 5 6 7 8"]
    result = vote(backend.model(), questions, parse=parse, max_samples=8)
    answers, spent = outlines.eval(result.answer, result.samples, cache=False, errors="return")
    assert answers[0] == 3 and spent[0] == 4
    assert isinstance(answers[1], outlines.Failure) and answers[1].upstream.error_type == "ZeroDivisionError"


def test_an_answer_step_turns_each_reasoning_into_the_text_that_is_parsed() -> None:
    reasoner, answerer = scripted(), RecordingBackend(lambda p: p.split(".")[0], name="answerer")
    questions = ["q1: 7.1 7.2 7.3 7.4", "q2: 1.1 1.2 1.3 4.4 1.5 1.6 1.7 1.8"]  # distinct reasonings

    def final(reasoning: outlines.Variable) -> outlines.Variable:
        return answerer.model()(reasoning + " The answer is", regex=r"[0-9]+")

    answers, spent, _ = run(reasoner, questions, answer=final, max_samples=8)
    assert answers == [7, 1] and spent == [4, 8]
    assert draws_per_batch(answerer) == [8, 4]  # one answer per reasoning, only for the undecided


def test_vote_composes_with_compile_and_scalar_prompts() -> None:
    backend = scripted()
    program = outlines.compile(lambda question: vote(backend.model(), question, parse=int).answer)
    assert list(program(QUESTIONS[:2])) == [4, 4]
    assert vote(scripted().model(), "one: 9 9 9 9", parse=int).answer.eval(cache=False) == 9


def test_the_same_draws_serve_a_fixed_and_an_adaptive_vote(tmp_path: Any) -> None:
    backend = scripted()
    fixed = run(backend, stop=None, cache=Cache(tmp_path))
    sent = len(backend.batches)
    adaptive = run(backend, cache=Cache(tmp_path))  # a prefix of the fixed vote's draws: all cached
    assert len(backend.batches) == sent and adaptive[1] == [4, 12, 12] and fixed[1] == [16, 16, 16]


@pytest.mark.parametrize("kwargs, message", [
    ({"per_iteration": 0}, "per_iteration must be an integer >= 1"),
    ({"per_iteration": 3, "max_samples": 16}, r"max_samples=16 is not a multiple of per_iteration=3.*max_samples=18"),
    ({"max_samples": True}, "max_samples must be an integer >= 1"),
    ({"num_samples": 4}, "num_samples is set by per_iteration= and max_samples="),
    ({"stop": 0.95}, "stop must be a rule, votes -> bool, got float"),
])
def test_bad_arguments_fail_when_the_vote_is_built(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(outlines.GraphBuildError, match=message):
        vote(scripted().model(), "q: 1", **kwargs)


def test_round_is_a_deprecated_name_of_per_iteration() -> None:
    with pytest.warns(DeprecationWarning, match=r"vote\(round=...\) is deprecated.*use per_iteration="):
        old = run(scripted(), per_iteration=None, round=1, max_samples=8)
    assert old == run(scripted(), per_iteration=1, max_samples=8)
    with pytest.raises(TypeError, match="not both"):
        vote(scripted().model(), "q: 1", per_iteration=2, round=2)
    with pytest.warns(DeprecationWarning, match="use stop_when_iteration_agrees"):
        assert outlines.voting.stop_when_round_agrees().__name__ == "stop_when_iteration_agrees()"
    confident = stop_when_confident()
    votes = votes_of("1 1 1 2")
    with pytest.warns(DeprecationWarning, match="use per_iteration="):
        assert confident.chance(votes, 4, round=4) == confident.chance(votes, 4, 4)
    with pytest.warns(DeprecationWarning, match="use per_iteration="):
        assert confident.hopeless(votes, 4, round=4) == confident.hopeless(votes, 4, per_iteration=4)


def test_a_function_model_votes_the_same_way() -> None:
    script = Script()
    llm = models.from_function(lambda prompts: [script(p) for p in prompts], batched=True, name="script",
                               version="1")
    result = vote(llm, np.array(QUESTIONS, dtype=object), parse=int)
    assert list(result.samples.eval(cache=False)) == [4, 12, 12]
    assert math.isclose(leader_probability(10, 2), 0.98876953125)


def test_the_docstring_examples_hold() -> None:
    import doctest

    import outlines.voting

    failed, tried = doctest.testmod(outlines.voting)
    assert tried >= 6 and failed == 0


# -- giving up: the futility rule of the top-two rules -----------------------------------------
def _brute_force_chance(holds: Callable[[int, int], bool], first: int, second: int, rest: int, remaining: int,
                        round_: int) -> float:
    """The chance by enumerating every sequence of leader / runner-up / elsewhere draws (a Polya urn)."""
    total = 0.0
    for path in itertools.product(range(3), repeat=remaining):
        counts, probability, decided = [first, second, rest], 1.0, False
        for drawn, where in enumerate(path):
            probability *= (counts[where] + 1) / (sum(counts) + 3)
            counts[where] += 1
            decided = decided or ((drawn + 1) % round_ == 0 and holds(max(counts[:2]), min(counts[:2])))
        total += probability if decided else 0.0
    return total


@settings(max_examples=60, deadline=None)
@given(first=st.integers(0, 6), second=st.integers(0, 6), rest=st.integers(0, 4), rounds=st.integers(1, 3),
       round_=st.integers(1, 3), margin=st.integers(1, 4))
def test_the_chance_to_be_decided_is_the_polya_urn_probability(first: int, second: int, rest: int, rounds: int,
                                                               round_: int, margin: int) -> None:
    first, second = max(first, second), min(first, second)
    votes = Votes().added(["a"] * first + ["b"] * second + [None] * rest)
    remaining = rounds * round_
    for rule in (stop_when_confident(0.9), stop_when_ahead(margin)):
        expected = _brute_force_chance(rule.holds, first, second, rest, remaining, round_)
        assert rule.chance(votes, remaining, round_) == pytest.approx(expected, abs=1e-12)


def test_the_chance_is_zero_when_even_every_remaining_sample_to_the_leader_would_not_do() -> None:
    confident = stop_when_confident()
    assert confident.chance(votes_of("1 2 3 4"), 4, 4) == 0.0  # 5 vs 1 at best: 0.9375
    assert confident.chance(votes_of("1 1 2 2"), 4, 4) == 0.0  # a tie: 6 vs 2 at best
    assert confident.chance(votes_of("1 2 3 4"), 12, 4) > 0.1  # 12 more samples can still decide it
    assert confident.hopeless(votes_of("1 2 3 4"), 4, 4) and not confident.hopeless(votes_of("1 2 3 4"), 12, 4)
    assert confident.hopeless(votes_of("1 1 2 2"), 4, 2)  # certain two rounds ahead: 6 vs 2 at best (0.91)
    assert confident.chance(votes_of("1 1 2 3"), 4, 4) < 0.1 and confident.hopeless(votes_of("1 1 2 3"), 4, 4)
    # a small chance two rounds from the cap: the plurality may still firm up, so it samples on
    assert 0 < confident.chance(votes_of("1 1 2 2 3 3 4 4"), 8, 4) < 0.1
    assert not confident.hopeless(votes_of("1 1 2 2 3 3 4 4"), 8, 4)
    assert not confident.hopeless(votes_of("1 2 3 4"), 0, 4)  # nothing left: max_samples stops it, not give_up
    assert not stop_when_confident(give_up=0).hopeless(votes_of("1 2 3 4"), 4, 4)


@pytest.mark.parametrize("give_up", [-0.1, 1.0])
def test_give_up_must_be_a_probability_below_one(give_up: float) -> None:
    with pytest.raises(ValueError, match=r"give_up must be in \[0, 1\)"):
        stop_when_confident(give_up=give_up)
    with pytest.raises(ValueError, match=r"give_up must be in \[0, 1\)"):
        stop_when_ahead(2, give_up=give_up)


def scattering(values: int, seed: int = 0) -> models.Model:
    """A model whose samples scatter: each draw a uniform pick among ``values`` answers (seeded)."""
    rng = random.Random(seed)
    return models.from_function(lambda prompts: [str(rng.randrange(values)) for _ in prompts], batched=True,
                                name=f"scattering {values}", version=str(seed))


def test_a_scattering_model_gives_up_early_and_spends_no_more_than_a_majority_of_five() -> None:
    questions = [f"question {i}" for i in range(60)]
    result = vote(scattering(values=8), questions, per_iteration=4, max_samples=8)
    with outlines.trace() as trace:
        answers, spent, votes, decided = outlines.eval(*result, result.decided, cache=False)
    assert np.mean(spent) <= 5  # the issue: 116 samples on 15 questions, against 75 for a majority of 5
    assert all(v.gave_up and not v.decided for v in votes if v.samples == 4 and not v.decided)
    assert sum(v.gave_up for v in votes) >= 45
    assert list(answers) == [v.leader for v in votes]  # a plurality, the first seen among equals
    assert list(decided) == [v.decided for v in votes]
    at_cap = sum(v.samples == 8 and not v.decided for v in votes)
    assert all(not v.gave_up for v in votes if v.samples == 8)  # at max_samples: neither flag, counted by the loop
    assert sum(c["stopped"] for c in trace.loops_limited.values()) == at_cap
    never = vote(scattering(values=8), questions, per_iteration=4, max_samples=8, stop=stop_when_confident(give_up=0))
    assert np.mean(outlines.eval(never.samples, cache=False)) > 7  # what it spent before giving up existed


def test_an_agreeing_model_decides_as_before_for_fewer_or_as_many_samples() -> None:
    def mostly_right(prompts: list[str]) -> list[str]:  # right 85% of the time, else one of two distractors
        out = []
        for prompt in prompts:  # the n-th draw of a prompt answers the same in both votes: a paired comparison
            drawn[prompt] = drawn.get(prompt, 0) + 1
            rng = random.Random(f"{prompt}#{drawn[prompt]}")
            out.append("42" if rng.random() < 0.85 else rng.choice(["41", "24"]))
        return out

    outcomes = []
    for give_up in (0.1, 0.0):
        drawn: dict[str, int] = {}
        llm = models.from_function(mostly_right, batched=True, name="mostly right", version="1")
        result = vote(llm, [f"q{i}" for i in range(40)], stop=stop_when_confident(give_up=give_up))
        outcomes.append(outlines.eval(*result, cache=False))
    (answers, spent, votes), (answers_before, spent_before, _) = outcomes
    assert list(answers) == list(answers_before)
    assert sum(v.decided for v in votes) >= 36 and sum(v.gave_up for v in votes) <= 4
    assert all(s < b if v.gave_up else s == b for s, b, v in zip(spent, spent_before, votes))


def test_a_tie_that_cannot_be_broken_in_time_gives_up_with_the_first_seen_answer() -> None:
    backend = scripted()
    answers, spent, votes = run(backend, ["tie: 5 3 3 5 5 5 5 5", "lead: 5 5 5 3 5 5 5 5"], max_samples=8)
    assert answers == [5, 5] and spent == [4, 8]
    assert votes[0].gave_up and not votes[0].decided and repr(votes[0]) == "Votes({5: 2, 3: 2}, samples=4, gave up)"
    assert votes[1].decided and not votes[1].gave_up  # 3-1 had a 26% chance; 7-1 after round 2
    again = pickle.loads(pickle.dumps(votes[0]))
    assert again.gave_up and not again.decided and again.copy().gave_up


def test_other_rules_never_give_up() -> None:
    backend = scripted()
    _, spent, votes = run(backend, ["hard: 1 2 3 4 5 6 7 8"], max_samples=8, stop=stop_when_iteration_agrees())
    assert spent == [8] and not votes[0].gave_up and not votes[0].decided
