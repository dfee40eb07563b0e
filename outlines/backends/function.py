"""Any Python callable as a model: ``str -> str`` or ``list[str] -> list[str]``.

Sync callables run in the shared thread pool, async ones on the loop; calls of a
non-batched callable run concurrently, at most ``max_concurrency`` at a time;
each call is one request of the batch (it holds one of the evaluation's
request permits), and succeeds or fails on its own. The backend identity holds
the function's name and a hash of its code and of the state it captures as
the model is built (``state_hash``); state that cannot be hashed puts the
object's id there instead (``models.from_function``'s ``version=`` says what then).
"""
from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import inspect
import json
import types
import warnings
import weakref
from typing import Any, Callable, Sequence

from outlines.common.config import process_state
from outlines.common.errors import CacheWarning
from outlines.common.threads import run_blocking
from outlines.backends.base import Backend, BatchReport, check_limit
from outlines.draws import Draw, DrawColumns
from outlines.graph.ops import all_text

__all__ = ["FunctionBackend", "Unhashable", "code_hash", "state_hash"]


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


class Unhashable(ValueError):
    """A function captures state that has no stable, value-like form."""


#: Bounds of the walk over captured state: beyond them it is "unhashable".
_MAX_DEPTH = 16
_MAX_ITEMS = 100_000
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.ClassMethodDescriptorType,
)
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: the class was made by a class statement


class _StateWalk:
    """Turns captured state into a JSON-able token; raises ``Unhashable``."""

    def __init__(self) -> None:
        self.items = 0
        self.active: set[int] = set()  # objects being walked: a cycle refers back by name

    def token(self, value: Any, depth: int = 0) -> Any:
        self.items += 1
        if depth > _MAX_DEPTH or self.items > _MAX_ITEMS:
            raise Unhashable("captured state nested too deeply or too large")
        if value is None or isinstance(value, (bool, int, str)):
            return [type(value).__name__, value if not isinstance(value, int) else repr(value)]
        if isinstance(value, float):
            return ["float", repr(value)]
        if isinstance(value, (bytes, bytearray)):
            return [type(value).__name__, hashlib.sha256(value).hexdigest()]
        if isinstance(value, enum.Enum):
            return ["enum", self._type_name(type(value)), value.name]
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, type):
            return ["type", self._type_name(value)]
        if id(value) in self.active:
            return ["cycle", type(value).__qualname__]
        self.active.add(id(value))
        try:
            return self._compound(value, depth + 1)
        finally:
            self.active.discard(id(value))

    def _compound(self, value: Any, depth: int) -> Any:
        if isinstance(value, (list, tuple)):
            return [type(value).__name__, [self.token(v, depth) for v in value]]
        if isinstance(value, (set, frozenset)):
            return [type(value).__name__, sorted(json.dumps(self.token(v, depth)) for v in value)]
        if isinstance(value, dict):
            items = sorted((json.dumps(self.token(k, depth)), self.token(v, depth)) for k, v in value.items())
            return ["dict", items]
        if isinstance(value, functools.partial):
            return ["partial", self.token(value.func, depth), self.token(value.args, depth),
                    self.token(value.keywords, depth)]
        if inspect.ismethod(value):
            return ["method", self.token(value.__func__, depth), self.token(value.__self__, depth)]
        if inspect.isfunction(value):
            return self._function(value, depth)
        if isinstance(value, _BUILTIN_CALLABLES):
            owner = getattr(value, "__self__", None)
            bound = None if owner is None or isinstance(owner, (types.ModuleType, type)) else self.token(owner, depth)
            home = getattr(value, "__module__", None) or getattr(getattr(value, "__objclass__", None), "__name__", None)
            return ["builtin", home, value.__qualname__, bound]
        numpy_token = _ndarray_token(value)
        if numpy_token is not None:
            return numpy_token
        return self._object(value, depth)

    def _function(self, fn: types.FunctionType, depth: int) -> Any:
        cells = []
        for cell in fn.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # a cell not filled yet
                cells.append(["empty"])
                continue
            cells.append(self.token(contents, depth))
        return [
            "function",
            fn.__module__,
            fn.__qualname__,
            code_hash(fn),
            self.token(fn.__defaults__, depth),
            self.token(fn.__kwdefaults__, depth),
            cells,
            self._constants(fn, depth),
        ]

    def _constants(self, fn: types.FunctionType, depth: int) -> Any:
        """Module-level plain-data values the code reads (modules, functions... are left out)."""
        names: set[str] = set()
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            names.update(code.co_names)
            stack.extend(c for c in code.co_consts if inspect.iscode(c))
        found = []
        for name in sorted(names):
            if name in fn.__globals__:
                try:
                    token = _plain(fn.__globals__[name])
                except Unhashable:
                    continue
                if token is not None:
                    found.append([name, token])
        return found

    def _object(self, value: Any, depth: int) -> Any:
        hidden = [c for c in type(value).__mro__[:-1] if not c.__flags__ & _HEAP_TYPE]
        if hidden:  # a class made in C keeps state Python cannot see (tensors, locks...)
            raise Unhashable(f"a captured {type(value).__qualname__} keeps state in {hidden[0].__qualname__}")
        state = getattr(value, "__dict__", None)
        slots = [n for cls in type(value).__mro__ for n in getattr(cls, "__slots__", ()) if isinstance(n, str)]
        if state is None and not slots:
            raise Unhashable(f"a captured {type(value).__qualname__} has no inspectable state")
        fields = dict(state or {})
        for name in slots:
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                fields[name] = getattr(value, name)
        call = getattr(type(value), "__call__", None)
        code = code_hash(call) if inspect.isfunction(call) else None
        return ["object", self._type_name(type(value)), code, self.token(fields, depth)]

    @staticmethod
    def _type_name(cls: type) -> str:
        return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any, depth: int = 0) -> Any:
    """A token for plain data (str, numbers, containers of them); ``None`` for anything else."""
    if depth > _MAX_DEPTH:
        return None
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return _StateWalk().token(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        inner = value.items() if isinstance(value, dict) else value
        for item in inner:
            parts = item if isinstance(value, dict) else (item,)
            if any(_plain(part, depth + 1) is None for part in parts):
                return None
        return _StateWalk().token(value)
    return None


def _ndarray_token(value: Any) -> Any:
    numpy = __import__("sys").modules.get("numpy")
    if numpy is None or not isinstance(value, numpy.ndarray) or value.dtype.hasobject:
        return None
    data = numpy.ascontiguousarray(value).tobytes()
    return ["ndarray", str(value.dtype), list(value.shape), hashlib.sha256(data).hexdigest()]


def state_hash(fn: Callable[..., Any]) -> str:
    """A stable hash of ``fn``'s code and the state it captures.

    Parameters
    ----------
    fn
        A function, lambda, ``functools.partial``, bound method or callable object.

    Returns
    -------
    str
        16 hex digits, equal across processes for equal code and state.

    Raises
    ------
    Unhashable
        When some captured value has no value-like form (a lock, a socket...).

    Examples
    --------
    >>> def scaled(k):
    ...     return lambda p: p * k
    >>> state_hash(scaled(2)) == state_hash(scaled(3))
    False
    """
    token = _StateWalk().token(fn)
    return hashlib.sha256(json.dumps(token, sort_keys=True).encode()).hexdigest()[:16]


def _warn_unhashable(name: str, reason: str) -> None:
    warned = process_state().warned  # once per function name per process
    if f"unhashable {name}" in warned:
        return
    warned.add(f"unhashable {name}")
    warnings.warn(
        f"from_function({name!r}): {reason}, so the model's identity cannot cover it; its draws "
        "are not cached on disk and it batches only with itself. Pass version='...' to declare "
        "its identity and cache it.",
        CacheWarning,
        stacklevel=5,
    )


class FunctionBackend(Backend):
    """A backend that calls a Python function."""

    kind = "function"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        name: str | None = None,
        version: str | None = None,
        max_batch: int | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"from_function needs a callable, got {type(fn).__name__}")
        if version is not None and not isinstance(version, str):
            raise TypeError(f"from_function: version must be a string, got {type(version).__name__}")
        where = f"from_function({name or getattr(fn, '__name__', type(fn).__name__)!r})"
        max_batch = check_limit("max_batch", max_batch, where=where)
        max_concurrency = check_limit("max_concurrency", max_concurrency, where=where)
        self.fn = fn
        self.batched = batched
        self.name: str = str(name or getattr(fn, "__name__", type(fn).__name__))
        self.version = version
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)
        )
        self.max_batch = max_batch
        self.sends_requests = not batched  # one call per draw: each call is a request
        self.max_concurrency = max_concurrency if max_concurrency is not None else (None if batched else 64)
        self._identity = self._make_identity()
        self._semaphores: weakref.WeakKeyDictionary[Any, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def _make_identity(self) -> tuple[Any, ...]:
        if self.version is not None:
            return ("function", self.name, code_hash(self.fn), bool(self.batched), self.version)
        try:
            digest = state_hash(self.fn)
        except Unhashable as exc:
            _warn_unhashable(self.name, str(exc))
            self.cacheable = False
            # The backend holds ``fn``, so its id is not reused while this identity lives.
            return ("function", self.name, code_hash(self.fn), bool(self.batched), f"object-{id(self.fn):x}")
        return ("function", self.name, digest, bool(self.batched))

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
        # A DrawColumns (what the scheduler sends) already holds the prompts as a list.
        prompts = list(draws.prompts) if isinstance(draws, DrawColumns) else [d.prompt for d in draws]
        if self.batched:
            outputs = await self._call(prompts)
            if not isinstance(outputs, (list, tuple)) or len(outputs) != len(prompts):
                got = f"{len(outputs)} outputs" if isinstance(outputs, (list, tuple)) else type(outputs).__name__
                raise ValueError(f"batched function {self.name!r} returned {got} for {len(prompts)} prompts")
            if not all_text(outputs):
                return [self._check(o) for o in outputs]
            return list(outputs)
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
        async with semaphore, report.request_permit():
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
