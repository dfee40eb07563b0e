"""Ops declare their traits (``outlines.graph.traits``); the runtime reads those and the protocols of ``graph/protocols``."""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Iterator

import numpy as np
import pytest

import outlines
from outlines import models
from outlines.common.errors import Failure
from outlines.graph.basic import Op, Variable
from outlines.graph.ops import Concat, broadcast_map
from outlines.graph.protocols import ModelCall, PythonStep, model_call, python_step
from outlines.graph.traits import Run, Traits
from outlines.runtime.plan import Plan
from outlines.runtime.scheduler import Scheduler, walker
from outlines.runtime.session import Evaluation, Options


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _package_ops() -> list[type[Op]]:
    """Every Op subclass the package defines (each of its modules imported first)."""
    for module in pkgutil.walk_packages(outlines.__path__, "outlines."):
        importlib.import_module(module.name)
    return [cls for cls in _subclasses(Op) if cls.__module__.startswith("outlines.")]


def _declared_by(cls: type[Op]) -> type:
    return next(klass for klass in cls.__mro__ if "traits" in vars(klass))


def test_every_op_class_of_the_package_declares_its_traits() -> None:
    ops = _package_ops()
    assert len(ops) >= 15  # the structural ops, templates, chat, parsing, loops and conds, model calls, fn steps
    for cls in ops:
        assert isinstance(cls.traits, Traits), cls
        assert _declared_by(cls) is not Op, f"{cls.__qualname__} runs on Op's default traits: declare its own"


#: One instance of each op class that runs as a model call or a Python step, made as a user makes it.
_MADE: dict[str, Callable[[], Op]] = {
    "Generate": lambda: _op(models.from_function(lambda ps: ps, batched=True)(outlines.string("q"))),
    "CallFunction": lambda: _op(outlines.fn(str.upper)(outlines.string("q"))),
}


def _op(variable: Variable) -> Op:
    assert variable.owner is not None
    return variable.owner.op


def test_ops_that_run_as_model_calls_or_python_steps_have_what_the_runtime_reads() -> None:
    protocols: dict[Run, Any] = {Run.GENERATE: ModelCall, Run.PYTHON: PythonStep}
    kinds = {cls.__name__: cls.traits.run for cls in _package_ops() if cls.traits.run in protocols}
    assert set(kinds) == set(_MADE)  # a new model call or step joins _MADE, and so this check
    for name, make in _MADE.items():
        op = make()
        assert type(op).__name__ == name and op.traits.run is kinds[name]
        assert isinstance(op, protocols[kinds[name]])
        read = model_call(op) if kinds[name] is Run.GENERATE else python_step(op)
        assert read is op


def test_reading_an_op_as_what_its_traits_do_not_say_is_refused() -> None:
    with pytest.raises(TypeError, match="no model call"):
        model_call(Concat())
    with pytest.raises(TypeError, match="no Python step"):
        python_step(_MADE["Generate"]())


def test_traits_that_follow_parameters_are_read_once_at_construction() -> None:
    step = _op(outlines.fn(str.upper)(outlines.string("q")))
    pure = _op(outlines.fn(str.upper, pure=True)(outlines.string("q")))
    rows = _op(outlines.fn(lambda n: ["x"] * n, signature="()->(k)")(outlines.string("q")))
    assert (step.traits.pure, step.traits.elementwise) == (False, True)
    assert (pure.traits.pure, pure.traits.elementwise) == (True, True)
    assert rows.traits.elementwise is False  # an output core axis may differ in length per element
    greedy = _op(models.from_function(lambda ps: ps, batched=True)(outlines.string("q"), temperature=0))
    random = _op(models.from_function(lambda ps: ps, batched=True)(outlines.string("q"), temperature=1.0))
    assert greedy.traits.pure and not random.traits.pure


def test_a_flag_set_the_old_way_is_refused_where_the_class_is_made() -> None:
    with pytest.raises(TypeError, match="declare traits"):
        type("Old", (Op,), {"elementwise": True})
    with pytest.raises(TypeError, match="declare traits"):
        type("Old", (Op,), {"mode": "python"})


# -- the scheduler dispatches on traits ------------------------------------------------------


class _Upper(Op):
    """Upper-cases text; records the keywords each ``perform`` got."""

    traits = Traits(elementwise=True)
    calls: list[tuple[str, ...]] = []

    def perform(self, *values: Any, **options: Any) -> Any:
        type(self).calls.append(tuple(sorted(options)))
        if options:
            return broadcast_map(str.upper, values, **options)
        return np.vectorize(str.upper, otypes=[object])(values[0]) if isinstance(values[0], np.ndarray) else values[0].upper()


class _Guarded(_Upper):
    traits = Traits(elementwise=True, guards_elements=True)
    calls: list[tuple[str, ...]] = []


class _Looped(_Upper):
    traits = Traits(run=Run.CONTROL)


def test_an_elementwise_trait_pairs_shapes_and_keeps_rows() -> None:
    words = outlines.constant(np.array(["a", "b"], dtype=object))
    assert _Upper()(words).shape == (2,)
    assert _Upper()(outlines.string("q")).shape is None  # unknown stays unknown


def test_the_scheduler_passes_guards_to_an_op_whose_traits_say_it_guards_its_elements() -> None:
    words = np.array(["a", "b"], dtype=object)
    _Upper.calls.clear()
    _Guarded.calls.clear()
    assert outlines.eval(_Guarded()(outlines.string("w")), givens={"w": words}, errors="return").tolist() == ["A", "B"]
    assert outlines.eval(_Upper()(outlines.string("w")), givens={"w": words}, errors="return").tolist() == ["A", "B"]
    assert _Guarded.calls == [("on_error", "on_failed_input")]
    assert _Upper.calls == [()]  # no guards: nothing failed upstream, one node


def test_an_elementwise_op_fed_a_failed_element_fails_that_element_alone() -> None:
    def bad(text: str) -> str:
        if text == "b":
            raise ValueError("no b")
        return text

    out = _Upper()(outlines.fn(bad)(outlines.string("w")))
    values = outlines.eval(out, givens={"w": ["a", "b", "c"]}, errors="return")
    assert values[0] == "A" and values[2] == "C" and isinstance(values[1], Failure)


def test_the_scheduler_runs_a_node_as_its_traits_say() -> None:
    out = _Looped()(outlines.string("w"))
    with pytest.raises(outlines.NodeError, match="not a control-flow op"):  # dispatched to the control step
        outlines.eval(out, givens={"w": "a"})


def test_the_dispatch_has_one_step_per_way_to_run() -> None:
    plan = Plan([_Upper()(outlines.string("w"))])
    scheduler = Scheduler(plan, {}, Evaluation.open(Options.check({"cache": False})))
    steps = walker(scheduler)
    assert set(steps) == set(Run)
    assert all(step.__name__ == run.value for run, step in steps.items())
