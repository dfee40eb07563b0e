"""Content-addressed cache of model draws: keys, the ``Cache`` and its controls.

The key of one draw (``draw_key``, or ``draw_keys`` for a batch, from
``outlines.cache.keys``) is a 16-byte BLAKE2b digest of the format version,
backend identity, parameters, prompt text and draw number. A ``Cache``
(``outlines.cache.store``) keeps the draws the scheduler stores in memory, by
*slot* (the draws of one backend identity, params and draw number) and
prompt, in front of a SQLite file (``outlines.cache.sqlite``) that a
background writer commits to (``outlines.cache.disk``). The scheduler uses
one API, by slot: ``get_draws``/``put_draws`` (and ``peek_draws``); the keyed
``get_many``/``put_many`` read and write the file by ``draw_key`` for users
who hold keys. This module holds the controls of the process default cache:
``enable``, ``disable``, ``clear``, ``stats`` and ``resolve``; what they set
lives on the process state (``outlines.common.config.ProcessState``: ``cache_enabled``,
``cache_path``, and the ``Cache`` of each path opened).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from outlines.cache.keys import draw_key, draw_keys
from outlines.cache.sqlite import NotACacheFile
from outlines.common.config import ProcessState, process_state
from outlines.common.errors import CacheWarning
from outlines.cache.store import Cache, default_directory

__all__ = ["Cache", "CacheWarning", "NotACacheFile", "clear", "default_directory", "disable", "draw_key", "draw_keys", "enable", "resolve", "stats"]


# -- the process default and its controls ---------------------------------------
def _opened(state: ProcessState, location: str) -> Cache:
    """The ``Cache`` at ``location``: one per path per process state."""
    with state.cache_lock:
        cache: Cache | None = state.caches.get(location)
        if cache is None:
            cache = state.caches[location] = Cache(location)
        return cache


def _configured(state: ProcessState) -> Cache:
    path = state.cache_path
    return _opened(state, str(Path(path).expanduser() if path is not None else default_directory()))


def _env_disabled() -> bool:
    return os.environ.get("OUTLINES_CACHE", "1").strip().lower() in ("0", "false", "no", "off")


def resolve(option: Any, state: ProcessState | None = None) -> Cache | None:
    """The cache an ``eval(cache=...)`` option means.

    Parameters
    ----------
    option
        ``True``: the process default (``None`` after ``disable()`` or with
        ``OUTLINES_CACHE=0``); ``False``/``None``: no cache; a ``Cache``:
        itself; a path: a ``Cache`` there (one per path per process).
    state
        The process state holding the default and the caches opened
        (default: ``outlines.common.config.process_state()``).

    Returns
    -------
    Cache or None

    Raises
    ------
    TypeError
        For any other value.

    Examples
    --------
    >>> resolve(False) is None
    True
    >>> resolve(True) is resolve(True)
    True
    """
    if option is False or option is None:
        return None
    if isinstance(option, Cache):
        return option
    state = state if state is not None else process_state()
    if option is True:
        enabled = state.cache_enabled
        if enabled is False or (enabled is None and _env_disabled()):
            return None
        return _configured(state)
    if isinstance(option, (str, os.PathLike)):
        return _opened(state, str(Path(option).expanduser().absolute()))
    raise TypeError(f"cache must be True, False, a Cache or a path, got {type(option).__name__}")


def disable() -> None:
    """Turn the default cache off for this process (``eval(cache=True)`` then uses none).

    Evaluations given a ``Cache`` or a path of their own still use it.

    Examples
    --------
    >>> import outlines
    >>> outlines.cache.disable()
    >>> outlines.cache.stats()["path"] is None
    True
    >>> outlines.cache.enable()
    """
    process_state().cache_enabled = False


def enable(path: str | os.PathLike[str] | None = None) -> None:
    """Turn the default cache on (even if ``OUTLINES_CACHE=0``), optionally at ``path``.

    Parameters
    ----------
    path
        A folder (or ``.sqlite3`` file) for the default cache; ``None`` keeps
        ``OUTLINES_CACHE_DIR`` (else ``~/.cache/outlines``).

    Examples
    --------
    >>> import outlines, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> outlines.cache.enable(folder)
    >>> outlines.cache.stats()["path"].startswith(folder)
    True
    >>> outlines.cache.enable()
    """
    state = process_state()
    state.cache_enabled, state.cache_path = True, (os.fspath(path) if path is not None else None)


def clear() -> None:
    """Remove every entry of the default cache (memory and disk).

    Examples
    --------
    >>> import outlines
    >>> outlines.cache.clear()
    >>> outlines.cache.stats()["entries"]
    0
    """
    _configured(process_state()).clear()


def stats() -> dict[str, Any]:
    """Entries, bytes, hits and misses of the default cache (zeros when disabled).

    Returns
    -------
    dict
        ``entries`` and ``bytes`` on disk, this process's ``hits`` and
        ``misses``, and the file's ``path`` (``None`` when disabled).

    Examples
    --------
    >>> import outlines
    >>> sorted(outlines.cache.stats())
    ['bytes', 'entries', 'hits', 'misses', 'path']
    """
    cache = resolve(True)
    if cache is None:
        return {"entries": 0, "bytes": 0, "hits": 0, "misses": 0, "path": None}
    return cache.stats()
