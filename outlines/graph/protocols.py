"""What the runtime reads of the ops it runs: a model call and a Python step, as declared protocols.

The scheduler dispatches on an op's traits (``outlines.graph.traits``); an op
that declares ``Run.GENERATE`` is a ``ModelCall`` (``outlines.models.Generate``)
and one that declares ``Run.PYTHON`` a ``PythonStep``
(``outlines.fn.CallFunction``). Both classes live above the runtime, so the
runtime reads them through these protocols, obtained with ``model_call`` and
``python_step``, which check the op's traits first. ``ModelCall`` is generic
in its backend's type: the graph names no backend class (backends sit beside
the cache, above the graph), the runtime reads ``ModelCall[Backend]``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from outlines.draws import GenerationParams
from outlines.graph.traits import Run, Traits

if TYPE_CHECKING:
    from outlines.graph.basic import Op

__all__ = ["ModelCall", "PythonStep", "StepFunction", "model_call", "python_step"]

BackendT_co = TypeVar("BackendT_co", covariant=True)
#: Read once: a member looked up on its enum class per node costs more than the check.
_GENERATE, _PYTHON = Run.GENERATE, Run.PYTHON


@runtime_checkable  # tests/graph/test_traits.py checks every op class that runs as one
class ModelCall(Protocol[BackendT_co]):
    """A model call (``Run.GENERATE``): ``num_samples`` draws of each prompt element from ``backend``."""

    @property
    def traits(self) -> Traits: ...

    @property
    def name(self) -> str: ...

    @property
    def backend(self) -> BackendT_co:
        """The backend the draws go to (equal backends batch together)."""

    @property
    def params(self) -> GenerationParams:
        """The generation parameters of every draw."""

    @property
    def num_samples(self) -> int:
        """Draws per prompt element."""

    @property
    def sample_axis(self) -> bool:
        """Whether the output adds a last axis of ``num_samples`` samples."""

    def columns(self, prompt: Any, draw_offset: int) -> tuple[tuple[int, ...], list[Any], list[int]]:
        """Output shape, flat prompt texts and draw numbers (each text drawn once per number)."""


class StepFunction(Protocol):
    """The user function a ``PythonStep`` runs (``outlines.fn.Function``), as the scheduler reads it."""

    #: Declared blocking (thread pool), not (inline), or ``None``: decided by its measured mean
    #: seconds per call (the process state's ``timings``, ``outlines.common.config``).
    blocking: bool | None
    is_async: bool
    #: The gufunc signature (``"(n)->()"``), or ``None`` for an elementwise function.
    signature: str | None


@runtime_checkable  # tests/graph/test_traits.py checks every op class that runs as one
class PythonStep(Protocol):
    """A user function's node (``Run.PYTHON``): run inline, as a task (async) or in the thread pool."""

    @property
    def traits(self) -> Traits: ...

    @property
    def name(self) -> str: ...

    @property
    def function(self) -> StepFunction: ...

    def perform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        """The result (a sync function), or the coroutines to await (an async one)."""

    async def aperform(self, *values: Any, on_error: Any = None, on_failed_input: Any = None) -> Any:
        """The result of an async function, every element's coroutine run concurrently."""


def model_call(op: Op) -> ModelCall[Any]:
    """``op`` read as a model call; ``TypeError`` when its traits say it is none."""
    if op.traits.run is not _GENERATE:
        raise TypeError(f"{op.name} is no model call (it runs as {op.traits.run.value})")
    return cast("ModelCall[Any]", op)  # its traits declare it: tests/graph/test_traits.py checks the class


def python_step(op: Op) -> PythonStep:
    """``op`` read as a Python step; ``TypeError`` when its traits say it is none."""
    if op.traits.run is not _PYTHON:
        raise TypeError(f"{op.name} is no Python step (it runs as {op.traits.run.value})")
    return cast(PythonStep, op)  # its traits declare it: tests/graph/test_traits.py checks the class
