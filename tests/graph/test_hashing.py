"""Content keys of subgraphs and the numbering of random draws."""
from __future__ import annotations

import outlines
from outlines import models
from outlines.graph.hashing import graph_keys
from outlines.graph.traversal import toposort
from outlines.runtime.plan import Plan


def _echo(prompt):
    return prompt


def test_equal_pure_subgraphs_have_equal_keys_and_others_differ():
    q = outlines.string("q")
    a, b, c = q + "!", q + "!", q + "?"
    keys = graph_keys(toposort([a, b, c]))
    assert keys.key(a) == keys.key(b) != keys.key(c)


def test_keys_depend_on_input_names_and_constant_values():
    x, y = outlines.string("x"), outlines.string("y")
    keys = graph_keys(toposort([x + "1", y + "1", x + "2"]))
    assert len({keys.key(v) for v in (x, y)}) == 2


def test_repeated_random_calls_get_consecutive_draw_numbers():
    llm = models.from_function(_echo)
    q = outlines.string("q")
    prompt = q + "?"
    first = llm(prompt, num_samples=5)
    second = llm(prompt, num_samples=3)
    third = llm(q + "?")  # structurally the same prompt, built again
    plan = Plan([first, second, third])
    offsets = [plan.draw_offsets.get(id(v.owner), 0) for v in plan.outputs]
    assert offsets == [0, 5, 8]


def test_draw_numbers_are_per_prompt_params_and_backend():
    llm = models.from_function(_echo)
    other = models.from_function(_echo, name="other")
    q = outlines.string("q")
    calls = [llm(q), llm(q + "!"), llm(q, temperature=0.5), other(q)]
    plan = Plan(calls)
    assert [plan.draw_offsets.get(id(v.owner), 0) for v in plan.outputs] == [0, 0, 0, 0]


def test_rebuilding_the_same_program_replays_the_same_numbers():
    def build():
        llm = models.from_function(_echo)
        q = outlines.string("q")
        return [llm(q), llm(q), llm(q, num_samples=2)]

    one, two = Plan(build()), Plan(build())
    assert [one.draw_offsets.get(id(v.owner), 0) for v in one.outputs] == [
        two.draw_offsets.get(id(v.owner), 0) for v in two.outputs
    ] == [0, 1, 2]


def test_greedy_calls_are_not_numbered():
    llm = models.from_function(_echo, temperature=0)
    q = outlines.string("q")
    plan = Plan([llm(q), llm(q)])
    assert plan.draw_offsets == {}


def test_content_hash_is_stable_across_processes():
    import subprocess
    import sys

    code = (
        "import outlines; from outlines.graph.hashing import content_hash; "
        "q = outlines.string('q'); print(content_hash(q + '!', (q + '?') + q))"
    )
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"}).stdout
        for seed in ("1", "2")
    }
    assert len(runs) == 1 and len(runs.pop().strip()) == 64


def test_fast_numbering_after_rewrites_agrees_with_full_keys():
    llm = models.from_function(_echo)
    q = outlines.string("q")
    calls = [llm(q + "?", num_samples=2), llm(q + "?"), llm("const"), llm("const"), llm(llm(q) + "!"), llm(llm(q) + "!")]
    fast, full = Plan(calls), Plan(calls, rewrite=False)
    assert [fast.draw_offsets.get(id(v.owner), 0) for v in fast.outputs] == [
        full.draw_offsets.get(id(v.owner), 0) for v in full.outputs
    ] == [0, 2, 0, 1, 0, 0]
