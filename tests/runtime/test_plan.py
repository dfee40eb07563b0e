"""The plan's one pass: merge identical pure subgraphs, fold constant inline ops, number draws."""
from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import outlines
from outlines import models
from outlines.common.errors import GraphBuildError
from outlines.graph.basic import Apply, Constant, Op, Variable
from outlines.graph.ops import Concat, Stack, broadcast_map
from outlines.graph.traits import Run, Traits
from outlines.graph.traversal import applies, graph_inputs
from outlines.runtime.plan import Plan
from tests.fixtures.graphs import rewired_cycle


class Upper(Op):
    """A pure inline op (elementwise)."""

    def perform(self, value):  # noqa: ANN001, ANN201
        return broadcast_map(str.upper, [value])


class Fails(Op):
    def perform(self, value):  # noqa: ANN001, ANN201
        raise ValueError("boom")


class Impure(Op):
    traits = Traits(pure=False)

    def perform(self, value):  # noqa: ANN001, ANN201
        return value


class Pair(Op):
    """A pure op with two outputs."""

    def make_node(self, *inputs):  # noqa: ANN002, ANN201
        return Apply(self, [Constant(x) if not isinstance(x, Variable) else x for x in inputs], 2)

    def perform(self, value):  # noqa: ANN001, ANN201
        return value, value


def echo(prompt: str) -> str:
    return prompt


def _rewrite(outputs: list[Variable]) -> list[Variable]:
    return Plan(outputs).outputs


@pytest.fixture
def llm():  # noqa: ANN201
    return models.from_function(echo)


def test_nothing_to_do_returns_the_same_objects() -> None:
    question = Variable(name="question")
    out = question + "?"
    assert _rewrite([out])[0] is out
    assert _rewrite([question])[0] is question


def test_identical_pure_subgraphs_merge() -> None:
    question = Variable(name="question")
    first, second = Upper()(question + " A:"), Upper()(question + " A:")
    merged_first, merged_second = _rewrite([first, second])
    assert merged_first is merged_second
    assert len(applies([merged_first])) == 2
    assert graph_inputs([merged_first]) == [question]


def test_merge_descends_through_rebuilt_consumers() -> None:
    question = Variable(name="question")
    left = Concat()(Upper()(question), "!")
    right = Concat()(Upper()(question), "!")
    new_left, new_right = _rewrite([left + "x", right + "x"])
    assert new_left is new_right
    assert len(applies([new_left])) == 3


def test_different_constants_or_ops_do_not_merge() -> None:
    question = Variable(name="question")
    outs = _rewrite([question + "a", question + "b", Upper()(question), Concat()(question)])
    assert len({id(v) for v in outs}) == 4


def test_equal_constants_in_different_objects_merge() -> None:
    question = Variable(name="question")
    a, b = Concat()(question, Constant("x")), Concat()(question, Constant("x"))
    new_a, new_b = _rewrite([a, b])
    assert new_a is new_b


def test_float_constants_that_render_differently_stay_apart() -> None:
    question = Variable(name="question")
    a, b = Stack(2)(question, Constant(0.0)), Stack(2)(question, Constant(-0.0))
    new_a, new_b = _rewrite([a, b])
    assert new_a is not new_b


def test_random_draws_are_never_merged(llm) -> None:  # noqa: ANN001
    question = Variable(name="question")
    first, second = llm(question + "?", temperature=0.7), llm(question + "?", temperature=0.7)
    new_first, new_second = _rewrite([first, second])
    assert new_first is not new_second
    # ... but their identical prompts are.
    assert new_first.owner.inputs[0] is new_second.owner.inputs[0]
    # Creation order (which numbers the draws) is kept.
    assert new_first.owner.order == first.owner.order
    assert new_second.owner.order == second.owner.order


def test_greedy_calls_to_the_same_prompt_merge(llm) -> None:  # noqa: ANN001
    question = Variable(name="question")
    first, second = llm(question + "?", temperature=0), llm(question + "?", temperature=0)
    other = llm(question + "?", temperature=0, max_tokens=5)
    new_first, new_second, new_other = _rewrite([first, second, other])
    assert new_first is new_second
    assert new_other is not new_first


def test_impure_ops_are_not_merged_or_folded() -> None:
    question = Variable(name="question")
    first, second = Impure()(question), Impure()(question)
    assert len(set(map(id, _rewrite([first, second])))) == 2
    constant = Impure()("x")
    assert _rewrite([constant])[0] is constant


def test_constant_inline_ops_fold() -> None:
    out = Upper()(Concat()("a", "b") + "c")
    (folded,) = _rewrite([out])
    assert isinstance(folded, Constant) and folded.value == "ABC"
    stacked = _rewrite([Stack(2)("a", "b")])[0]
    assert isinstance(stacked, Constant) and list(stacked.value) == ["a", "b"]


def test_folding_feeds_merging() -> None:
    question = Variable(name="question")
    a = Concat()(question, Concat()("x", "y"))
    b = Concat()(question, "xy")
    new_a, new_b = _rewrite([a, b])
    assert new_a is new_b


def test_folding_keeps_a_failing_op_for_eval_to_report() -> None:
    out = Fails()("x")
    assert _rewrite([out])[0] is out


def test_python_mode_ops_are_not_folded() -> None:
    class Slow(Upper):
        traits = Traits(run=Run.PYTHON)

    out = Slow()("x")
    assert _rewrite([out])[0] is out


def test_multi_output_ops_merge_per_output() -> None:
    question = Variable(name="question")
    a0, a1 = Pair()(question)
    b0, b1 = Pair()(question)
    new = _rewrite([a0, a1, b0, b1])
    assert new[0] is new[2] and new[1] is new[3] and new[0] is not new[1]


def test_array_constants_fold_and_merge() -> None:
    prompts = np.array(["a", "b"], dtype=object)
    (folded,) = _rewrite([Upper()(prompts[0]) + Concat()(Constant(prompts))])
    assert list(folded.value) == ["Aa", "Ab"]


def test_unhashable_op_parameters_are_left_alone() -> None:
    class Tagged(Op):
        __props__ = ("tags",)

        def __init__(self, tags):  # noqa: ANN001
            self.tags = tags

        traits = Traits(run=Run.PYTHON)

    question = Variable(name="question")
    first, second = Tagged(["a"])(question), Tagged(["a"])(question)
    assert len(set(map(id, _rewrite([first, second])))) == 2


def test_outputs_keep_their_names_and_order() -> None:
    question = Variable(name="question")
    out = Upper()(question)
    out.name = "shout"
    dup = Upper()(question)
    new = _rewrite([dup, out, question])
    assert new[0] is new[1] and new[2] is question


def test_deep_chain_is_iterative_and_cheap() -> None:
    question = Variable(name="question")
    out = question
    for _ in range(100_000):
        out = out + "y"
    start = time.process_time()  # CPU time: other processes on a busy CI machine do not count
    (same,) = _rewrite([out])
    elapsed = time.process_time() - start
    assert same is out
    assert elapsed < 5.0  # the whole plan: ~15 µs per node here; generous for slow CI


def test_deep_duplicate_chains_merge() -> None:
    question = Variable(name="question")
    left = right = question
    for _ in range(20_000):
        left, right = left + "y", right + "y"
    new_left, new_right = _rewrite([left, right])
    assert new_left is new_right


# -- draw numbering ---------------------------------------------------------------------
def _offsets(plan: Plan) -> list[int]:
    return [plan.draw_offsets.get(id(v.owner), 0) for v in plan.outputs]


def test_equal_pure_subgraphs_are_one_node_and_others_differ() -> None:
    q = outlines.string("q")
    a, b, c = _rewrite([q + "!", q + "!", q + "?"])
    assert a is b and a is not c


def test_input_names_and_constant_values_keep_nodes_apart() -> None:
    x, y = outlines.string("x"), outlines.string("y")
    outs = _rewrite([x + "1", y + "1", x + "2", x + "1"])
    assert len({id(v) for v in outs}) == 3 and outs[0] is outs[3]


def test_repeated_random_calls_get_consecutive_draw_numbers(llm) -> None:  # noqa: ANN001
    q = outlines.string("q")
    prompt = q + "?"
    first = llm(prompt, num_samples=5)
    second = llm(prompt, num_samples=3)
    third = llm(q + "?")  # structurally the same prompt, built again
    assert _offsets(Plan([first, second, third])) == [0, 5, 8]


def test_draw_numbers_are_per_prompt_params_and_backend(llm) -> None:  # noqa: ANN001
    other = models.from_function(echo, name="other")
    q = outlines.string("q")
    calls = [llm(q), llm(q + "!"), llm(q, temperature=0.5), other(q)]
    assert _offsets(Plan(calls)) == [0, 0, 0, 0]


def test_rebuilding_the_same_program_replays_the_same_numbers() -> None:
    def build() -> list[Variable]:
        llm = models.from_function(echo)
        q = outlines.string("q")
        return [llm(q), llm(q), llm(q, num_samples=2)]

    assert _offsets(Plan(build())) == _offsets(Plan(build())) == [0, 1, 2]


def test_greedy_calls_are_not_numbered() -> None:
    llm = models.from_function(echo, temperature=0)
    q = outlines.string("q")
    assert Plan([llm(q), llm(q)]).draw_offsets == {}


def test_draws_are_numbered_after_merging_their_prompts(llm) -> None:  # noqa: ANN001
    q = outlines.string("q")
    calls = [llm(q + "?", num_samples=2), llm(q + "?"), llm("const"), llm("const"), llm(llm(q) + "!"), llm(llm(q) + "!")]
    assert _offsets(Plan(calls)) == [0, 2, 0, 1, 0, 0]


def test_plan_structure_counts_distinct_parents_and_lists_consumers() -> None:
    question = Variable(name="question")
    upper = Upper()(question)
    both = Concat()(upper, upper, question)
    plan = Plan([both, Upper()(question)])  # the second Upper merges into the first
    assert [n.op for n in plan.nodes] == [Upper(), Concat()]
    assert plan.indegree == [0, 1] and plan.consumers == [[1], []]
    assert plan.inputs == [question] and plan.outputs[1] is upper


# -- through outlines.prompt and eval ---------------------------------------------------
@outlines.prompt
def solve(question):  # noqa: ANN001, ANN201
    """Q: {{ question }}
    A:"""


class Recording:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompts: list[str]) -> list[str]:
        start = len(self.prompts)
        self.prompts.extend(prompts)
        return [f"{p} #{start + i + 1}" for i, p in enumerate(prompts)]


def test_identical_prompt_renders_become_one_node() -> None:
    question = outlines.string("question")
    first, second = solve(question), solve(question)
    new_first, new_second = _rewrite([first, second])
    assert new_first is new_second and new_first.owner.inputs == (question,)


def test_constant_prompt_renders_fold() -> None:
    (folded,) = _rewrite([solve("why?")])
    assert isinstance(folded, Constant) and folded.value == solve.render("why?")


def test_eval_sends_one_greedy_request_and_keeps_random_draws_apart() -> None:
    fn = Recording()
    llm = models.from_function(fn, batched=True, name="recording")
    question = outlines.string("question")
    greedy = outlines.eval(llm(solve(question), temperature=0), llm(solve(question), temperature=0),
                           givens={question: "q"}, cache=False)
    assert len(fn.prompts) == 1 and greedy[0] == greedy[1]
    fn.prompts.clear()
    random = outlines.eval(llm(solve(question), temperature=0.7), llm(solve(question), temperature=0.7),
                           givens={question: "q"}, cache=False)
    assert len(fn.prompts) == 2 and random[0] != random[1]


def test_compiled_programs_bind_their_inputs_after_rewriting() -> None:
    fn = Recording()
    llm = models.from_function(fn, batched=True, name="recording")
    program = outlines.compile(
        lambda question: llm(solve(question), temperature=0) + llm(solve(question), temperature=0), cache=False
    )
    value = program("why?")
    assert len(fn.prompts) == 1 and value.count("#1") == 2


# -- property: rewriting never changes a value ------------------------------------------
def _reference(outputs: list[Variable], givens: dict[int, object]) -> list[object]:
    """Evaluate inline ops directly, in creation order (no scheduler, no rewrites)."""
    values: dict[int, object] = dict(givens)
    for node in applies(outputs):
        inputs = [v.value if isinstance(v, Constant) else values[id(v)] for v in node.inputs]
        result = node.op.perform(*inputs)
        results = result if len(node.outputs) > 1 else (result,)
        for output, value in zip(node.outputs, results):
            values[id(output)] = value
    return [v.value if isinstance(v, Constant) else values[id(v)] for v in outputs]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["concat", "upper", "pair0", "pair1", "stack"]),
                          st.integers(0, 10**6), st.integers(0, 10**6), st.sampled_from(["a", "b", ""])),
                min_size=1, max_size=25))
def test_rewriting_random_graphs_keeps_every_value(steps: list[tuple[str, int, int, str]]) -> None:
    question = Variable(name="question")
    pool: list[Variable] = [question, Constant("x")]
    for kind, i, j, text in steps:
        left, right = pool[i % len(pool)], pool[j % len(pool)]
        if kind == "concat":
            pool.append(Concat()(left, right, text))
        elif kind == "upper":
            pool.append(Upper()(left))
        elif kind == "stack":
            pool.append(Concat()(Stack(2)(left, right), text))
        else:
            pool.append(Pair()(left)[int(kind[-1])])
    outputs = pool[2:]
    rewritten = _rewrite(outputs)
    givens = {id(question): "q"}
    expected = _reference(outputs, givens)
    got = _reference(rewritten, givens)
    assert len(got) == len(expected)
    for want, have in zip(expected, got):
        assert np.array_equal(np.asarray(want, dtype=object), np.asarray(have, dtype=object))
    assert len(applies(rewritten)) <= len(applies(outputs))
    assert all(v is question for v in graph_inputs(rewritten))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["llm", "greedy", "concat", "const"]), st.integers(0, 10**6),
                          st.integers(1, 3)), min_size=1, max_size=20))
def test_draw_numbers_of_random_graphs_are_stable_across_rebuilds(steps: list[tuple[str, int, int]]) -> None:
    def build() -> list[Variable]:
        llm = models.from_function(echo)
        question = Variable(name="question")
        pool: list[Variable] = [question]
        for kind, i, samples in steps:
            source = pool[i % len(pool)]
            if kind == "llm":
                pool.append(llm(source, num_samples=samples, temperature=0.7))
            elif kind == "greedy":
                pool.append(llm(source, temperature=0))
            elif kind == "concat":
                pool.append(source + "!")
            else:
                pool.append(llm("const", num_samples=samples))
        return pool[1:]

    first, second = Plan(build()), Plan(build())
    assert [(n.op.name, first.draw_offsets.get(id(n), 0)) for n in first.nodes] == [
        (n.op.name, second.draw_offsets.get(id(n), 0)) for n in second.nodes
    ]
    # Per (params, prompt) stream, the calls' draws are 0, 1, 2... in creation order: none shared, none skipped.
    streams: dict[object, list[int]] = {}
    for node in first.nodes:
        op, prompt = node.op, node.inputs[0]
        if op.traits.run == "generate" and not op.traits.pure:
            start = first.draw_offsets.get(id(node), 0)
            stream = streams.setdefault((op.params, prompt.value if isinstance(prompt, Constant) else id(prompt)), [])
            assert start == len(stream)
            stream.extend(range(start, start + op.num_samples))  # type: ignore[attr-defined]


# -- issue 27, item 10: a graph rewired into a cycle ---------------------------------------
def test_a_cyclic_graph_is_a_clear_error_naming_the_nodes_on_the_cycle() -> None:
    a, b, c, off_cycle = rewired_cycle()  # a -> b -> c -> a, and off_cycle reading c
    with pytest.raises(GraphBuildError, match="cycle") as caught:
        off_cycle.eval({"q": "x"})
    message = str(caught.value)
    assert all(node.owner.label in message for node in (a, b, c)) and off_cycle.owner.label not in message
    q2 = outlines.string("q2")
    alone = q2 + "x"
    alone.owner.inputs = (alone, alone.owner.inputs[1])  # a node reading its own output
    with pytest.raises(GraphBuildError, match=rf"cycle: {alone.owner.label} -> {alone.owner.label}"):
        Plan([alone])


def test_a_graph_rewired_to_read_a_later_node_without_a_cycle_is_said_so() -> None:
    q = outlines.string("q")
    early = q + "1"
    late = q + "2"
    out = early + "!"
    early.owner.inputs = (late, early.owner.inputs[1])  # reads a node built after it: no cycle
    with pytest.raises(GraphBuildError, match="built after it") as caught:
        Plan([out])
    assert early.owner.label in str(caught.value) and late.owner.label in str(caught.value)
