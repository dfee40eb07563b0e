"""Adaptive voting: sample answers iteration by iteration, per element, until a stopping rule is met.

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
"""
from __future__ import annotations

import collections
import math
import warnings
from typing import Any, Callable, Iterable, NamedTuple, Optional

import numpy as np

from outlines.common.errors import GraphBuildError
from outlines.fn import fn
from outlines.graph.basic import Variable, as_variable
from outlines.graph.control import while_loop

__all__ = [
    "Rule",
    "TopTwoRule",
    "Vote",
    "Votes",
    "leader_probability",
    "stop_when_ahead",
    "stop_when_confident",
    "stop_when_iteration_agrees",
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
