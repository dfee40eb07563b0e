"""Sibling chains stacked into array nodes by ``Plan`` (what ``outlines.eval`` plans).

Stacking must be invisible but for speed: the same values, batches, draw
numbers, cache entries and failure labels as the unstacked plan.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.cache import Cache
from outlines.common.errors import Failure, GraphBuildError, NodeError
from outlines.runtime import plan as plan_module
from outlines.runtime.plan import Plan
from tests.fixtures.recording import RecordingBackend

STACK_MIN = outlines.common.config.Tuning.stack_min
N = STACK_MIN + 22


@pytest.fixture(autouse=True)
def _own_state(fresh_state: Any) -> None:
    """Tests set the process's tuning (``stacking``): each in a process state of its own."""


def stacking(stack: bool) -> None:
    """Evaluations from now on stack families as usual (``stack``), or never."""
    outlines.common.config.set_tuning(stack_min=STACK_MIN if stack else 10**9)


def chains(llm: Any, n: int = N, depth: int = 3, prefix: str = "Q") -> list[Any]:
    outs = []
    for i in range(n):
        x: Any = outlines.constant(f"{prefix}{i}:")
        for _ in range(depth):
            x = llm(x)
        outs.append(x)
    return outs


def observe(build: Callable[[Any], list[Any]], tmp_path: Path, stack: bool, monkeypatch: pytest.MonkeyPatch,
            **options: Any) -> tuple[Any, ...]:
    """Values (failures without creation numbers), batches and cache counts of two evals, stacked or not."""
    stacking(stack)
    backend = RecordingBackend(name="stack")
    llm = backend.model(temperature=0.7)
    cache = Cache(tmp_path / ("stacked" if stack else "flat"))
    seen = []
    for _ in range(2):  # cold, then warm
        with outlines.trace() as trace:
            values = outlines.eval(*build(llm), cache=cache, **options)
        seen.append(([_plain(v) for v in values], trace.cache_hits, trace.cache_misses))
        cache.flush()
    return tuple(seen), backend.batches


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, Failure):
        return "failure", value.error_type, re.sub(r"#\d+", "#N", value.message)
    return value


def test_chains_plan_as_one_node_per_step() -> None:
    llm = RecordingBackend(name="plan").model()
    outs = chains(llm)
    plan = Plan(outs)
    assert len(plan.nodes) == 3 and plan.indegree == [0, 1, 1]
    assert set(plan.picks) == set(range(N)) and [k for _, k in plan.picks.values()] == list(range(N))
    assert [m.label for m in plan.members[id(plan.nodes[0])]] == [o.owner.inputs[0].owner.inputs[0].owner.label
                                                                  for o in outs]
    assert len(Plan(outs, stack_min=10**9).nodes) == 3 * N  # too few to stack: one node per call
    tapped = outs + [outlines.fn(str.upper)(outs[5].owner.inputs[0]), outlines.fn(str.lower)(outs[5])]
    plan = Plan(tapped)  # a node left out reads its element, which the stacked node scatters
    assert [n.op.name for n in plan.nodes][3:] == ["upper", "lower"] and len(plan.nodes) == 5
    assert plan.nodes[3] is tapped[-2].owner and plan.nodes[4] is tapped[-1].owner  # kept as built
    assert plan.scatter == {id(plan.nodes[1]): [(outs[5].owner.inputs[0], 5)], id(plan.nodes[2]): [(outs[5], 5)]}
    assert plan.consumers[1] == [2, 3] and plan.consumers[2] == [4]
    assert len(Plan(chains(llm, n=STACK_MIN - 1)).nodes) == 3 * (STACK_MIN - 1)


@pytest.mark.parametrize("shape", ["chains", "tapped", "ragged", "samples", "repeated", "mixed-ops"])
def test_stacked_and_flat_plans_evaluate_alike(shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def build(llm: Any) -> list[Any]:
        outs = chains(llm)
        if shape == "tapped":  # one middle value feeds a Python step: its families stay flat
            middle = outs[5].owner.inputs[0]
            outs.append(outlines.fn(str.upper)(middle))
        elif shape == "ragged":  # some chains one step longer: not member for member
            outs += [llm(o) for o in outs[::7]]
        elif shape == "samples":  # calls with samples are never stacked
            outs += [llm(outlines.constant(f"S{i}"), num_samples=2) for i in range(N)]
        elif shape == "repeated":  # the same prompt twice draws twice (draw offsets): left flat
            outs += chains(llm, prefix="Q", depth=1)
        elif shape == "mixed-ops":
            other = llm.backend.model(temperature=0.1)
            outs += chains(other, depth=2, prefix="M")
        return outs

    flat = observe(build, tmp_path, False, monkeypatch)
    stacked = observe(build, tmp_path, True, monkeypatch)
    assert stacked == flat
    (cold, _, misses), (warm, hits, _) = flat[0]
    assert warm == cold and hits == misses > 0


def test_a_failing_call_is_named_as_in_the_flat_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def picky(prompt: str) -> str:
        if prompt == "Q7:.":
            raise ValueError("no sevens")
        return prompt + "."

    llm = models.from_function(picky, name="picky")
    outs = chains(llm)
    failing = outs[7].owner.inputs[0].owner  # the second call of chain 7
    for stack in (False, True):
        stacking(stack)
        values = outlines.eval(*outs, cache=False, errors="return")
        assert isinstance(values[7], Failure) and failing.label in values[7].message
        assert [i for i, v in enumerate(values) if isinstance(v, Failure)] == [7]
        with pytest.raises(NodeError, match=re.escape(failing.label)):
            outlines.eval(*outs, cache=False)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(STACK_MIN, STACK_MIN + 40),
    depth=st.integers(1, 3),
    taps=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 2)), max_size=3),
)
def test_stacking_equals_sequential_evaluation(n: int, depth: int, taps: list[tuple[int, int]],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    backend = RecordingBackend(name="property")
    llm = backend.model()
    outs = chains(llm, n=n, depth=depth)
    for chain, step in taps:  # a Python step reads some chain's value at some depth
        x = outs[chain % n]
        for _ in range(min(step, depth - 1)):
            x = x.owner.inputs[0]
        outs.append(outlines.fn(str.upper)(x))
    expected = []
    for i in range(n):
        text = f"Q{i}:"
        for _ in range(depth):
            text += "."
        expected.append(text)
    values = outlines.eval(*outs, cache=False)
    assert list(values[:n]) == expected
    for (chain, step), value in zip(taps, values[n:]):
        assert value == (f"Q{chain % n}:" + "." * (depth - min(step, depth - 1))).upper()
    assert len(backend.batches) == depth  # one batch per step, stacked or not


# -- one rule for every pure elementwise op ----------------------------------------------------------

@outlines.prompt
def _again(v):
    """Say {{ v }} again"""


def _shout(text: str) -> str:
    if "7" in text[-6:]:
        raise ValueError(f"no sevens in {text[-6:]!r}")
    return text.upper()


async def _quiet(text: str) -> str:
    return text.lower()


_SHOUT = outlines.fn(_shout, pure=True)
_QUIET = outlines.fn(_quiet, pure=True)
_TRIM = outlines.fn(lambda text: text[-12:], signature="()->()", pure=True, name="trim")
_FORK = np.array(["<", ">"], dtype=object)
_SHORT = outlines.fn(lambda s: s.count("~") + s.count(".") < 1 + len(s) % 3, name="short", pure=True)
_EVEN = outlines.fn(lambda s: len(s) % 2 == 0, name="even", pure=True)
_FEW = outlines.fn(lambda s: s.count("~") < 2 + len(s) % 2, name="few", pure=True)  # one step, odd ones two
_IMPURE = outlines.fn(lambda s: s + "'", name="impure")  # not declared pure: its uses stay one node each
#: One step of every chain: (name, how a step builds on x for chain i).
_STEPS: dict[str, Callable[[Any, Any, int], Any]] = {
    "llm": lambda llm, x, i: llm(x),
    "template": lambda llm, x, i: _again(x),
    "concat-shared": lambda llm, x, i: x + "a",
    "concat-own": lambda llm, x, i: outlines.constant(f"[{i % 5}]") + x,
    "fn": lambda llm, x, i: _SHOUT(x),
    "async-fn": lambda llm, x, i: _QUIET(x),
    "gufunc": lambda llm, x, i: _TRIM(x),
    "impure": lambda llm, x, i: _IMPURE(x),
    "index": lambda llm, x, i: (x + outlines.constant(_FORK))[1],
    "loop": lambda llm, x, i: outlines.while_loop(_SHORT, lambda s: _SHOUT(llm(s)), init=x, max_iter=3),
    "cond": lambda llm, x, i: outlines.cond(_EVEN(x), lambda s: llm(s + " even"), lambda s: s + " odd", x),
}


class _Picky:
    """A model function that fails its own element only (a batch holding it does not fail) and records prompts."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if prompt.endswith("3:"):
            raise RuntimeError("the model refuses threes")
        return prompt + "."


def _relative(value: Any, base: int) -> Any:
    """A value with creation numbers made relative to the first node of its build (two builds compare)."""
    if isinstance(value, np.ndarray):
        return [_relative(v, base) for v in value.reshape(-1).tolist()]
    if isinstance(value, Failure):
        shift = lambda text: re.sub(r"#(\d+)", lambda m: f"#{int(m.group(1)) - base}", text)  # noqa: E731
        return "failure", shift(value.node), value.error_type, shift(value.message)
    return value


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(STACK_MIN, STACK_MIN + 8),
    steps=st.lists(st.sampled_from(sorted(_STEPS)), min_size=1, max_size=4),
    taps=st.lists(st.integers(0, 10**6), max_size=2),
)
@example(n=STACK_MIN, steps=["loop", "cond", "llm"], taps=[3])  # loops and conds on loops' results, read by a tap
@example(n=STACK_MIN + 1, steps=["template", "loop", "loop"], taps=[])
def test_stacked_equals_unstacked_over_mixed_ops(n: int, steps: list[str], taps: list[int],
                                                 tmp_path_factory: pytest.TempPathFactory,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Values, failures and their labels, prompts sent and cache hits: the same whether stacked or not.

    With errors="raise" the node named is one whose own element failed (which one comes first in
    the flat plan depends on when its Python steps finish; the stacked plan names the first).
    """
    root = tmp_path_factory.mktemp("mixed")
    seen = []
    for stack in (False, True):
        stacking(stack)
        picky = _Picky()
        llm = models.from_function(picky, name="mixed")
        cache = Cache(root / str(stack))
        runs: list[Any] = []
        for errors in ("return", "return", "raise"):  # cold, warm, then raising
            base = outlines.constant("x")
            first = llm(base).owner.order  # creation numbers of this build start here
            outs = []
            for i in range(n):
                x: Any = outlines.constant(f"Q{i}:")
                for step in steps:
                    x = _STEPS[step](llm, x, i)
                outs.append(llm(x))
            outs += [outlines.fn(str.title)(outs[t % n]) for t in taps]  # a node left out reads an element
            if stack:
                _assert_topological(Plan(outs))
            if errors == "raise":
                sent = sorted(picky.prompts)  # what a raising run sends before it stops is timing
                own = {v[1] for v in runs[0][0] if isinstance(v, tuple) and v[2] != "UpstreamFailure"}
                own |= {re.search(r"at (\S+):", v[3]).group(1)  # type: ignore[union-attr]
                        for v in runs[0][0] if isinstance(v, tuple) and v[2] == "UpstreamFailure"}
                try:
                    outlines.eval(*outs, cache=cache)
                    assert not own
                except NodeError as exc:
                    while isinstance(exc.cause, NodeError):  # a loop's error: the node failing inside it
                        exc = exc.cause
                    assert _relative(Failure(exc.node, exc.op, "", ""), first)[1] in own
                continue
            with outlines.trace() as trace:
                values = [_relative(v, first) for v in outlines.eval(*outs, cache=cache, errors=errors)]
            runs.append((values, trace.cache_hits, trace.cache_misses))
            cache.flush()
        # the same prompts sent either way (how the flat plan's calls split into batches depends on when
        # its Python steps finish: timing, not stacking)
        seen.append((runs, sent))
    assert seen[1] == seen[0]


def test_impure_steps_stack_but_never_merge() -> None:
    """An impure step's uses stack like a pure one's; two equal uses on one input stay two (pure ones: one)."""
    llm = RecordingBackend(name="impure").model()
    impure = outlines.fn(lambda text: text + "!", name="impure")  # pure=False: the default
    pure = outlines.fn(lambda text: text + "!", name="pure", pure=True)
    for step, twice in ((impure, 2), (pure, 1)):
        built = [step(llm(outlines.constant(f"Q{i}"))) for i in range(N)]
        outs = [llm(b) for b in built] + [llm(step(b.owner.inputs[0]) + "?") for b in built]  # each step again
        plan = Plan(outs)
        nodes = plan.nodes
        steps = [node for node in nodes if node.op.name == step.__name__]
        assert len(steps) == twice and all(len(plan.members[id(node)]) == N for node in steps)
        assert [m.label for m in plan.members[id(steps[0])]] == [b.owner.label for b in built]
        assert sum(node.op.name.startswith("Generate") for node in nodes) == 3
        assert not plan.scatter
        _assert_topological(plan)


def _assert_topological(plan: Plan) -> None:
    """Each node of ``plan`` comes after every node it waits for, and waits once for each."""
    for index, consumers in enumerate(plan.consumers):
        assert all(consumer > index for consumer in consumers)
    assert [sum(i in c for c in plan.consumers) for i in range(len(plan.nodes))] == plan.indegree


@pytest.mark.parametrize("fault", ["raises", "not-text"])
def test_impure_steps_between_stacked_calls_run_once_and_fail_as_themselves(
        fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Gathered: each use runs once; a failing one (or a value no call can send) fails its own chain as flat."""
    calls: list[str] = []

    def step(text: str) -> Any:
        calls.append(text)
        if text.startswith("Q7:"):
            if fault == "raises":
                raise ValueError("no sevens")
            return ["not", "text"]
        return text + "?"

    impure = outlines.fn(step, name="step")

    def build(llm: Any) -> list[Any]:
        return [llm(impure(llm(outlines.constant(f"Q{i}:")))) for i in range(N)]

    flat = observe(build, tmp_path, False, monkeypatch, errors="return")
    flat_calls, calls[:] = sorted(calls), []
    stacked = observe(build, tmp_path, True, monkeypatch, errors="return")
    assert stacked[0] == flat[0] and sorted(calls) == flat_calls  # twice each (cold, warm): impure steps are not cached
    # the same prompts sent (the flat plan's second calls split into batches as its steps finish: timing)
    assert sorted(p for b in stacked[1] for p in b) == sorted(p for b in flat[1] for p in b)
    assert len(calls) == 2 * N
    values = stacked[0][0][0]
    assert [i for i, v in enumerate(values) if isinstance(v, tuple)] == [7]
    backend = RecordingBackend(name="raise")
    outs = build(backend.model())
    named = outs[7].owner.inputs[0].owner if fault == "raises" else outs[7].owner
    with pytest.raises(NodeError, match=re.escape(named.label)):
        outlines.eval(*outs, cache=False)
    got = outlines.eval(*outs, cache=False, errors="return")
    assert isinstance(got[7], Failure) and got[7].root.node == named.label
    assert backend.sizes == [N - 1, N, N]  # raising: the first call only; returning: both, the second without chain 7


def test_stacked_ops_run_in_bulk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step of template, +, fn and index chains is one node over the arrays of its members."""
    llm = RecordingBackend(name="bulk").model()
    outs, concats = [], []
    for i in range(N):
        x: Any = outlines.constant(f"Q{i}:")
        for step in ("llm", "template", "llm", "concat-own", "fn", "async-fn", "gufunc", "index", "llm"):
            x = _STEPS[step](llm, x, i)
            if step == "concat-own":
                concats.append(x.owner)
        outs.append(x)
    plan = Plan(outs)
    assert [n.op.name for n in plan.nodes] == [
        "Generate[recording:bulk]", "Render[_again]", "Generate[recording:bulk]", "Concat", "_shout", "_quiet",
        "trim", "Concat", "Index[:, 1]", "Generate[recording:bulk]",
    ]
    assert plan.members[id(plan.nodes[3])] == concats  # failures name them
    assert plan.nodes[3].inputs[0].value.tolist() == [f"[{i % 5}]" for i in range(N)]  # its members' constants
    assert plan.nodes[7].inputs[1].value.shape == (N, 2)  # array constants stack along the new axis


def test_a_stacked_node_failing_whole_fails_each_member_as_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = RecordingBackend(name="whole").model()
    outs = [llm(llm(outlines.constant(f"Q{i}")) + "a") for i in range(N)]

    def broken(self: Any, *values: Any, **guards: Any) -> Any:
        raise RuntimeError("broken as a whole")

    monkeypatch.setattr(outlines.graph.ops.Concat, "perform", broken)
    values = outlines.eval(*outs, cache=False, errors="return")
    for out, value in zip(outs, values):
        assert isinstance(value, Failure) and value.root.node == out.owner.inputs[0].owner.label


def test_structured_parses_stack_and_fail_as_their_own_call() -> None:
    def reply(prompt: str) -> str:
        return "not json" if prompt == "Q7" else '{"a": "%s"}' % prompt

    llm = models.from_function(reply, name="json")
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    outs = [llm(outlines.constant(f"Q{i}"), json_schema=schema) for i in range(N)]
    assert [n.op.name for n in Plan(outs).nodes] == ["Generate[function:json]", "Parse[json]"]
    values = outlines.eval(*outs, cache=False, errors="return", progress=False)
    assert values[0] == {"a": "Q0"} and values[7].node == outs[7].owner.label
    assert [i for i, v in enumerate(values) if isinstance(v, Failure)] == [7]


# -- stacking from the families noted at build time (outlines.graph.families) --------------------------

def _no_walk(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the plan walked the graph node by node")


@pytest.mark.parametrize("steps", [
    ("llm", "template", "llm", "concat-own", "concat-shared", "fn", "async-fn", "gufunc", "index", "llm"),
    ("llm", "impure", "llm", "impure", "template", "llm"),  # the shape users write: an impure step, stacked
    ("impure", "impure", "llm", "impure"),  # on constants, on each other, and as the outputs
], ids=["pure", "impure", "impure-ends"])
def test_eval_stacks_from_the_families_noted_at_build_without_walking_the_graph(
        steps: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def build(llm: Any) -> list[Any]:
        probe = llm(outlines.constant("built before the loop"))  # shifts every family after it
        outs = [probe]
        for i in range(N):
            x: Any = outlines.constant(f"Q{i}:")
            for step in steps:
                x = _STEPS[step](llm, x, i)
            outs.append(x)
        return outs[1:]

    flat = observe(build, tmp_path, False, monkeypatch, errors="return")
    monkeypatch.setattr(plan_module, "toposort", _no_walk)
    stacked = observe(build, tmp_path, True, monkeypatch, errors="return")
    (cold, warm), (flat_cold, flat_warm) = stacked[0], flat[0]
    assert cold[0] == flat_cold[0] and warm == flat_warm  # values, failures and their labels; warm: all hits
    # as many draws asked cold (chains whose trimmed prompts coincide share a draw: the flat plan counts
    # a copy sent in a later batch as a hit, which batch depends on when its async step finishes)
    assert cold[1] + cold[2] == flat_cold[1] + flat_cold[2]
    # the same prompts sent (how the flat plan's calls split into batches depends on when its async
    # step finishes), and stacked: one batch per call of the chains, cold (none warm)
    assert sorted(p for batch in stacked[1] for p in batch) == sorted(p for batch in flat[1] for p in batch)
    assert len(stacked[1]) == steps.count("llm")
    if "impure" in steps:
        plan = Plan(build(RecordingBackend(name="noted").model()))
        impure = [node for node in plan.nodes if node.op.name == "impure"]
        assert len(impure) == steps.count("impure") and len(plan.nodes) == len(steps)  # one stacked node per step
        assert all(len(plan.members[id(node)]) == N for node in impure)
        _assert_topological(plan)


def test_a_member_rewired_after_it_was_built_is_planned_by_the_walk() -> None:
    llm = RecordingBackend(name="rewired").model()
    outs = chains(llm)
    outs[3].owner.inputs = (outs[2].owner.inputs[0],)  # chain 3's last call now reads chain 2's second
    values = outlines.eval(*outs, cache=False)
    assert values[3] == values[2] == "Q2:..."
    assert values[5] == "Q5:..."
    later = llm(outlines.constant("later"))
    outs[6].owner.inputs[0].owner.inputs = (later,)  # reads a node built after it: the walk names it
    with pytest.raises(GraphBuildError, match="built after it"):
        outlines.eval(*outs, cache=False)


@pytest.mark.parametrize("shape", ["repeated-prompts", "twin-models", "some-chains", "two-ranges"])
def test_what_the_walk_would_rewrite_is_left_to_it(shape: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Values, batches and cache counts as the flat plan's, where a family plan would go wrong."""
    def build(llm: Any) -> list[Any]:
        if shape == "repeated-prompts":  # a prompt asked twice draws twice (draw numbers apart)
            return [llm(llm(outlines.constant(f"Q{i % 50}"))) for i in range(N)]
        if shape == "twin-models":  # an equal model's calls on the same prompts: numbered apart too
            twin = llm.backend.model(temperature=0.7)
            firsts = [llm(outlines.constant(f"Q{i}")) for i in range(N)]
            return [llm(x) for x in firsts] + [twin(x) for x in firsts]
        outs = chains(llm)
        if shape == "some-chains":  # the first calls of the chains left out are not evaluated
            return outs[: N // 2]
        return outs[:STACK_MIN] + [o.owner.inputs[0] for o in outs[STACK_MIN:]]  # two ranges: a gap in each

    flat = observe(build, tmp_path, False, monkeypatch)
    stacked = observe(build, tmp_path, True, monkeypatch)
    assert stacked == flat


# -- loops and conds whose bodies are elementwise ------------------------------------------------------

class _Numbered(RecordingBackend):
    """Replies with the prompt and its draw number: a draw in the wrong namespace shows in the value."""

    async def generate(self, draws: Any, report: Any) -> list[str]:
        self.batches.append([d.prompt for d in draws])
        return [f"{d.prompt}~{d.draw}." for d in draws]


def _loops(llm: Any, n: int, *, body: Callable[[Any], Any] | None = None, max_iter: int = 4,
           on_max_iter: str = "keep", cond: Any = _SHORT) -> list[Any]:
    """n chains: a call, a loop calling the model until its text is long enough, a call on the result."""
    outs = []
    for i in range(n):
        x = llm(outlines.constant(f"Q{i}:"))
        y = outlines.while_loop(cond, body or (lambda s: _again(llm(s))), init=x, max_iter=max_iter,
                                on_max_iter=on_max_iter)
        outs.append(llm(y))
    return outs


def _conds(llm: Any, n: int) -> list[Any]:
    """n chains: a call, a cond asking the model one of two ways, a call on the result."""
    outs = []
    for i in range(n):
        x = llm(outlines.constant(f"Q{i}:"))
        y = outlines.cond(_EVEN(x), lambda s: llm(s + " even"), lambda s: _QUIET(llm(s + " odd")), x)
        outs.append(llm(y))
    return outs


def _same(llm: Any, n: int) -> list[Any]:
    """n loops on one shared constant: each its own element, in its own namespace."""
    return [llm(outlines.while_loop(_SHORT, llm, init=outlines.constant("same"), max_iter=3)) for _ in range(n)]


@pytest.mark.parametrize("build", [_loops, _conds, _same], ids=["loop", "cond", "one-constant"])
def test_loops_and_conds_of_one_structure_stack_into_one_node(build: Callable[..., list[Any]]) -> None:
    llm = _Numbered(name="kinds").model(temperature=0.7)
    outs = build(llm, N)
    plan = Plan(outs)
    expected = {_loops: ["generate", "control", "generate"], _same: ["control", "generate"],
                _conds: ["generate", "python", "control", "generate"]}[build]  # a cond's predicate: a step of its own
    assert [node.op.traits.run for node in plan.nodes] == expected
    control = plan.nodes[-2]
    assert len(plan.members[id(control)]) == N
    step = {_loops: 5, _same: 4, _conds: 1}[build]  # a loop takes max_iter + 1 namespace tags, a cond one
    assert plan.element_tags[id(control)].tolist() == [step * i for i in range(N)]


@pytest.mark.parametrize("build", [_loops, _conds, _same], ids=["loop", "cond", "one-constant"])
@pytest.mark.parametrize("temperature", [0.7, 0.0], ids=["random", "greedy"])
def test_stacked_loops_and_conds_equal_the_flat_ones(build: Callable[..., list[Any]], temperature: float,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values (each element in its own loop's draw namespaces), cache keys and counts: as run one by one."""
    cache = Cache(tmp_path / "shared")
    seen = []
    for stack in (False, True):
        stacking(stack)
        backend = _Numbered(name="kinds")
        llm = backend.model(temperature=temperature)
        with outlines.trace() as trace:
            values = outlines.eval(*build(llm, N), cache=cache)
        cache.flush()
        seen.append((values, trace.cache_hits, trace.cache_misses, backend.batches))
    (flat, flat_hits, misses, flat_batches), (stacked, hits, stacked_misses, batches) = seen
    assert list(stacked) == list(flat)
    assert len(set(flat)) == (1 if build is _same and not temperature else N)  # greedy loops on one text agree
    # every draw of the stacked run hit the flat run's keys (greedy loops of the flat run may hit each other's)
    assert (hits, stacked_misses, batches) == (flat_hits + misses, 0, [])
    if temperature:
        assert any(re.search(r"~[1-9]", v) for v in flat)  # draws in namespaces other than the outer one were asked


@pytest.mark.parametrize("build", [_loops, _conds], ids=["loop", "cond"])
def test_stacked_loops_and_conds_send_a_few_batches(build: Callable[..., list[Any]]) -> None:
    backend = _Numbered(name="few")
    outs = build(backend.model(temperature=0.7), N)
    values = outlines.eval(*outs, cache=False)
    assert len(values) == N
    # first call, at most max_iter loop iterations (a cond: one batch per branch), last call
    assert len(backend.batches) <= (6 if build is _loops else 4)


def _sevens(prompt: str) -> str:
    if "7" in prompt[-8:]:
        raise RuntimeError(f"the model refuses {prompt[-8:]!r}")
    return prompt + "."


@pytest.mark.parametrize("failing", ["step", "call"])
def test_a_failing_element_of_a_stacked_loop_names_its_own_loop_and_call(failing: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    labels = {}
    for stack in (False, True):
        stacking(stack)
        llm = _Numbered(name="fails").model(temperature=0.7)
        sevens = models.from_function(_sevens, name="sevens")  # fails its own element, draw by draw
        first = llm(outlines.constant("x")).owner.order
        if failing == "step":
            body = lambda s: _again(_SHOUT(llm(s)))  # noqa: E731 - _shout refuses a 7 near the end
        else:
            body = lambda s: _again(sevens(llm(s)))  # noqa: E731
        outs = _loops(llm, N, body=body)
        values = outlines.eval(*outs, cache=False, errors="return")
        failed = [_relative(v, first) for v in values if isinstance(v, Failure)]
        assert failed
        with pytest.raises(NodeError) as info:
            outlines.eval(*outs, cache=False)
        own = {f[1] for f in failed} | {re.search(r"at (\S+):", f[3]).group(1) for f in failed}  # type: ignore[union-attr]
        loop = _relative(Failure(info.value.node, "", "", ""), first)[1]
        inner = _relative(Failure(info.value.cause.node, "", "", ""), first)[1]  # type: ignore[attr-defined]
        assert loop.startswith("while_loop#") and inner.startswith(("_shout#", "Generate[function:sevens]#"))
        assert inner in own and 0 < int(loop.split("#")[1]) - int(inner.split("#")[1]) < 8  # the loop tracing it
        labels[stack] = failed
    assert labels[True] == labels[False]


@pytest.mark.parametrize("on_max_iter", ["keep", "fail"])
def test_stacked_loops_count_and_fail_the_elements_max_iter_stopped_per_loop(
        on_max_iter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    for stack in (False, True):
        stacking(stack)
        llm = _Numbered(name="limited").model(temperature=0.7)
        first = llm(outlines.constant("x")).owner.order
        outs = _loops(llm, N, max_iter=1, on_max_iter=on_max_iter, cond=_FEW)
        plan = Plan(outs, stack_min=outlines.common.config.current_tuning().stack_min)
        assert sum(node.op.traits.run == "control" for node in plan.nodes) == (1 if stack else N)
        with outlines.trace() as trace:
            values = outlines.eval(*outs, cache=False, errors="return")
        limited = {_relative(Failure(loop, "", "", ""), first)[1]: counts
                   for loop, counts in trace.loops_limited.items()}
        assert 0 < len(limited) < N and all(c == {"stopped": 1, "elements": 1, "max_iter": 1}
                                            for c in limited.values())
        failed = [_relative(v.root, first) for v in values if isinstance(v, Failure)]  # the loop's, not the call's
        assert len(failed) == (len(limited) if on_max_iter == "fail" else 0)
        assert all(f[2] == "MaxIterError" for f in failed) and {f[1] for f in failed} == (set(limited) if failed else set())
        seen.append((limited, failed, [v for v in values if not isinstance(v, Failure)]))
    assert seen[0] == seen[1]  # per loop, as run one by one


def test_loops_that_cannot_stack_run_one_by_one() -> None:
    llm = _Numbered(name="alone").model(temperature=0.7)
    impure = outlines.fn(lambda s: s + "!", name="impure")
    for body in (lambda s: impure(llm(s)), lambda s: outlines.while_loop(_SHORT, llm, init=s, max_iter=2),
                 lambda s: llm(s) + llm(outlines.constant("the same prompt"))):
        plan = Plan(_loops(llm, N, body=body))
        assert sum(node.op.traits.run == "control" for node in plan.nodes) == N
