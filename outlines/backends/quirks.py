"""What is known about servers: quirks noted per base URL, remembered across processes.

An OpenAI-compatible server may ignore ``n`` (``transformers serve``), refuse
a list of prompts, or refuse a request field (``FIELDS``). A backend notes a
quirk the first time a server shows it and works around it from then on.
Field quirks are noted per ``scope(base_url, model)`` (OpenAI's older models
refuse ``json_schema`` outputs), and only by a *probe*: a request carrying
nothing but the field, in a valid form, refused naming it. A 400 about what
one request held is that request's, never the server's; notes of names this
version does not know (an older version's) are not trusted.

A note is kept in the process state (``quirks_known``) and written through its
``quirk_store``: the package wires in the default cache's SQLite file
(``outlines.cache.quirks``, in ``outlines/__init__.py``: backends import
nothing from the cache), so a new process starts knowing it. A note older
than ``MAX_AGE`` (a week) is learned again; with the cache off, or its file
unusable, notes live in memory only: a forgotten quirk costs one request to
learn, never a wrong answer.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import Protocol

from outlines.common.config import process_state
from outlines.common.threads import run_blocking

__all__ = [
    "FIELDS", "IGNORES_N", "QUIRKS", "REFUSES_LISTS", "Quirk", "QuirkStore", "accepts", "forget", "known", "note",
    "note_accepted", "refuses", "scope", "use_store",
]

logger = logging.getLogger("outlines.backends.quirks")

#: The server answers one choice although ``n`` samples were asked.
IGNORES_N = "ignores_n"
#: ``/completions`` refuses a list of prompts (``prompt`` must be a string).
REFUSES_LISTS = "refuses_prompt_lists"
#: Request fields a server may not know, each probed on its own (``refuses``).
FIELDS = ("max_completion_tokens", "response_format", "guided_choice", "guided_regex", "guided_json")
QUIRKS = (IGNORES_N, REFUSES_LISTS, *(f"refuses_{field}" for field in FIELDS))
#: Seconds a note on disk is trusted.
MAX_AGE = 7 * 24 * 3600.0


def refuses(field: str) -> str:
    """The quirk of a server that refuses the request field ``field`` (one of ``FIELDS``).

    Examples
    --------
    >>> refuses("guided_choice")
    'refuses_guided_choice'
    """
    if field not in FIELDS:
        raise ValueError(f"unknown request field {field!r}; one of {', '.join(FIELDS)}")
    return f"refuses_{field}"


def scope(base_url: str, model: str) -> str:
    """Where a field quirk holds: one model at one server (what ``known`` and ``note`` take for them).

    Examples
    --------
    >>> scope("http://127.0.0.1:9/v1", "m")
    'http://127.0.0.1:9/v1 model=m'
    """
    return f"{base_url} model={model}"


class QuirkStore(Protocol):
    """Where notes outlive the process; each method may raise ``sqlite3.Error`` or ``OSError`` (then skipped)."""

    def read(self, base_url: str, *, newer_than: float) -> frozenset[str]:
        """The quirks noted for ``base_url`` since the Unix time ``newer_than``."""

    def write(self, base_url: str, quirk: str) -> None:
        """Note that ``base_url`` showed ``quirk`` now."""

    def clear(self) -> None:
        """Forget every note."""

    def where(self) -> str | None:
        """Where notes go, for log lines (``None``: nowhere now, e.g. the default cache is off)."""


_lock = threading.Lock()  # guards the process state's notes (``quirks_known``, ``quirks_accepted``)


def use_store(store: QuirkStore | None) -> None:
    """Keep notes in ``store`` from now on (``None``: in memory only): the process state's ``quirk_store``."""
    process_state().quirk_store = store


def _store() -> QuirkStore | None:
    return process_state().quirk_store


def known(base_url: str) -> frozenset[str]:
    """The quirks known for the server at ``base_url`` (names from ``QUIRKS``).

    Parameters
    ----------
    base_url
        The API root, as a backend holds it (``backend.base_url``), or a
        ``scope(base_url, model)`` for the fields it refuses.

    Returns
    -------
    frozenset of str
        Noted in this process, or by any process within ``MAX_AGE`` in the
        default cache's file (read once per base URL per process).

    Examples
    --------
    >>> known("http://127.0.0.1:9/v1")
    frozenset()
    """
    notes = process_state().quirks_known
    with _lock:
        found = notes.get(base_url)
    if found is None:
        found = set(_read(base_url))
        with _lock:
            found = notes.setdefault(base_url, found)
    return frozenset(found)


def _read(base_url: str) -> frozenset[str]:
    store = _store()
    if store is None:
        return frozenset()
    try:  # a name this version does not know is an older version's note: not trusted
        return store.read(base_url, newer_than=time.time() - MAX_AGE) & frozenset(QUIRKS)
    except (sqlite3.Error, OSError) as exc:
        logger.debug("server quirks of %s not read from %s: %s", base_url, store.where(), exc)
        return frozenset()


def note(base_url: str, quirk: str) -> bool:
    """Note that the server at ``base_url`` has ``quirk``, in this process; ``True`` when it is news.

    ``remember`` (awaited by the backends) writes news to disk off the event loop.
    """
    if quirk not in QUIRKS:
        raise ValueError(f"unknown server quirk {quirk!r}; one of {', '.join(QUIRKS)}")
    known(base_url)  # what the disk says, before adding to it
    notes = process_state().quirks_known
    with _lock:
        quirks = notes.setdefault(base_url, set())
        news = quirk not in quirks
        quirks.add(quirk)
    return news


async def remember(base_url: str, quirk: str) -> None:
    """Write the note to the store (in a worker thread; skipped, with a log line, on failure)."""
    store = _store()
    if store is None:
        return
    try:
        await run_blocking(store.write, base_url, quirk)
    except (sqlite3.Error, OSError) as exc:
        logger.debug("server quirk %s of %s not written to %s: %s", quirk, base_url, store.where(), exc)


def accepts(where: str, field: str) -> bool:
    """Whether a probe of this process found ``field`` taken at ``where`` (a ``scope``); kept in memory only.

    A refusal of one request naming the field is then that request's own.
    """
    with _lock:
        return (where, field) in process_state().quirks_accepted


def note_accepted(where: str, field: str) -> None:
    """Note that a probe found ``field`` taken at ``where``, for this process."""
    with _lock:
        process_state().quirks_accepted.add((where, field))


def forget() -> None:
    """Drop every note: in this process and in the store."""
    state = process_state()
    with _lock:
        state.quirks_known.clear()
        state.quirks_accepted.clear()
    store = _store()
    if store is not None:
        try:
            store.clear()
        except (sqlite3.Error, OSError) as exc:
            logger.debug("server quirks not cleared in %s: %s", store.where(), exc)


class Quirk:
    """The servers known to have one quirk, as a set of base URLs (``url in quirk``, ``quirk.add(url)``)."""

    def __init__(self, name: str) -> None:
        if name not in QUIRKS:
            raise ValueError(f"unknown server quirk {name!r}; one of {', '.join(QUIRKS)}")
        self.name = name

    def __contains__(self, base_url: object) -> bool:
        return isinstance(base_url, str) and self.name in known(base_url)

    def add(self, base_url: str) -> bool:
        """Note the quirk for ``base_url`` in this process; ``True`` when it is news (then ``remember`` it)."""
        return note(base_url, self.name)

    def __repr__(self) -> str:
        return f"Quirk({self.name!r})"
