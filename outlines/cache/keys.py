"""Cache keys of draws: content hashes that every process computes alike.

The key of one draw is a SHA-256 over canonical JSON (sorted keys, ASCII,
integral floats written as integers) of the cache format version, the backend
identity (kind, model, base URL...; never a secret), the generation
parameters (seed included), the prompt text and the draw number. Python's
``hash`` is never involved, so keys do not depend on ``PYTHONHASHSEED``, dict
order, the process or the Python version.
"""
from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, Mapping, Sequence

from outlines.backends.base import Draw
from outlines.cache.sqlite import FORMAT

__all__ = ["draw_key"]


def _normalize(value: Any) -> Any:
    """A JSON value whose text depends only on content (1.0 and 1 are one number)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, Mapping):
        return {str(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    item = getattr(value, "item", None)  # NumPy scalars
    if callable(item) and not isinstance(value, (bytes, bytearray)):
        return _normalize(item())
    raise TypeError(f"cache keys need JSON values; got {type(value).__name__} {value!r:.60}")


def _canonical(value: Any) -> bytes:
    text = json.dumps(_normalize(value), sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return text.encode("ascii")


def _same(first: Any, second: Any) -> bool:
    # Backends may build their identity tuple on each access; repr tells 1 from True.
    return first is second or (first == second and repr(first) == repr(second))


_prefixes: dict[int, tuple[Any, Any, Any]] = {}
_recent: dict[int, tuple[Draw, Any, str]] = {}


def draw_key(identity: Sequence[Any], request: Draw) -> str:
    """The content hash of one draw.

    Parameters
    ----------
    identity
        The backend's identity (kind, model, base URL...; never a secret).
    request
        The draw: prompt, params (seed included) and draw number. Greedy
        requests arrive with ``draw=0``.

    Returns
    -------
    str
        64 hex digits, equal across processes, Python versions, hash seeds and
        dict orderings.

    Examples
    --------
    >>> from outlines.backends.base import GenerationParams
    >>> key = draw_key(("function", "f"), Draw("hi", GenerationParams(), 0))
    >>> len(key)
    64
    """
    recent = _recent.get(id(request))
    if recent is not None and recent[0] is request and _same(recent[1], identity):
        return recent[2]  # the scheduler asks again when it stores the answer
    params = request.params
    # Requests of one node share one params object: hash its part once.
    entry = _prefixes.get(id(params))
    if entry is None or entry[0] is not params or not _same(entry[1], identity):
        prefix = hashlib.sha256(_canonical(["outlines.draw", FORMAT, list(identity), params.to_dict()]))
        if len(_prefixes) >= 1024:
            _prefixes.clear()
        entry = _prefixes[id(params)] = (params, identity, prefix)
    digest = entry[2].copy()
    prompt, draw = request.prompt, request.draw
    if type(prompt) is str and type(draw) is int:
        digest.update(b"\0[%s,%d]" % (encode_basestring_ascii(prompt).encode("ascii"), draw))
    else:
        digest.update(b"\0" + _canonical([prompt, draw]))
    key = digest.hexdigest()
    if len(_recent) >= 8192:
        _recent.clear()
    _recent[id(request)] = (request, identity, key)
    return key
