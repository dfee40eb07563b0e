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
who hold keys. This module holds the process default cache and its controls:
``enable``, ``disable``, ``clear``, ``stats`` and ``resolve``.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from outlines.cache.keys import draw_key, draw_keys
from outlines.cache.sqlite import NotACacheFile
from outlines.errors import CacheWarning
from outlines.cache.store import Cache, default_directory

__all__ = ["Cache", "CacheWarning", "NotACacheFile", "clear", "default_directory", "disable", "draw_key", "draw_keys", "enable", "resolve", "stats"]


# -- the process default and its controls ---------------------------------------
_enabled: bool | None = None  # None: follow OUTLINES_CACHE
_path: str | None = None
_defaults: dict[str, Cache] = {}
_defaults_lock = threading.Lock()


def _configured() -> Cache:
    location = str(Path(_path).expanduser() if _path is not None else default_directory())
    with _defaults_lock:
        cache = _defaults.get(location)
        if cache is None:
            cache = _defaults[location] = Cache(location)
        return cache


def _env_disabled() -> bool:
    return os.environ.get("OUTLINES_CACHE", "1").strip().lower() in ("0", "false", "no", "off")


def resolve(option: Any) -> Cache | None:
    """The cache an ``eval(cache=...)`` option means.

    Parameters
    ----------
    option
        ``True``: the process default (``None`` after ``disable()`` or with
        ``OUTLINES_CACHE=0``); ``False``/``None``: no cache; a ``Cache``:
        itself; a path: a ``Cache`` there (one per path per process).

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
    if option is True:
        if _enabled is False or (_enabled is None and _env_disabled()):
            return None
        return _configured()
    if option is False or option is None:
        return None
    if isinstance(option, Cache):
        return option
    if isinstance(option, (str, os.PathLike)):
        location = str(Path(option).expanduser().absolute())
        with _defaults_lock:
            return _defaults.setdefault(location, Cache(location))
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
    global _enabled
    _enabled = False


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
    global _enabled, _path
    _enabled, _path = True, (os.fspath(path) if path is not None else None)


def clear() -> None:
    """Remove every entry of the default cache (memory and disk).

    Examples
    --------
    >>> import outlines
    >>> outlines.cache.clear()
    >>> outlines.cache.stats()["entries"]
    0
    """
    _configured().clear()


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
