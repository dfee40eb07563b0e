"""Adaptive voting and cascades: sample answers until a stopping rule is met, or until a model is sure.

``vote`` builds ONE ``while_loop``: its state is each element's ``Votes`` (a
``Counter`` of the answers parsed so far); each iteration draws
``per_iteration`` samples for the elements still undecided, in one batched model call, and a stopping
rule (a plain function of the votes) decides who leaves. Everything the loop
gives (batches that shrink as elements decide, draws cached per iteration, a
re-run that replays with no calls, a failed run that resumes) comes from
``while_loop``. The rules are small pure functions: Adaptive-Consistency's
Beta posterior over the top two answers (``stop_when_confident``), ESC's
window rule (``stop_when_iteration_agrees``) and a lead of ``margin`` votes
(``stop_when_ahead``). The two rules of the top two counts (``TopTwoRule``)
also give up on an element whose decision is out of reach within
``max_samples`` (a futility rule on the predictive probability, computed
exactly): it stops with its plurality, flagged in its ``Votes``.

``cascade`` runs models cheapest first: one ``cond`` per stage, whose
branch draws, parses and judges (``accept``, by default ``unanimous``; a
stopping rule, a Python check or a verifier model) only the elements that
reached it, and records each element's ``Route``. The stage conds catch
failures (``Cond.catch``): a stage that fails, or that the budget refuses,
is a value the next step reads, so the element escalates or keeps its
earlier answer instead of failing the evaluation.
"""
from __future__ import annotations

import builtins
import collections
import inspect
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Optional

import numpy as np

from outlines.common.errors import BudgetExceeded, Failure, GraphBuildError, NodeError
from outlines.fn import fn
from outlines.graph.basic import Op, Variable, as_variable
from outlines.graph.control import _cond, while_loop
from outlines.graph.ops import broadcast_map
from outlines.graph.traits import Run, Traits

__all__ = [
    "Cascade",
    "Route",
    "Rule",
    "TopTwoRule",
    "Vote",
    "Votes",
    "Calibration",
    "CurvePoint",
    "agreement",
    "at_least",
    "calibrate",
    "calibrate_cascade",
    "cascade",
    "leader_probability",
    "stop_when_ahead",
    "stop_when_confident",
    "stop_when_iteration_agrees",
    "unanimous",
    "vote",
]


class Votes(collections.Counter[Any]):
    """The answers of one element so far: a ``Counter`` of the parsed answers.

    Unparsable samples are not counted as answers, but ``samples`` counts
    them. Ties in ``most_common`` (and so in ``leader``) go to the answer seen
    first, in draw order.

    Attributes
    ----------
    samples
        Samples drawn so far, unparsable ones included.
    latest
        The answers of the latest iteration, in draw order (``None`` where a
        sample did not parse).
    decided
        True once ``vote``'s stopping rule held: the leader is its decision.
    gave_up
        True when ``vote`` stopped the element early without a decision: its
        rule could not hold within ``max_samples``, or only by a small chance
        (see ``TopTwoRule``). Its ``leader`` is a plurality, not a decision; so is
        that of an element that ran to ``max_samples`` (neither flag set).

    Examples
    --------
    >>> votes = Votes().added(["12", "12", None, "7"])
    >>> votes["12"], votes.samples, votes.leader, votes.latest
    (2, 4, '12', ('12', '12', None, '7'))
    """

    samples: int = 0
    latest: tuple[Any, ...] = ()
    decided: bool = False
    gave_up: bool = False

    def added(self, answers: Iterable[Any]) -> Votes:
        """A new ``Votes`` with one more iteration of ``answers`` (``None``: unparsable), not yet judged."""
        latest = tuple(answers)
        new = Votes(self)
        new.update(a for a in latest if a is not None)
        new.samples = self.samples + len(latest)
        new.latest = latest
        return new

    def copy(self) -> Votes:
        return _rebuild(dict(self), self.samples, self.latest, self.decided, self.gave_up)

    @property
    def leader(self) -> Any:
        """The most common answer (the first seen among equals); ``None`` before any parsed."""
        top = self.most_common(1)
        return top[0][0] if top else None

    def __reduce__(self) -> Any:
        return (_rebuild, (dict(self), self.samples, self.latest, self.decided, self.gave_up))

    def __repr__(self) -> str:
        verdict = ", decided" if self.decided else ", gave up" if self.gave_up else ""
        return f"Votes({dict(self.most_common())!r}, samples={self.samples}{verdict})"


def _rebuild(counts: dict[Any, int], samples: int, latest: tuple[Any, ...], decided: bool = False,
             gave_up: bool = False) -> Votes:
    votes = Votes(counts)
    votes.samples, votes.latest, votes.decided, votes.gave_up = samples, latest, decided, gave_up
    return votes


#: A stopping rule: ``rule(votes) -> bool``, True when an element has voted enough.
Rule = Callable[[Votes], bool]


def leader_probability(first: int, second: int) -> float:
    """The probability that the leading answer is truly ahead of the runner-up.

    Adaptive-Consistency (Aggarwal et al., EMNLP 2023) models the shares of
    the top two answers, ``p1`` and ``p2``, with a uniform prior: given
    ``first`` and ``second`` votes, ``p1 / (p1 + p2)`` follows
    ``Beta(first + 1, second + 1)`` and this is its mass above 1/2. For whole
    counts that mass is a binomial tail, computed exactly:
    ``P(Binomial(first + second + 1, 1/2) <= first)``.

    Parameters
    ----------
    first, second
        Votes of the leading answer and of the runner-up (0 when there is none).

    Returns
    -------
    float
        ``P(p1 > p2 | votes)``, between 0 and 1.

    Examples
    --------
    >>> leader_probability(0, 0), leader_probability(4, 0), round(leader_probability(5, 1), 4)
    (0.5, 0.96875, 0.9375)
    """
    if first < 0 or second < 0:
        raise ValueError(f"leader_probability: votes must be >= 0, got {first} and {second}")
    n = first + second + 1
    return sum(math.comb(n, j) for j in range(first + 1)) / 2**n


def _named(rule: Rule, name: str) -> Rule:
    """``rule`` named after the call that made it, so reprs, traces and errors say which rule it is."""
    rule.__name__ = rule.__qualname__ = name
    return rule


def _top_two(votes: collections.Counter[Any]) -> tuple[int, int]:
    top = [count for _, count in votes.most_common(2)] + [0, 0]
    return top[0], top[1]


#: The default ``give_up`` of the top-two rules: with one iteration left, a chance to be decided under 10% is none.
GIVE_UP = 0.1


class TopTwoRule:
    """A stopping rule of the top two counts, which can tell when it has no chance to hold in time.

    ``rule(votes)`` holds once ``holds(first, second)`` does for the votes of
    the leader and the runner-up: the vote is decided. Since nothing else
    matters to it, ``vote`` can tell when an element's decision is out of
    reach (``hopeless``) and give up on it (``Votes.gave_up``): it stops with
    its plurality rather than spend the rest of ``max_samples`` on a vote
    that will end undecided. Out of reach means certainly (even every
    remaining sample going to the leader would not do: 2-2 or 1-1-1-1 after
    4 samples of 8) or, with one iteration left, almost surely: a chance to hold
    (``chance``) below ``give_up``. This is the futility rule of Bayesian
    adaptive trials (stop when the predictive probability of success is low;
    Lee and Liu, Clinical Trials 2008), with the rule as the success. The
    chance alone is not enough further from the cap: a vote that cannot be
    decided still firms up its plurality as samples come (a close call
    between two answers), and giving up there at a 10% chance cost 0.5-0.8
    points of accuracy on ``benchmarks/bench_vote.py``'s calibrated fake,
    against 0.2 or less this way.

    The prediction (``chance``): each further sample goes to the leader, the
    runner-up or elsewhere (another answer, or unparsable) with shares drawn
    from their posterior given the samples so far, Dirichlet(first + 1,
    second + 1, rest + 1) (a uniform prior), that is a Polya urn; the rule is
    checked after each iteration's samples, as ``vote`` does, and the probability is
    summed exactly over the urn's paths. Answers outside the top two are
    lumped together and never overtake, which overstates the chance a little:
    the rule gives up later, never sooner, than an exact model would.

    Parameters
    ----------
    name
        What reprs and traces call the rule (the call that made it).
    holds
        ``holds(first, second) -> bool`` with ``first >= second``; more votes
        for the leader never undo a decision.
    give_up
        With one iteration left, give up on an element whose chance to be
        decided is below this (between 0 and 1); 0 never gives up, not even
        on a decision out of reach.

    Examples
    --------
    >>> confident = stop_when_confident()
    >>> confident.chance(Votes().added(["1", "2", "3", "4"]), remaining=4, per_iteration=4)  # 5 vs 1 at best: 0.9375
    0.0
    >>> round(confident.chance(Votes().added(["1", "1", "1", "2"]), remaining=4, per_iteration=4), 3)
    0.262
    """

    def __init__(self, name: str, holds: Callable[[int, int], bool], give_up: float = GIVE_UP) -> None:
        if not 0 <= give_up < 1:
            raise ValueError(f"{name}: give_up must be in [0, 1), got {give_up!r}")
        self.__name__ = self.__qualname__ = name
        self.holds = holds
        self.give_up = give_up
        self._tables: dict[int, np.ndarray] = {}
        self._chances: dict[tuple[int, int, int, int, int], float] = {}

    def __call__(self, votes: Votes) -> bool:
        return self.holds(*_top_two(votes))

    def __repr__(self) -> str:
        return self.__name__

    def chance(self, votes: Votes, remaining: int, per_iteration: int | None = None, *,
               round: int | None = None) -> float:  # noqa: A002 - the deprecated name
        """The probability that the rule holds after one of the next iterations, within ``remaining`` samples.

        Parameters
        ----------
        votes
            The element's votes so far.
        remaining
            Samples it may still draw (``max_samples - votes.samples``).
        per_iteration
            Samples per iteration: the rule is checked after each
            iteration's samples. ``round`` is its deprecated name.

        Returns
        -------
        float
            Between 0 and 1; 0 when even every remaining sample going to the
            leader would not do.
        """
        per_iteration = _per_iteration(per_iteration, round, "TopTwoRule.chance")
        first, second = _top_two(votes)
        key = (first, second, votes.samples - first - second, remaining, per_iteration)
        if key not in self._chances:
            self._chances[key] = self._polya(*key)
        return self._chances[key]

    def hopeless(self, votes: Votes, remaining: int, per_iteration: int | None = None, *,
                 round: int | None = None) -> bool:  # noqa: A002 - the deprecated name
        """True when the element's decision is out of reach: certainly, or (one iteration left) almost surely.

        Certainly: even every remaining sample going to the leader would
        not make the rule hold. Almost surely: only one iteration is left and
        its chance (``chance``) is below ``give_up``. Always False when
        ``give_up`` is 0 or nothing remains. ``round`` is the deprecated
        name of ``per_iteration``.
        """
        per_iteration = _per_iteration(per_iteration, round, "TopTwoRule.hopeless")
        if self.give_up == 0 or remaining <= 0:
            return False
        first, second = _top_two(votes)
        if not self.holds(first + remaining, second):
            return True
        return remaining <= per_iteration and self.chance(votes, remaining, per_iteration) < self.give_up

    def _table(self, size: int) -> np.ndarray:
        """``table[a, b]``: whether the rule holds for top two counts ``a`` and ``b`` (either order), up to ``size``."""
        if size not in self._tables:
            self._tables[size] = np.array([[self.holds(max(a, b), min(a, b)) for b in range(size + 1)]
                                           for a in range(size + 1)], dtype=bool)
        return self._tables[size]

    def _polya(self, first: int, second: int, rest: int, remaining: int, per_iteration: int) -> float:
        # undecided[x, y]: the chance that x of the draws so far went to the leader, y to the runner-up, and
        # the rule has not held yet; each iteration's decided states leave it, into `success`
        leader = np.arange(remaining + 1)[:, None]
        runner_up = np.arange(remaining + 1)[None, :]
        decided = self._table(first + second + rest + remaining)[first + leader, second + runner_up]
        undecided = np.zeros((remaining + 1, remaining + 1))
        undecided[0, 0] = 1.0
        success = 0.0
        for drawn in range(remaining):
            total = first + second + rest + 3 + drawn
            to_leader = undecided * ((first + 1 + leader) / total)
            to_runner_up = undecided * ((second + 1 + runner_up) / total)
            undecided = undecided * (np.maximum(rest + 1 + drawn - leader - runner_up, 0) / total)
            undecided[1:, :] += to_leader[:-1, :]
            undecided[:, 1:] += to_runner_up[:, :-1]
            if (drawn + 1) % per_iteration == 0:
                success += float(undecided[decided].sum())
                undecided[decided] = 0.0
        return success


def stop_when_confident(threshold: float = 0.95, give_up: float = GIVE_UP) -> TopTwoRule:
    """Adaptive-Consistency's rule: stop once the leader is ahead with this probability.

    The probability is ``leader_probability`` of the top two counts; the
    paper's default threshold, 0.95, stops unanimous answers after 4 votes.
    An element whose samples scatter too much to reach ``threshold`` within
    ``max_samples`` is given up on instead (see ``TopTwoRule``): with 4
    samples an iteration and a cap of 8, four different answers (5 to 1 at
    best: 0.94) or 2-1-1 (a 7% chance in the last iteration) stop after the
    first iteration, 3-1 (26%) goes on.

    Parameters
    ----------
    threshold
        Between 0.5 and 1 (exclusive of 1): higher spends more samples.
    give_up
        Give up on an element whose decision is out of reach within
        ``max_samples``, or under this chance with one iteration left; 0
        never gives up (the paper's rule).

    Returns
    -------
    TopTwoRule
        ``rule(votes) -> bool``.

    Examples
    --------
    >>> confident = stop_when_confident()
    >>> confident(Votes().added(["4", "4", "4"])), confident(Votes().added(["4", "4", "4", "4"]))
    (False, True)
    """
    if not 0.5 <= threshold < 1:
        raise ValueError(f"stop_when_confident: threshold must be in [0.5, 1), got {threshold!r}")
    name = f"stop_when_confident({threshold}" + (f", give_up={give_up})" if give_up != GIVE_UP else ")")
    return TopTwoRule(name, lambda first, second: leader_probability(first, second) >= threshold, give_up)


def stop_when_iteration_agrees() -> Rule:
    """ESC's window rule (Li et al., ICLR 2024): stop when one iteration's answers all agree.

    Early-Stopping Self-Consistency samples in windows and stops after a
    window whose answers are all the same (zero entropy); the window here is
    one iteration's samples, so pick ``per_iteration`` as the window size
    (the paper uses 5 to 8). An unparsable sample breaks agreement.
    ``stop_when_round_agrees`` is its deprecated name.

    Returns
    -------
    Rule
        ``rule(votes) -> bool``.

    Examples
    --------
    >>> agrees = stop_when_iteration_agrees()
    >>> agrees(Votes().added(["7", "7", "7"])), agrees(Votes().added(["7", "7", None]))
    (True, False)
    """

    def iteration_agrees(votes: Votes) -> bool:
        latest = votes.latest
        return bool(latest) and latest[0] is not None and all(a == latest[0] for a in latest)

    return _named(iteration_agrees, "stop_when_iteration_agrees()")


def stop_when_round_agrees() -> Rule:
    """The deprecated name of ``stop_when_iteration_agrees`` (it goes in the next release)."""
    warnings.warn("outlines.voting.stop_when_round_agrees is deprecated and goes in the next release: use "
                  "stop_when_iteration_agrees (a round is one frontier of the schedule)", DeprecationWarning,
                  stacklevel=2)
    return stop_when_iteration_agrees()


def _per_iteration(per_iteration: int | None, round: int | None, where: str, stacklevel: int = 3) -> int:  # noqa: A002
    """``per_iteration``, or the deprecated ``round=`` given for it (warning)."""
    if round is not None:
        if per_iteration is not None:
            raise TypeError(f"{where}: give per_iteration= or round= (its deprecated name), not both")
        warnings.warn(f"{where}(round=...) is deprecated and goes in the next release: use per_iteration= (a round "
                      f"is one frontier of the schedule)", DeprecationWarning, stacklevel=stacklevel)
        return round
    if per_iteration is None:
        raise TypeError(f"{where}: per_iteration is required")
    return per_iteration


def stop_when_ahead(margin: int, give_up: float = GIVE_UP) -> TopTwoRule:
    """Stop once the leader has ``margin`` more votes than the runner-up.

    Parameters
    ----------
    margin
        Votes of lead needed (an integer >= 1).
    give_up
        Give up on an element that cannot take that lead within
        ``max_samples``, or has under this chance with one iteration left (see
        ``TopTwoRule``); 0 never gives up.

    Returns
    -------
    TopTwoRule
        ``rule(votes) -> bool``.

    Examples
    --------
    >>> ahead = stop_when_ahead(2)
    >>> ahead(Votes().added(["3", "5", "3"])), ahead(Votes().added(["3", "3", "5", "3"]))
    (False, True)
    """
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 1:
        raise ValueError(f"stop_when_ahead: margin must be an integer >= 1, got {margin!r}")
    name = f"stop_when_ahead({margin}" + (f", give_up={give_up})" if give_up != GIVE_UP else ")")
    return TopTwoRule(name, lambda first, second: first - second >= margin, give_up)


#: The default rule of ``vote``: Adaptive-Consistency at the paper's threshold, giving up on a decision out of reach.
DEFAULT_RULE = stop_when_confident(0.95)


class Vote(NamedTuple):
    """What ``vote`` returns: three Variables of the prompt's shape."""

    answer: Variable
    """The leading answer per element (``None`` where no sample parsed)."""
    samples: Variable
    """Samples spent per element (an ``int``)."""
    votes: Variable
    """The element's ``Votes``: every parsed answer and its count, and why it stopped."""

    @property
    def decided(self) -> Variable:
        """Whether each element's rule held (a ``bool``): where False, ``answer`` is a plurality, not a decision."""
        return fn(lambda votes: votes.decided, name="decided", pure=True)(self.votes)


def _strip(text: str) -> Optional[str]:
    return text.strip() or None


def _parsed(parse: Callable[[Any], Any], text: Any) -> Any:
    try:
        return parse(text)
    except ValueError:  # int("no number here"): an unparsable sample, not a failure
        return None


def _judged(votes: Votes, stop: Rule | None, max_samples: int) -> Votes:
    """``votes`` with its verdict: decided when ``stop`` holds; given up when a top-two rule cannot hold in time."""
    if stop is not None:
        votes.decided = bool(stop(votes.copy()))  # a copy: a rule that writes to its votes changes nothing
        votes.gave_up = (not votes.decided and isinstance(stop, TopTwoRule)
                         and stop.hopeless(votes, max_samples - votes.samples, len(votes.latest)))
    return votes


def vote(
    model: Any,
    prompt: Any,
    *,
    parse: Callable[[Any], Any] | None = None,
    stop: Rule | None = DEFAULT_RULE,
    per_iteration: int | None = None,
    max_samples: int = 16,
    answer: Callable[[Variable], Any] | None = None,
    **options: Any,
) -> Vote:
    """Sample answers iteration by iteration and vote, stopping per element by a rule.

    Each iteration draws ``per_iteration`` samples of ``prompt`` for every element still
    undecided, all in one batched model call; each sample is parsed into an
    answer and counted; ``stop(votes)`` then says which elements have voted
    enough. An element stops when its rule holds (its vote is decided), when
    its decision is out of reach within ``max_samples`` (it gives up: the
    default rule does, see ``TopTwoRule``), or after ``max_samples``
    samples, so easy questions stop paying early, scattered ones stop paying
    soon, and the batches shrink iteration by iteration. The answer of an element
    that gave up or ran to ``max_samples`` is a plurality, not a decision:
    its ``Votes`` say so (``decided`` is False; ``gave_up`` tells which), and
    the trace counts those at ``max_samples`` (``stopped at max_iter``). It
    is ONE ``outlines.while_loop``: every iteration's draws are
    cached, a re-run replays them with no backend calls, and a run that failed
    (or was interrupted) at iteration i resumes at iteration i.

    Parameters
    ----------
    model
        A ``Model`` (``models.transformers``, ``models.openai``...).
    prompt
        The prompt: a string, a string Variable or a conversation, of any
        shape (one vote per element).
    parse
        ``text -> answer`` in plain Python; it returns ``None`` (or raises
        ``ValueError``, as ``int`` does) for a sample with no answer, which
        then counts toward ``samples`` but is no vote. Answers must be
        hashable. Default: the text stripped (right for a constrained answer).
    stop
        The stopping rule, ``rule(votes) -> bool`` over the element's
        ``Votes`` (a ``Counter`` of answers, plus ``.samples`` and
        ``.latest``), checked after each iteration. Default:
        ``stop_when_confident(0.95)`` (Adaptive-Consistency), which also
        gives up on an element whose decision is out of reach within
        ``max_samples`` (certainly, or under a 10% chance with one
        iteration left: ``give_up=``; 0 never gives up). A
        ``TopTwoRule`` (``stop_when_confident``, ``stop_when_ahead``) can
        give up; any other rule runs until it holds. ``None`` never stops
        early: a fixed majority of ``max_samples``.
    per_iteration
        Samples per element per iteration (an integer >= 1; default 4).
        ``round=`` is its deprecated name.
    max_samples
        The most samples an element draws: a multiple of ``per_iteration``.
    answer
        Optional: a function traced once on each iteration's completions (a
        Variable of shape ``prompt.shape + (per_iteration,)``) returning the texts to
        parse, of the same shape. Use it for an answer step after free
        reasoning, e.g. a second call constrained with ``regex=``.
    **options
        Passed to every model call: ``max_tokens``, ``temperature``, ``seed``,
        ``stop``, ``regex``...

    Returns
    -------
    Vote
        ``(answer, samples, votes)``: Variables of the prompt's shape;
        ``votes`` holds each element's ``Votes``, whose ``decided`` and
        ``gave_up`` say why it stopped; ``Vote.decided`` is the first as a
        Variable.

    Raises
    ------
    GraphBuildError
        At build time, for a ``per_iteration`` or ``max_samples`` that is not a
        positive integer, a ``max_samples`` that ``per_iteration`` does not divide, a
        ``stop`` that is not callable, or ``num_samples`` among the options.

    Examples
    --------
    >>> import outlines
    >>> from outlines import models
    >>> llm = models.from_function(lambda prompt: " 12", name="twelve")
    >>> result = outlines.vote(llm, "What is 3 * 4?", parse=int)
    >>> outlines.eval(result.answer, result.samples, cache=False)
    (12, 4)
    >>> import itertools
    >>> draws = itertools.count()
    >>> scattered = models.from_function(lambda prompt: str(next(draws) % 3), name="scattered")
    >>> result = outlines.vote(scattered, "What is 3 * 4?", max_samples=8)
    >>> outlines.eval(result.votes, cache=False)  # 2-1-1 after an iteration: a 7% chance, so it gives up
    Votes({'0': 2, '1': 1, '2': 1}, samples=4, gave up)
    """
    per_iteration = _check_vote(model, stop, per_iteration, max_samples, options)
    return _voting_loop(model, as_variable(prompt, array=True), parse or _strip, stop, per_iteration, max_samples,
                        answer, options)


def _check_vote(model: Any, stop: Rule | None, per_iteration: int | None, max_samples: int,
                options: dict[str, Any]) -> int:
    """``vote``'s samples per iteration (default 4; the deprecated ``round=`` taken out of ``options``).

    Raises ``GraphBuildError`` naming the model for an argument of ``vote`` it cannot run with.
    """
    if "round" in options:
        per_iteration = _per_iteration(per_iteration, options.pop("round"), "vote", stacklevel=4)
    per_iteration = 4 if per_iteration is None else per_iteration
    backend = getattr(model, "backend", None)
    where = f"vote({backend.kind}:{backend.model_name})" if backend is not None else f"vote({model!r:.60})"
    for name, value in (("per_iteration", per_iteration), ("max_samples", max_samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise GraphBuildError(f"{where}: {name} must be an integer >= 1, got {value!r}")
    if max_samples % per_iteration:
        raise GraphBuildError(f"{where}: max_samples={max_samples} is not a multiple of per_iteration={per_iteration}; "
                              f"every iteration draws {per_iteration} samples "
                              f"(try max_samples={max_samples + per_iteration - max_samples % per_iteration})")
    if "num_samples" in options:
        raise GraphBuildError(f"{where}: num_samples is set by per_iteration= and max_samples=, not passed to the "
                              f"model")
    if stop is not None and not callable(stop):
        raise GraphBuildError(f"{where}: stop must be a rule, votes -> bool, got {type(stop).__name__} {stop!r:.60}")
    return per_iteration


def _voting_loop(model: Any, prompt: Variable, reader: Callable[[Any], Any], stop: Rule | None, per_iteration: int,
                 max_samples: int, answer: Callable[[Variable], Any] | None, options: dict[str, Any]) -> Vote:
    """``vote``'s graph, arguments checked: one ``while_loop`` sampling and counting ``per_iteration`` draws a pass."""

    @fn(signature="(),(n)->()", name="count votes", pure=True)
    def count(votes: Votes, texts: Any) -> Votes:
        return _judged(votes.added(_parsed(reader, text) for text in texts), stop, max_samples)

    @fn(name="undecided", pure=True)
    def undecided(votes: Votes) -> bool:
        return votes.samples == 0 or not (votes.decided or votes.gave_up)

    def iterate(votes: Variable) -> Variable:
        texts = model(prompt, num_samples=per_iteration, **options)  # a trailing axis of `per_iteration`, 1 included
        if answer is not None:
            texts = answer(texts)
        return count(votes, texts)

    final = while_loop(undecided, iterate, init=Votes(), max_iter=max_samples // per_iteration)
    leader = fn(lambda votes: votes.leader, name="leader", pure=True)
    spent = fn(lambda votes: votes.samples, name="samples", pure=True)
    return Vote(leader(final), spent(final), final)


# -- cascades: the cheap model first ---------------------------------------------------------------------------------
#: Why an element of a cascade holds its answer (``Route.kept``).
KEPT = ("accepted", "last", "budget", "failed")


@dataclass(frozen=True, eq=False)
class Route:
    """The way one element went through a ``cascade``: every stage it reached, and the answer it kept.

    Attributes
    ----------
    stages
        One entry per stage the element reached, in order: that stage's
        ``Votes`` (its parsed samples; ``decided`` is whether ``accept``
        held), or the ``Failure`` of a stage that failed (an error, or draws
        the budget refused).
    stage
        The index (into ``models``) of the stage whose answer the element
        kept; ``None`` when no stage answered (``kept == "failed"``).
    answer
        The answer it kept: that stage's majority (``Votes.leader``;
        ``None`` where none of its samples parsed).
    kept
        Why: ``"accepted"`` (``accept`` held at ``stage``), ``"last"`` (the
        last model answers whatever ``accept`` says), ``"budget"`` (the
        budget could not pay the next stage: it keeps an earlier stage's
        answer), ``"failed"`` (no stage answered: ``failure`` says why);
        ``None`` while the element still goes on.
    failure
        The ``Failure`` of the last stage it reached, when ``kept == "failed"``.

    A stage's failure that the element escalated past still shows in the
    trace's errors (it happened), though the element's answer came later.

    Examples
    --------
    >>> route = Route((Votes().added(["4", "5"]), Votes().added(["4", "4"])), stage=1, answer="4", kept="accepted")
    >>> route.samples, route.escalations
    (4, 1)
    """

    stages: tuple[Any, ...] = ()
    stage: int | None = None
    answer: Any = None
    kept: str | None = None
    failure: Failure | None = None

    @property
    def samples(self) -> int:
        """Samples drawn over every stage it reached (a stage that failed counts none)."""
        return sum(votes.samples for votes in self.stages if isinstance(votes, Votes))

    @property
    def escalations(self) -> int:
        """How many times it went on to a next stage (a stage the budget refused included)."""
        return max(0, len(self.stages) - 1)

    def __repr__(self) -> str:
        if self.kept is None:
            return f"Route(stages={len(self.stages)}, going on)"
        where = f", stage={self.stage}" if self.stage is not None else ""
        why = f", failure={self.failure}" if self.failure is not None else ""
        return f"Route(answer={self.answer!r}{where}, kept={self.kept!r}, samples={self.samples}{why})"


class Cascade(NamedTuple):
    """What ``cascade`` returns: four Variables of the prompt's shape."""

    answer: Variable
    """The answer per element: the majority of the stage that answered it."""
    stage: Variable
    """The index (into ``models``) of the stage that answered each element (``None`` where none did)."""
    samples: Variable
    """Samples drawn per element, over every stage it reached (an ``int``)."""
    route: Variable
    """Each element's ``Route``: the ``Votes`` of every stage it reached, and why it kept its answer."""

    @property
    def accepted(self) -> Variable:
        """Whether each element's answer was accepted at its stage (``False`` for the last model's or a kept one)."""
        return fn(lambda route: route.kept == "accepted", name="accepted", pure=True)(self.route)


class _Failed:
    """A stage's failure as a value the cascade's steps read (a ``Failure`` would skip them)."""

    __slots__ = ("failure",)

    def __init__(self, failure: Failure) -> None:
        self.failure = failure

    def __repr__(self) -> str:
        return f"_Failed({self.failure})"


def unanimous(votes: Votes) -> bool:
    """``cascade``'s default ``accept``: every sample parsed, and all gave the same answer.

    Examples
    --------
    >>> unanimous(Votes().added(["4", "4", "4"])), unanimous(Votes().added(["4", "4", None]))
    (True, False)
    """
    return len(votes) == 1 and sum(votes.values()) == votes.samples


class _Outcome(Op):
    """One stage's result per element: its ``Votes`` (``decided``: ``accept`` held), or ``_Failed``.

    It reads failed elements (``guards_elements``): a draw that failed, or
    that the budget refused, is that element's stage failing, which the
    cascade escalates rather than passes on. ``counted``: the values are the
    ``Votes`` of a voting loop (judged by it already), else texts to parse,
    one row of samples per element.
    """

    __props__ = ("reader", "accept", "counted", "title")
    traits = Traits(run=Run.INLINE, pure=False, guards_elements=True)

    def __init__(self, reader: Callable[[Any], Any], accept: Rule | None, counted: bool, title: str) -> None:
        self.reader, self.accept, self.counted, self.title = reader, accept, counted, title

    @property
    def name(self) -> str:
        return self.title

    def describe(self) -> dict[str, Any]:
        rule = getattr(self.accept, "__name__", None) if self.accept is not None else None
        return {"kind": "python", "title": self.title, "lines": [f"accept={rule}"] if rule else []}

    def infer_shapes(self, shapes: list[Any], noutputs: int) -> list[Any]:
        return [shapes[0]]

    def perform(self, routes: Any, values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        count = routes.size if isinstance(routes, np.ndarray) else 1
        out = np.empty(count, dtype=object)
        if isinstance(values, Failure):  # the whole call failed
            out[:] = [_Failed(values) for _ in range(count)]
            return out if isinstance(routes, np.ndarray) else out[0]
        rows = _rows(values, count, self.counted)
        for element in range(count):
            try:
                out[element] = self._one(rows[element])
            except Exception as exc:  # noqa: BLE001 - a bug in parse or accept: the element's own failure
                if on_error is None:
                    raise
                out[element] = on_error(exc)
        return out if isinstance(routes, np.ndarray) else out[0]

    def _one(self, row: Any) -> Any:
        if self.counted:  # a voting loop's Votes, or the Failure an element left it with
            return _Failed(row) if isinstance(row, Failure) else row
        failed = next((text for text in row if isinstance(text, Failure)), None)
        if failed is not None:
            return _Failed(failed)
        votes = Votes().added(_parsed(self.reader, text) for text in row)
        if self.accept is not None:
            votes.decided = bool(self.accept(votes.copy()))  # a copy: a rule that writes to its votes changes nothing
        return votes


def _rows(values: Any, count: int, counted: bool) -> np.ndarray:
    """A stage's values as one row per element: its samples (``(count, k)``), or its ``Votes`` (``counted``).

    A stage may give ``k`` texts per element, or one (an agent's final
    answer, shaped like the prompt); a scalar prompt gives its samples alone.
    """
    rows = values if isinstance(values, np.ndarray) else np.array([values], dtype=object)
    if counted:
        return np.broadcast_to(rows.reshape(-1), (count,))
    if rows.ndim == 1:
        rows = rows.reshape(count, 1) if rows.shape[0] == count else rows.reshape(1, -1)
    return np.broadcast_to(rows, (count, rows.shape[-1]))


class _Answer(Op):
    """A cascade's answer per element; an element no stage answered fails with its last stage's failure.

    Under ``errors="return"`` that element holds the ``Failure`` itself;
    under ``errors="raise"`` the evaluation raises a ``NodeError`` naming the
    node that failed (a ``BudgetExceeded`` for a refusal).
    """

    traits = Traits(run=Run.INLINE, pure=True, guards_elements=True)

    @property
    def name(self) -> str:
        return "cascade answer"

    def infer_shapes(self, shapes: list[Any], noutputs: int) -> list[Any]:
        return [shapes[0]]

    def perform(self, routes: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        return broadcast_map(lambda route: self._one(route, on_error, on_failed_input), [routes])

    @staticmethod
    def _one(route: Any, on_error: Any, on_failed_input: Any) -> Any:
        if isinstance(route, Failure):  # a step of the cascade failed (a bug in parse, say)
            if on_failed_input is None:
                raise _raised(route.root)
            return on_failed_input(route)
        if route.kept != "failed":
            return route.answer
        failure = route.failure
        if on_error is not None:  # errors="return": the element holds its last stage's own failure
            return failure
        raise _raised(failure)


def _raised(failure: Failure) -> NodeError:
    """The error ``errors="raise"`` raises for an element whose last stage failed: a ``NodeError`` naming its node.

    A refusal of the budget is raised as the ``BudgetExceeded`` it was
    (its message; the figures are in the message).
    """
    if failure.error_type == "BudgetExceeded":
        refusal = BudgetExceeded.__new__(BudgetExceeded)  # its figures are in its message: the rest is unknown here
        RuntimeError.__init__(refusal, failure.message)
        vars(refusal).update(message=failure.message, node=failure.node, op=failure.op, cause=refusal, budget=None,
                             spent_tokens=None, spent_cost=None, needed_tokens=None, needed_cost=None, backend=None,
                             draws=None)
        return refusal
    kind = getattr(builtins, failure.error_type, None)
    try:  # the builtin exception it was (most are), with its message; else a RuntimeError naming its type
        cause = kind(failure.message) if isinstance(kind, type) and issubclass(kind, Exception) else None
    except Exception:  # noqa: BLE001 - an exception type that takes other arguments
        cause = None
    if cause is None:
        cause = RuntimeError(f"{failure.error_type}: {failure.message}")
    return NodeError(failure.node, failure.op, cause)


def _caught(value: Any) -> Any:
    return _Failed(value) if isinstance(value, Failure) else value


class _Caught(Op):
    """Elementwise: a ``Failure`` element as a ``_Failed`` value (a verifier's verdict that failed)."""

    traits = Traits(run=Run.INLINE, pure=True, guards_elements=True)

    @property
    def name(self) -> str:
        return "caught"

    def infer_shapes(self, shapes: list[Any], noutputs: int) -> list[Any]:
        return [shapes[0]]

    def perform(self, values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        return broadcast_map(_caught, [values])  # unguarded: a Failure element is caught, not passed on


def _advanced(route: Route, outcome: Any, index: int, last: bool) -> Route:
    """``route`` after stage ``index``'s ``outcome`` (``Votes`` or ``_Failed``): settled, or going on."""
    if isinstance(outcome, _Failed):
        failure = outcome.failure
        stages = (*route.stages, failure)
        if failure.error_type == "BudgetExceeded":  # the budget cannot pay this stage: keep an earlier answer
            earlier = [(i, v) for i, v in enumerate(route.stages) if isinstance(v, Votes)]
            if earlier:
                answered = [(i, v) for i, v in earlier if v.leader is not None]
                stage, votes = (answered or earlier)[-1]
                return Route(stages, stage, votes.leader, "budget")
            return Route(stages, None, None, "failed", failure)
        if last:
            return Route(stages, None, None, "failed", failure)
        return Route(stages)
    stages = (*route.stages, outcome)
    if outcome.decided and outcome.leader is not None:
        return Route(stages, index, outcome.leader, "accepted")
    if last:
        return Route(stages, index, outcome.leader, "last")
    return Route(stages)  # rejected, or nothing parsable: the next model answers


def _arity(accept: Callable[..., Any]) -> int:
    """Required positional parameters of ``accept`` (1 when unknown)."""
    try:
        parameters = inspect.signature(accept).parameters.values()
    except (TypeError, ValueError):
        return 1
    return sum(1 for p in parameters if p.kind <= p.POSITIONAL_OR_KEYWORD and p.default is p.empty)


def _per_stage(where: str, name: str, value: Any, stages: int, optional: bool = False) -> list[Any]:
    """``value`` (one for all stages, or one per stage) as one per stage, checked."""
    values = list(value) if isinstance(value, (list, tuple)) else [value] * stages
    if len(values) != stages:
        raise GraphBuildError(f"{where}: {name} has {len(values)} value(s) for {stages} model(s); give one, or one "
                              f"per model")
    for item in values:
        if optional and item is None:
            continue
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise GraphBuildError(f"{where}: {name} must be an integer >= 1 (or one per model), got {item!r}")
    return values


def _field(name: str) -> Any:
    """An ``outlines.fn`` reading one attribute of each element's ``Route`` (a failed step's ``Failure`` passed on)."""
    return fn(lambda route: getattr(route, name) if isinstance(route, Route) else route, name=name, pure=True)


def _check_cascade(models: Any, samples: Any, max_samples: Any, accept: Any
                   ) -> tuple[list[Any], list[int], list[int | None], Callable[..., Any], bool]:
    """``cascade``'s arguments, checked: the stages, samples and caps per stage, the rule, whether it is a verifier.

    Raises ``GraphBuildError`` for an argument it cannot run with (see ``cascade``).
    """
    stages = list(models) if isinstance(models, (list, tuple)) else None
    where = f"cascade({len(stages)} model(s))" if stages is not None else "cascade"
    if not stages:
        raise GraphBuildError(f"{where}: models must be a non-empty list of models, cheapest first; got {models!r:.60}")
    count = len(stages)
    draws = _per_stage(where, "samples", samples, count)
    caps = _per_stage(where, "max_samples", max_samples, count, optional=True)
    for stage, (k, cap) in enumerate(zip(draws, caps)):
        if cap is not None and cap % k:
            raise GraphBuildError(f"{where}: stage {stage} draws samples={k} at a time; max_samples={cap} is not a "
                                  f"multiple of it")
    rule = unanimous if accept is None else accept
    if not callable(rule):
        raise GraphBuildError(f"{where}: accept must be a function, votes -> bool (or a verifier, (prompt, answer) -> "
                              f"bool), got {type(rule).__name__} {rule!r:.60}")
    verifier = _arity(rule) == 2
    if verifier and any(cap is not None for cap in caps):
        raise GraphBuildError(f"{where}: a verifier accept (prompt, answer) decides once per stage; max_samples needs "
                              "a rule of the votes, votes -> bool")
    return stages, draws, caps, rule, verifier


def cascade(
    prompt: Any,
    models: Any,
    *,
    samples: int | Iterable[int] = 3,
    parse: Callable[[Any], Any] | None = None,
    accept: Callable[..., Any] | None = None,
    max_samples: int | Iterable[int | None] | None = None,
) -> Cascade:
    """Answer with the cheapest model that is sure, escalating the rest to the next model.

    Every element is first answered by ``models[0]`` with ``samples``
    draws, parsed into answers; where ``accept`` holds the element keeps
    that stage's majority, and the others (with those whose stage failed:
    an error, or no sample parsed) go to the next model, and so on; the
    last model always answers. Each stage is one ``outlines.cond`` over
    the elements that reached it: ONE batched call per backend per stage
    (one round of jobs under ``jobs=``), cached and resumable; nothing goes
    to a later model for an element accepted earlier (FrugalGPT, AutoMix).
    A stage that fails for an element escalates it; only the last stage's
    failure is the element's (a ``Failure`` under ``errors="return"``, else
    a ``NodeError`` naming the failed node). Under ``budget=`` a cascade
    never raises for lack of money after its first stage: an escalation the
    budget cannot pay is skipped and the element keeps the earlier answer
    (``Route.kept == "budget"``). ``Trace.cascades()`` counts each stage.

    Parameters
    ----------
    prompt
        A string, a string Variable or a conversation, of any shape.
    models
        The stages, cheapest first: ``Model``s, or any function called as
        ``stage(prompt, num_samples=k)`` that returns ``k`` texts per
        element, or one (a chain, an agent's final answer); the same model
        may appear twice with different methods.
    samples
        Draws per element per stage: one integer for every stage, or one
        per stage (default 3).
    parse
        ``text -> answer``, as in ``vote``: ``None`` (or ``ValueError``) for
        a text with no answer, a vote for nothing. Answers must be hashable.
        Default: the text stripped.
    accept
        When an element stops at a stage. ``accept(votes) -> bool``, called
        per element in Python with that stage's ``Votes`` (a ``Counter`` of
        the parsed answers; ``.latest`` lists them in draw order, ``None``
        where a text did not parse; ``.samples``). ``vote``'s stopping rules
        are such functions (``outlines.stop_when_confident(0.9)``); with
        ``max_samples`` a stage samples ``samples`` at a time until its rule
        holds, gives up, or ``max_samples`` are drawn (a ``vote``), and the
        element is accepted when the rule held. Or ``accept(prompt,
        answer)`` with two parameters: traced once over symbolic values
        (the prompt and the stage's majority), returning a boolean per
        element; it may call a model (a verifier, as AutoMix's
        self-verification), batched over the stage's elements (not asked at
        the last stage); a verdict that fails rejects. Default: ``unanimous``
        (every sample parsed and all equal); ``calibrate_cascade`` picks a
        threshold of ``agreement`` from labelled examples.
    max_samples
        ``None`` (default): each stage draws ``samples`` once. Else the most
        a stage draws (one for all, or per stage; ``None``: draws once).

    Returns
    -------
    Cascade
        ``(answer, stage, samples, route)``: Variables of the prompt's
        shape; ``route`` holds each element's ``Route`` (the ``Votes`` of
        every stage it reached, and why it kept its answer).

    Raises
    ------
    GraphBuildError
        At build time: no models, ``samples`` or ``max_samples`` not
        positive integers (or not one per model), a ``max_samples`` that its
        ``samples`` does not divide, an ``accept`` that is not callable, or
        a verifier (two parameters) with ``max_samples``.

    Examples
    --------
    >>> import outlines
    >>> from outlines import models
    >>> small = models.from_function(lambda p: "4" if "2 + 2" in p else "?", name="small")
    >>> strong = models.from_function(lambda p: "5" if "2 + 3" in p else "4", name="strong")
    >>> result = outlines.cascade(["2 + 2?", "2 + 3?"], [small, strong], parse=int)
    >>> answer, stage = outlines.eval(result.answer, result.stage, cache=False)
    >>> answer.tolist(), stage.tolist()
    ([4, 5], [0, 1])
    """
    stages, draws, caps, rule, verifier = _check_cascade(models, samples, max_samples, accept)
    count = len(stages)
    reader = parse or _strip
    prompt = as_variable(prompt, array=True)
    pending = fn(lambda route: isinstance(route, Route) and route.kept is None, name="going on", pure=True)
    route: Variable = as_variable(Route())
    group = object()  # shared by the stages of this cascade (explain ranges its cost)
    for index, (model, k, cap) in enumerate(zip(stages, draws, caps)):
        body = _stage(prompt, model, index, index == count - 1, k, cap, reader, rule, verifier)
        tally = _Tally(group, index, model)
        route = _cond(pending(route), body, lambda kept: kept, (route,), catch=True, tally=tally)
    return Cascade(_Answer()(route), _field("stage")(route), _field("samples")(route), route)


def _model_name(model: Any) -> str:
    """How the trace names a stage's model: ``kind:model`` of its backend, else the function's name."""
    backend = getattr(model, "backend", None)
    if backend is not None:
        return f"{backend.kind}:{backend.model_name}"
    return str(getattr(model, "__name__", None) or repr(model))[:60]


class _Tally:
    """What the elements that reached a stage did, for the trace (``Trace.cascades``)."""

    #: ``Route.kept`` -> the count it adds to.
    COUNTS = {None: "escalated", "accepted": "accepted", "last": "answered", "budget": "kept: budget"}

    def __init__(self, group: object, index: int, model: Any) -> None:
        self.group, self.index, self.model = group, index, _model_name(model)
        backend = getattr(model, "backend", None)
        self.backend = repr(backend) if backend is not None else None  # the trace's key for its cost

    def __call__(self, routes: np.ndarray) -> dict[str, Any]:
        counts: dict[str, Any] = {"stage": self.index, "model": self.model, "backend": self.backend,
                                  "reached": int(routes.size)}
        counts.update(dict.fromkeys(("accepted", "escalated", "answered", "kept: budget", "failed"), 0))
        for route in routes.reshape(-1):
            counts[self.COUNTS.get(route.kept, "failed") if isinstance(route, Route) else "failed"] += 1
        return counts


def _stage(prompt: Variable, model: Any, index: int, last: bool, k: int, cap: int | None,
           reader: Callable[[Any], Any], rule: Callable[..., Any], verifier: bool) -> Callable[[Variable], Variable]:
    """The branch of stage ``index``: draw, parse and judge the elements that reached it, then advance their routes."""
    title = f"stage {index}"

    @fn(name=f"{title} route", pure=True)
    def advance(route: Route, outcome: Any) -> Route:
        return _advanced(route, outcome, index, last)

    def branch(route: Variable) -> Variable:
        if cap is None:
            texts = model(prompt, num_samples=k)
            outcome = _Outcome(reader, None if verifier else rule, False, title)(route, texts)
        else:
            loop = _voting_loop(model, prompt, reader, rule, k, cap, None, {})
            outcome = _Outcome(reader, None, True, title)(route, loop.votes)
        if verifier and not last:  # the last model answers whatever a verifier would say
            outcome = _verified(prompt, outcome, rule)
        return advance(route, outcome)

    branch.__name__ = title
    return branch


def _verified(prompt: Variable, outcome: Variable, verify: Callable[..., Any]) -> Variable:
    """``outcome`` whose ``decided`` is the verifier's verdict, asked only where the stage has an answer."""
    answered = fn(lambda votes: isinstance(votes, Votes) and votes.leader is not None, name="answered", pure=True)
    leader = fn(lambda votes: votes.leader if isinstance(votes, Votes) else None, name="majority", pure=True)
    verdict = _cond(answered(outcome), verify, lambda prompt, answer: as_variable(False), (prompt, leader(outcome)))

    @fn(name="verdict", pure=True)
    def decided(votes: Any, ok: Any) -> Any:
        if isinstance(votes, Votes):
            votes = votes.copy()
            votes.decided = ok is True or type(ok).__name__ == "bool_" and bool(ok)
        return votes

    return decided(outcome, _Caught()(verdict))


# -- calibration: the acceptance threshold from labelled examples ----------------------------------------------------
def agreement(votes: Votes) -> float:
    """The share of the samples that gave the majority answer (unparsable samples count against it).

    The score ``calibrate_cascade`` thresholds: ``agreement(votes) >= 1``
    is ``unanimous``.

    Examples
    --------
    >>> agreement(Votes().added(["4", "4", "5", "4"])), agreement(Votes().added(["4", None])), agreement(Votes())
    (0.75, 0.5, 0.0)
    """
    leader = votes.leader
    return votes[leader] / votes.samples if leader is not None and votes.samples else 0.0


def at_least(threshold: float, score: Callable[[Votes], float] = agreement) -> Rule:
    """The rule ``score(votes) >= threshold``: an ``accept`` for ``cascade`` (what ``calibrate_cascade`` picks).

    Examples
    --------
    >>> rule = at_least(0.6)
    >>> rule(Votes().added(["4", "4", "5"])), rule(Votes().added(["4", "5"])), rule.__name__
    (True, False, 'at_least(0.6)')
    """

    def holds(votes: Votes) -> bool:
        return score(votes) >= threshold

    name = f"at_least({threshold:g}" + ("" if score is agreement else f", {getattr(score, '__name__', score)}") + ")"
    return _named(holds, name)


class CurvePoint(NamedTuple):
    """One threshold of a calibration: what the cascade would have reached on the labelled examples."""

    threshold: float
    """Accept at a stage when ``score(votes) >= threshold`` (``inf``: escalate everything to the last model)."""
    accuracy: float
    """The share of the examples answered right."""
    cost: float
    """The mean cost per example, in the unit of ``costs``."""
    escalated: float
    """The share of the examples that went past the first stage."""
    reached: tuple[float, ...] = ()
    """The share of the examples that reached each stage (1.0 for the first)."""


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate_cascade`` measured: the accuracy/cost curve, and the threshold it chose.

    Attributes
    ----------
    threshold
        The chosen threshold; ``accept`` is the rule to pass to ``cascade``.
    accuracy, cost, escalated
        What it reached on the examples at that threshold (the chosen point).
    curve
        Every threshold tried, lowest first, with its accuracy, mean cost
        per example and share escalated (of thresholds with the same
        outcome, the highest); the last point (``inf``) sends
        every example to the last model, the first accepts every answer of
        the first stage that has one.
    unit
        What ``cost`` counts: ``"cost"`` (money, from the models' prices) or
        ``"draws"`` (samples, where some model has no price).
    """

    threshold: float
    accuracy: float
    cost: float
    escalated: float
    curve: tuple[CurvePoint, ...]
    unit: str
    score: Callable[[Votes], float] = agreement
    #: The share of the examples that reached each stage at ``threshold``.
    reached: tuple[float, ...] = ()

    @property
    def accept(self) -> Rule:
        """The rule at the chosen threshold, for ``cascade(..., accept=)``."""
        return at_least(self.threshold, self.score)

    def expected_cost(self, elements: int) -> float:
        """The cost to expect running the calibrated cascade on ``elements`` questions like the examples.

        In the unit of ``cost``; ``explain``'s ``CascadeEstimate.expected_cost(calibration)``
        prices the same shares with the prompts and prices of a planned run.
        """
        return self.cost * elements


def calibrate(routes: Iterable[Route], labels: Iterable[Any], costs: Iterable[float], *,
              score: Callable[[Votes], float] = agreement, target_accuracy: float | None = None,
              target_cost: float | None = None, unit: str = "cost") -> Calibration:
    """Choose a cascade's threshold from routes that went through every stage, and the examples' right answers.

    The measuring half of ``calibrate_cascade``, on routes already
    computed (a cascade run with ``accept=lambda votes: False``): for each
    candidate threshold (each score seen), it replays the cascade on the
    recorded votes and measures its accuracy and mean cost; then picks the
    cheapest point that reaches ``target_accuracy``, or the most accurate
    one within ``target_cost`` (ties: the cheaper). Give exactly one target.

    Parameters
    ----------
    routes
        One ``Route`` per example, each holding every stage's ``Votes``.
    labels
        The right answer of each example (compared with ``==``).
    costs
        The cost of one example at each stage (per stage, in ``unit``).
    score, target_accuracy, target_cost, unit
        As for ``calibrate_cascade``.

    Returns
    -------
    Calibration

    Raises
    ------
    ValueError
        Without exactly one target, with no examples, as many labels as
        routes or one cost per stage; or when no point reaches the target
        (the message gives the best there is).

    Examples
    --------
    >>> sure, unsure = Votes().added(["4", "4"]), Votes().added(["1", "2"])
    >>> routes = [Route((sure, Votes().added(["4"]))), Route((unsure, Votes().added(["3"])))]
    >>> chosen = calibrate(routes, ["4", "3"], costs=[1, 20], target_accuracy=1.0)
    >>> chosen.threshold, chosen.cost, chosen.escalated
    (1.0, 11.0, 0.5)
    """
    routes, labels, costs = list(routes), list(labels), [float(c) for c in costs]
    if (target_accuracy is None) == (target_cost is None):
        raise ValueError("calibrate: give target_accuracy= or target_cost= (one of them)")
    if not routes or len(labels) != len(routes):
        raise ValueError(f"calibrate: {len(routes)} route(s) for {len(labels)} label(s); give one label per example")
    stages = len(costs)
    if any(len(route.stages) != stages for route in routes):
        raise ValueError(f"calibrate: every route must hold the {stages} stage(s) of costs= (run the cascade with "
                         "accept=lambda votes: False, so that every example reaches every stage)")
    scores = sorted({score(v) for route in routes for v in route.stages[:-1] if isinstance(v, Votes)})
    points: list[CurvePoint] = []
    for threshold in [*scores, math.inf]:
        point = _replayed(routes, labels, costs, score, threshold)
        if points and points[-1][1:] == point[1:]:  # the same outcome: keep the higher, surer threshold
            points.pop()
        points.append(point)
    curve = tuple(points)
    if target_accuracy is not None:
        fitting = [p for p in curve if p.accuracy >= target_accuracy]
        best = min(fitting, key=lambda p: (p.cost, -p.accuracy), default=None)
        wanted = f"accuracy {target_accuracy}"
    else:
        most = float(target_cost) if target_cost is not None else math.inf
        fitting = [p for p in curve if p.cost <= most]
        best = max(fitting, key=lambda p: (p.accuracy, -p.cost), default=None)
        wanted = f"a cost of {target_cost}"
    if best is None:
        top = max(curve, key=lambda p: p.accuracy)
        cheap = min(curve, key=lambda p: p.cost)
        raise ValueError(f"calibrate: no threshold reaches {wanted} on these {len(routes)} example(s): the most "
                         f"accurate reaches {top.accuracy:.4g} at a cost of {top.cost:.4g}, the cheapest costs "
                         f"{cheap.cost:.4g} at {cheap.accuracy:.4g}")
    return Calibration(best.threshold, best.accuracy, best.cost, best.escalated, curve, unit, score, best.reached)


def _replayed(routes: list[Route], labels: list[Any], costs: list[float], score: Callable[[Votes], float],
              threshold: float) -> CurvePoint:
    """The cascade at ``threshold`` replayed on the recorded votes: its accuracy, mean cost, share escalated."""
    right = spent = escalated = 0.0
    last = len(costs) - 1
    reached = [0] * len(costs)
    for route, label in zip(routes, labels):
        for stage, votes in enumerate(route.stages):
            spent += costs[stage]
            reached[stage] += 1
            answered = isinstance(votes, Votes) and votes.leader is not None
            if stage == last or (answered and score(votes) >= threshold):
                right += answered and votes.leader == label
                escalated += stage > 0
                break
    count = len(routes)
    return CurvePoint(threshold, right / count, spent / count, escalated / count, tuple(r / count for r in reached))


def calibrate_cascade(
    prompt: Any,
    labels: Iterable[Any],
    models: Any,
    *,
    samples: int | Iterable[int] = 3,
    parse: Callable[[Any], Any] | None = None,
    score: Callable[[Votes], float] = agreement,
    target_accuracy: float | None = None,
    target_cost: float | None = None,
    costs: Iterable[float] | None = None,
    **options: Any,
) -> Calibration:
    """Choose the acceptance threshold of a cascade from labelled examples, for a target accuracy or cost.

    As RouteLLM calibrates its router: run every example through every
    stage once (``cascade`` with an ``accept`` that never holds), then
    replay the cascade on those votes for each threshold of ``score`` (by
    default ``agreement``, the share of samples that gave the majority
    answer) and measure accuracy and mean cost per example. It returns the
    curve and the threshold that reaches ``target_accuracy`` at the lowest
    cost, or the best accuracy within ``target_cost``; pass
    ``calibration.accept`` to ``cascade`` with the same models and
    samples. The draws are cached like any: the calibrated cascade re-run
    on the same examples pays nothing.

    Parameters
    ----------
    prompt
        The examples' prompts (any shape; one label each, in order).
    labels
        Their right answers, as ``parse`` gives them.
    models, samples, parse
        As for ``cascade`` (stages that draw once: no ``max_samples``).
    score
        ``votes -> float``, higher when a stage is surer (default ``agreement``).
    target_accuracy
        The share of examples to answer right; the cheapest threshold that does wins.
    target_cost
        The most to spend per example on average (in the unit of ``costs``);
        the most accurate threshold within it wins.
    costs
        The cost of one example at each stage. Default: measured on the run
        (``Trace.cost`` of each stage's model over the examples it answered),
        or the samples per stage where a model has no price (``unit`` says which).
    **options
        Passed to ``outlines.eval`` (``cache=``, ``jobs=``, ``budget=``...).

    Returns
    -------
    Calibration
        ``threshold``, ``accept`` (the rule), ``accuracy`` and ``cost`` at
        it, and ``curve``: every threshold tried.

    Raises
    ------
    ValueError
        As ``calibrate``; ``GraphBuildError`` as ``cascade``.

    Examples
    --------
    >>> import outlines
    >>> from outlines import models
    >>> small = models.from_function(lambda p: "4" if "2 + 2" in p else "7", name="small-calibrated")
    >>> strong = models.from_function(lambda p: "4" if "2 + 2" in p else "5", name="strong-calibrated")
    >>> calibration = outlines.calibrate_cascade(["2 + 2?", "2 + 3?"], [4, 5], [small, strong], parse=int,
    ...                                          target_accuracy=1.0, costs=[1, 20], cache=False)
    >>> [(p.threshold, p.accuracy, p.cost) for p in calibration.curve]
    [(1.0, 0.5, 1.0), (inf, 1.0, 21.0)]
    """
    from outlines.runtime.evaluate import eval as evaluate
    from outlines.runtime.tracing import trace

    never = _named(lambda votes: False, "never")
    result = cascade(prompt, models, samples=samples, parse=parse, accept=never)
    with trace() as traced:
        routes = evaluate(result.route, **options)
    flat = list(np.asarray(routes, dtype=object).reshape(-1))
    failed = [route for route in flat if not isinstance(route, Route)]
    if failed:
        raise ValueError(f"calibrate_cascade: {len(failed)} example(s) failed: {failed[0]}")
    unit = "cost"
    if costs is None:
        costs, unit = _measured_costs(traced, result, flat)
    return calibrate(flat, labels, costs, score=score, target_accuracy=target_accuracy, target_cost=target_cost,
                     unit=unit)


def _measured_costs(traced: Any, result: Cascade, routes: list[Route]) -> tuple[list[float], str]:
    """Each stage's cost per example, from the trace: money where every stage has its own priced backend, else samples."""
    stages = traced.cascades()
    spent = traced.cost_per_backend()
    backends = [stage.get("backend") for stage in stages]
    money = [float(m) for m in (spent.get(backend) for backend in backends) if m is not None]
    if stages and len(set(backends)) == len(backends) and len(money) == len(stages):
        return [m / max(1, stage["reached"]) for m, stage in zip(money, stages)], "cost"
    return [float(votes.samples) if isinstance(votes, Votes) else 0.0 for votes in routes[0].stages], "draws"
