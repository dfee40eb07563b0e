"""Draw keys: the content hash of one cached draw, and of a batch's draws.

``draw_key`` hashes a draw with BLAKE2b into 16 bytes: the format version,
the backend's identity, the parameters, the prompt and the draw number, each
written by the one normaliser ``outlines.common.keys.canonical``. ``draw_keys`` keys
a whole batch, hashing each distinct params object once; ``draw_slots`` and
``prompt_keys`` split the same bytes at the slot (the part every draw of one
params object and draw number shares: ``outlines.draws.Slot``) so the cache
writer can hash prompts alone.
"""
from __future__ import annotations

import hashlib
from json.encoder import encode_basestring_ascii
from typing import Any, Iterable, NamedTuple, Sequence

from outlines.cache.sqlite import FORMAT, KEY_BYTES
from outlines.draws import Draw, DrawColumns, GenerationParams
from outlines.common.keys import canonical

__all__ = ["SlotDraws", "SlotKey", "draw_key", "draw_keys", "draw_slots", "prompt_keys"]


def _same(first: Any, second: Any) -> bool:
    # Backends may build their identity tuple on each access; repr tells 1 from True.
    return first is second or (first == second and repr(first) == repr(second))


# Draws of one node share one params object: the hash of everything but the
# prompt and draw number is computed once per (params, identity).
_prefixes: dict[int, tuple[Any, Any, Any, bytes]] = {}


def _entry(identity: Sequence[Any], params: GenerationParams) -> tuple[Any, Any, Any, bytes]:
    entry = _prefixes.get(id(params))
    if entry is None or entry[0] is not params or not _same(entry[1], identity):
        shared = canonical(["outlines.draw", FORMAT, list(identity), params.to_dict()])
        prefix = hashlib.blake2b(shared, digest_size=KEY_BYTES)
        prefix.update(b"\0")
        if len(_prefixes) >= 1024:
            _prefixes.clear()
        entry = _prefixes[id(params)] = (params, identity, prefix, prefix.digest())
    return entry


def _prefix(identity: Sequence[Any], params: GenerationParams) -> Any:
    """The hash state after the part of a key that every draw of ``params`` shares."""
    return _entry(identity, params)[2]


#: A slot (the draws of one params and one draw number: ``outlines.draws.Slot``) of one
#: backend identity, as the cache keys it: ``(digest of the shared part of its draws' keys, draw number)``.
SlotKey = tuple[bytes, int]


class SlotDraws(NamedTuple):
    """The draws of one batch that fall in one slot (see ``draw_slots``)."""

    slot: SlotKey
    hasher: Any  # the shared part's hash state: ``prompt_keys`` copies it per prompt
    number: int
    positions: list[int] | None  # positions in the batch; None: all of them


def draw_slots(identity: Sequence[Any], draws: Sequence[Draw]) -> list[SlotDraws]:
    """Split a batch's draws by slot (``DrawColumns.by_slot``: usually one), each keyed for ``identity``."""
    out = []
    for slot, positions in DrawColumns.of(draws).by_slot():
        entry = _entry(identity, slot.params)
        out.append(SlotDraws((entry[3], slot.number), entry[2], slot.number, positions))
    return out


def prompt_keys(hasher: Any, number: int, prompts: Iterable[Any]) -> list[bytes]:
    """The ``draw_key`` of each prompt of one slot (``hasher``: ``SlotDraws.hasher``)."""
    copy = hasher.copy
    escape = encode_basestring_ascii
    keys: list[bytes] = []
    append = keys.append
    for prompt in prompts:
        digest = copy()
        if type(prompt) is str:  # canonical([prompt, number]) without the dispatch
            digest.update(b"[%s,%d]" % (escape(prompt).encode("ascii"), number))
        else:
            digest.update(canonical([prompt, number]))
        append(digest.digest())
    return keys


def draw_key(identity: Sequence[Any], draw: Draw) -> bytes:
    """The content hash of one draw.

    Parameters
    ----------
    identity
        The backend's identity (kind, model, base URL...; never a secret).
    draw
        The draw: prompt, params (seed included) and draw number. Greedy
        draws arrive with ``draw=0``.

    Returns
    -------
    bytes
        16 bytes: BLAKE2b of ``canonical(["outlines.draw", FORMAT, identity,
        params])``, a NUL byte and ``canonical([prompt, draw])``.

    Examples
    --------
    >>> from outlines.draws import Draw, GenerationParams
    >>> key = draw_key(("function", "f"), Draw("hi", GenerationParams(), 0))
    >>> len(key)
    16
    """
    return draw_keys(identity, (draw,))[0]


def draw_keys(identity: Sequence[Any], draws: Sequence[Draw]) -> list[bytes]:
    """``draw_key`` of each draw of a batch (one backend), in order.

    The shared part of the key is hashed once per distinct params object in
    the batch (a batch usually has one), and each draw adds only its prompt
    and draw number: the same bytes ``draw_key`` hashes, at a fraction of the
    cost per draw.

    Parameters
    ----------
    identity
        The backend's identity, as for ``draw_key``.
    draws
        The draws of the batch.

    Returns
    -------
    list of bytes
        One 16-byte key per draw, in order.

    Examples
    --------
    >>> from outlines.draws import Draw, GenerationParams
    >>> params = GenerationParams(temperature=0.7)
    >>> keys = draw_keys(("function", "f"), [Draw("a", params, 0), Draw("a", params, 1)])
    >>> keys[0] == draw_key(("function", "f"), Draw("a", params, 0)) and keys[0] != keys[1]
    True
    """
    keys: list[bytes] = []
    append = keys.append
    params: Any = None
    copy: Any = None
    escape = encode_basestring_ascii
    if isinstance(draws, DrawColumns):  # read its columns, make no Draw objects
        columns: Iterable[tuple[Any, Any, Any]] = zip(draws.prompts, draws.params, draws.numbers)
    else:
        columns = ((d.prompt, d.params, d.draw) for d in draws)
    for prompt, each, draw in columns:
        if each is not params:
            params = each
            copy = _prefix(identity, params).copy
        digest = copy()
        if type(prompt) is str and type(draw) is int:  # canonical([prompt, draw]) without the dispatch
            digest.update(b"[%s,%d]" % (escape(prompt).encode("ascii"), draw))
        else:
            digest.update(canonical([prompt, draw]))
        append(digest.digest())
    return keys
