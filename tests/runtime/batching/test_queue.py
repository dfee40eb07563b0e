"""Queues of draws (``outlines.runtime.batching.queue``): per slot, keyed by prompt, taken as one batch."""
from __future__ import annotations

from outlines.draws import Draw, GenerationParams, Slot
from outlines.backends.constraints import make_constraint
from outlines.runtime.batching.queue import BatchQueue, queue_key
from outlines.runtime.batching.waiting import Wait
from tests.fixtures.recording import RecordingBackend

PLAIN = GenerationParams.create(temperature=0.5)


def test_draws_that_differ_only_in_their_constraint_share_a_queue_but_not_a_slot() -> None:
    backend = RecordingBackend()
    constrained = GenerationParams.create(temperature=0.5, constraint=make_constraint(choices=["y", "n"]))
    assert queue_key(backend, constrained) == queue_key(backend, PLAIN) == (backend, PLAIN)
    queue = BatchQueue(backend)
    assert queue.slot_of(PLAIN, 0) is queue.slot(Slot(GenerationParams.create(temperature=0.5), 0))
    assert not queue.constrained
    queue.slot_of(constrained, 0).add({"q": None})
    assert queue.constrained and len(queue.slots) == 2


def test_a_slot_queues_each_draw_once_in_arrival_order_and_take_empties_the_queue() -> None:
    queue = BatchQueue(RecordingBackend())
    slot = queue.slot_of(PLAIN, 3)
    first = Wait(0, (3,), ["a", "b", "a"], [slot.waiters])
    slot.join(first, dict.fromkeys(first.prompts))
    second = Wait(1, (2,), ["c", "b"], [slot.waiters])
    slot.join(second, dict.fromkeys(second.prompts))  # "b" is pending already: it waits for that one
    assert list(slot.pending) == ["a", "b", "c"] and queue.pending == 3
    draws, members = queue.take()
    assert list(draws) == [Draw("a", PLAIN, 3), Draw("b", PLAIN, 3), Draw("c", PLAIN, 3)]
    assert set(members) == {"a", "b", "c"} and queue.pending == 0
    assert (first.missing, second.missing) == (2, 2)


def test_take_puts_each_prompts_samples_together() -> None:
    queue = BatchQueue(RecordingBackend())
    other = GenerationParams.create(temperature=0.9)
    for number in range(3):  # a 3-sample call: every slot holds the same prompts
        queue.slot_of(PLAIN, number).add(dict.fromkeys(["a", "b"]))
    draws, members = queue.take()
    assert members is None
    assert [(d.prompt, d.draw) for d in draws] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    queue.slot_of(PLAIN, 0).add(dict.fromkeys(["a", "b"]))
    queue.slot_of(other, 0).add(dict.fromkeys(["a"]))
    queue.slot_of(PLAIN, 1).add(dict.fromkeys(["c", "a"]))
    draws, _ = queue.take()  # grouped by params and prompt, scanning the slots in the order they were made
    assert list(draws) == [Draw("a", PLAIN, 0), Draw("a", PLAIN, 1), Draw("b", PLAIN, 0), Draw("c", PLAIN, 1),
                           Draw("a", other, 0)]


def test_a_remainder_goes_back_to_its_slots() -> None:
    queue = BatchQueue(RecordingBackend())
    for number in (0, 1):
        queue.slot_of(PLAIN, number).add(dict.fromkeys(["a", "b"]))
    draws, _ = queue.take()
    queue.requeue(draws[2:])
    assert list(queue.slot_of(PLAIN, 0).pending) == ["b"] and list(queue.slot_of(PLAIN, 1).pending) == ["b"]


def test_take_puts_each_prefix_groups_prompts_together() -> None:
    head = "You are a careful assistant. Answer in one word. " * 2
    prompts = [head + "a", "lone", head + "b", "x" * 200, head + "c"]
    grouped = BatchQueue(RecordingBackend(prefix_min_head=40))
    grouped.slot_of(PLAIN, 0).add(dict.fromkeys(prompts))
    draws, members = grouped.take()
    assert draws.prompts == [prompts[i] for i in (0, 2, 4, 1, 3)] and set(members) == set(prompts)
    plain = BatchQueue(RecordingBackend())  # a backend that gains nothing from a shared head: arrival order
    plain.slot_of(PLAIN, 0).add(dict.fromkeys(prompts))
    assert plain.take()[0].prompts == prompts
