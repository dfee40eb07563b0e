"""Models as graph nodes: the ``Model`` callable and the ``Generate`` op.

Calling a ``Model`` on a prompt builds a ``Generate`` node; nothing is sent.
Each element of the prompt and each of its ``num_samples`` samples is one
*draw*. Draws are numbered when a graph is planned (see
``outlines.graph.hashing.number_draws``), so repeated identical calls are
independent draws and a re-run replays the same numbers from the cache.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from outlines.backends.base import Backend, GenerationParams, Request
from outlines.errors import GraphBuildError
from outlines.graph.basic import Apply, Constant, Op, Variable, as_object_array, as_variable
from outlines.graph.ops import check_text_input

__all__ = ["Generate", "Model"]


class Generate(Op):
    """Sample ``num_samples`` completions of each prompt element from ``backend``."""

    __props__ = ("backend", "params", "num_samples")
    mode = "generate"

    def __init__(self, backend: Backend, params: GenerationParams, num_samples: int = 1) -> None:
        if isinstance(num_samples, bool) or not isinstance(num_samples, (int, np.integer)) or num_samples < 1:
            raise GraphBuildError(
                f"Generate({backend.kind}:{backend.model_name}): num_samples must be an integer >= 1, "
                f"got {num_samples!r}"
            )
        self.backend = backend
        self.params = params
        self.num_samples = int(num_samples)

    @property
    def pure(self) -> bool:  # type: ignore[override]
        return self.params.deterministic

    @property
    def name(self) -> str:
        return f"Generate[{self.backend.kind}:{self.backend.model_name}]"

    def make_node(self, *inputs: Any) -> Apply:
        if len(inputs) != 1:
            raise GraphBuildError(f"{self.name} takes exactly one prompt, got {len(inputs)} arguments")
        prompt = as_variable(inputs[0], array=True)
        if isinstance(prompt, Constant) and isinstance(prompt.value, (list, tuple)):
            prompt = Constant(as_object_array(prompt.value), prompt.name)  # a list of prompts is an array
        check_text_input(self, prompt, "the prompt")
        return Apply(self, [prompt])

    def requests(self, prompt: Any, draw_offset: int) -> tuple[tuple[int, ...], list[Request]]:
        """The output shape and the flat list of draws for a prompt value.

        Requests are ordered element-major: all samples of element 0 first.
        """
        if isinstance(prompt, np.ndarray):
            texts = list(prompt.reshape(-1))
            shape: tuple[int, ...] = prompt.shape
        else:
            texts, shape = [prompt], ()
        for text in texts:
            if not isinstance(text, str):
                raise TypeError(f"the prompt must be text, got {type(text).__name__} {text!r:.60}")
        k = self.num_samples
        if self.params.deterministic:
            draws = [0] * k
        else:
            draws = list(range(draw_offset, draw_offset + k))
        requests = [Request(text, self.params, d) for text in texts for d in draws]
        return (shape + (k,) if k > 1 else shape), requests

    def key(self) -> tuple[Any, ...]:
        return ("Generate", list(self.backend.identity), self.params.to_dict(), self.num_samples)


class Model:
    """A language model that builds ``Generate`` nodes when called.

    Parameters
    ----------
    backend
        Where the text comes from.
    **defaults
        Default generation parameters (``max_tokens``, ``temperature``,
        ``stop``, ``seed``, ``top_p``...), overridable per call.
    """

    def __init__(self, backend: Backend, **defaults: Any) -> None:
        self.backend = backend
        self.defaults = GenerationParams.create(**defaults)
        self._ops: dict[tuple[GenerationParams, int], Generate] = {}

    def __call__(
        self,
        prompt: Any,
        *,
        num_samples: int = 1,
        max_tokens: int | None = None,
        temperature: float | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        **params: Any,
    ) -> Variable:
        """Build a node sampling ``num_samples`` completions of ``prompt``.

        Returns a Variable of the prompt's shape, with a trailing axis of size
        ``num_samples`` when it is greater than 1.
        """
        try:
            merged = self.defaults.merged(
                max_tokens=max_tokens, temperature=temperature, stop=stop, seed=seed, **params
            )
        except ValueError as exc:
            raise GraphBuildError(f"Generate[{self.backend.kind}:{self.backend.model_name}]: {exc}") from None
        op = self._ops.get((merged, num_samples)) if type(num_samples) is int else None
        if op is None:
            op = Generate(self.backend, merged, num_samples)
            self._ops[merged, op.num_samples] = op
        return op(prompt)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Model) and (self.backend, self.defaults) == (other.backend, other.defaults)

    def __hash__(self) -> int:
        return hash((self.backend, self.defaults))

    def __repr__(self) -> str:
        return f"Model({self.backend!r}, {self.defaults})"
