"""Any Python callable as a model: ``str -> str`` or ``list[str] -> list[str]``.

Sync callables run in the shared thread pool, async ones on the loop; calls of a
non-batched callable run concurrently, at most ``max_concurrency`` at a time;
each call is one request of the batch (it holds one of the evaluation's
request slots), and succeeds or fails on its own.
The backend identity holds the function's name and a hash of its code, so
editing the function invalidates its cache entries.
"""
from __future__ import annotations

import asyncio
import hashlib
import inspect
import weakref
from typing import Any, Callable, Sequence

from outlines.threads import run_blocking
from outlines.backends.base import Backend, BatchReport, Draw

__all__ = ["FunctionBackend", "code_hash"]


def _code_fingerprint(code: Any, out: list[bytes]) -> None:
    out.append(code.co_code)
    out.append(repr(code.co_names).encode())
    for const in code.co_consts:
        if inspect.iscode(const):
            _code_fingerprint(const, out)
        else:
            out.append(repr(const).encode())


def code_hash(fn: Callable[..., Any]) -> str:
    """A hash of ``fn``'s code that is stable across processes."""
    target = inspect.unwrap(fn)
    if not inspect.isfunction(target) and hasattr(target, "__call__"):
        target = getattr(type(target), "__call__", target)
    code = getattr(target, "__code__", None)
    parts: list[bytes] = [getattr(target, "__qualname__", repr(target)).encode()]
    if code is not None:
        _code_fingerprint(code, parts)
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]


class FunctionBackend(Backend):
    """A backend that calls a Python function."""

    kind = "function"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        name: str | None = None,
        max_batch: int | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"from_function needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.batched = batched
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)
        )
        self.max_batch = max_batch
        self.sends_requests = not batched  # one call per draw: each call is a request
        self.max_concurrency = max_concurrency if max_concurrency is not None else (None if batched else 64)
        self._identity = ("function", self.name, code_hash(fn), bool(batched))
        self._semaphores: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    @property
    def identity(self) -> tuple[Any, ...]:
        return self._identity

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_semaphores"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._semaphores = weakref.WeakKeyDictionary()

    async def generate(self, draws: Sequence[Draw], report: BatchReport) -> list[str]:
        prompts = [d.prompt for d in draws]
        if self.batched:
            outputs = await self._call(prompts)
            if not isinstance(outputs, (list, tuple)) or len(outputs) != len(prompts):
                got = f"{len(outputs)} outputs" if isinstance(outputs, (list, tuple)) else type(outputs).__name__
                raise ValueError(f"batched function {self.name!r} returned {got} for {len(prompts)} prompts")
            return [self._check(o) for o in outputs]
        semaphore = self._semaphore()
        # Every call finishes or fails on its own (each reports itself); the first failure is raised last.
        outcomes = await asyncio.gather(
            *(self._bounded(semaphore, report, i, p) for i, p in enumerate(prompts)), return_exceptions=True
        )
        texts: list[str] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            texts.append(outcome)
        return texts

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._semaphores.get(loop)
        if semaphore is None:
            semaphore = self._semaphores[loop] = asyncio.Semaphore(self.max_concurrency or 64)
        return semaphore

    async def _bounded(self, semaphore: asyncio.Semaphore, report: BatchReport, index: int, prompt: str) -> str:
        async with semaphore, report.request_slot():
            try:
                text = self._check(await self._call(prompt))
            except Exception as error:
                report.failure(index, error)
                raise
        report.result(index, text)  # cached now, kept if a sibling fails
        return text

    async def _call(self, argument: Any) -> Any:
        if self.is_async:
            return await self.fn(argument)
        return await run_blocking(self.fn, argument)

    def _check(self, output: Any) -> str:
        if not isinstance(output, str):
            raise TypeError(f"function {self.name!r} must return str, got {type(output).__name__} {output!r:.60}")
        return output
