"""The ``Cache``: draws in memory by slot and prompt, in front of a SQLite file keyed by draw.

State: ``_slots`` holds, per slot (``keys.SlotKey``: the draws of one backend
identity, params and draw number), a table prompt -> text, least recently
used slot first; ``_unindexed`` holds per slot the *blocks* not in its table
yet (a block: the draws of one slot stored by one ``put_draws``), indexed
when a lookup first shares a prompt with them. The file
(``outlines.cache.sqlite``) is written by a background writer
(``outlines.cache.disk``), which hashes the blocks' keys off the event loop.
``get_draws``/``put_draws``/``peek_draws`` are the scheduler's API;
``get_many``/``put_many`` are a thin keyed API over the file for users who
hold ``draw_key`` digests. Nothing here raises on a damaged or locked file:
it warns and misses.
"""
from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections import OrderedDict
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from outlines.cache.disk import Block, disk
from outlines.cache.keys import SlotKey, SlotDraws, draw_keys, draw_slots, prompt_keys
from outlines.cache.sqlite import FORMAT, KEY_BYTES, encode
from outlines.draws import Draw, DrawColumns
from outlines.common.errors import CacheWarning
from outlines.graph.ops import all_text

__all__ = ["Cache", "default_directory"]

_live: weakref.WeakSet[Cache] = weakref.WeakSet()


class Cache:
    """Draws in memory by slot and prompt (least recently used evicted first), in front of a SQLite file.

    Parameters
    ----------
    path
        A directory (created with mode 0700) holding ``draws-v<FORMAT>.sqlite3``,
        or an existing ``.sqlite3``/``.db`` file. ``None``: the default directory
        (``OUTLINES_CACHE_DIR``, else ``~/.cache/outlines``).
    max_bytes
        Keep at most this many bytes of entries on disk, evicting the least
        recently used. ``None``: unlimited.
    memory_entries, memory_bytes
        Bounds of the memory: draws, and bytes held (prompt and text, plus
        about 120 bytes per draw), evicted a whole slot at a time, least
        recently used first. The default holds some 400,000 short
        completions, so re-evaluating a program over 100,000 inputs with
        three model calls reads no disk.
    timeout
        Seconds to wait for another process's write lock before giving up on
        one write (with a warning).

    Raises
    ------
    NotACacheFile
        When ``path`` names an existing file the cache did not make (a text
        file, another program's database): it is neither used nor moved.

    Examples
    --------
    >>> import tempfile
    >>> from outlines import models
    >>> cache = Cache(tempfile.mkdtemp())
    >>> llm = models.from_function(lambda prompt: prompt.upper(), name="upper")
    >>> llm("hi").eval(cache=cache)
    'HI'
    >>> cache.stats()["entries"]
    1
    >>> from outlines.draws import Draw, GenerationParams
    >>> from outlines.cache.keys import draw_key
    >>> key = draw_key(("function", "f"), Draw("hi", GenerationParams(), 0))
    >>> cache.put_many({key: "v"}); cache.get_many([key]) == {key: "v"}
    True
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        max_bytes: int | None = None,
        *,
        memory_entries: int = 1_000_000,
        memory_bytes: int = 64 << 20,
        timeout: float = 30.0,
    ) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        location = Path(path).expanduser() if path is not None else default_directory()
        if location.suffix in (".sqlite3", ".sqlite", ".db") or location.is_file():
            self.file = location.absolute()
        else:
            self.file = location.absolute() / f"draws-v{FORMAT}.sqlite3"
        self.max_bytes = max_bytes
        self.memory_entries = memory_entries
        self.memory_bytes = memory_bytes
        self._memory_size = 0
        self.timeout = timeout
        self.hits = 0
        self.misses = 0
        # Draws stored through ``put_draws``: slot -> prompt -> text, least recently used slot first.
        self._slots: OrderedDict[SlotKey, dict[Any, str]] = OrderedDict()
        self._slot_bytes: dict[SlotKey, int] = {}
        self._slot_entries = 0
        # Blocks stored but not in their slot's table yet: (prompts, texts). A
        # lookup indexes only those that share a prompt with it (see _index).
        self._unindexed: dict[SlotKey, list[tuple[list[Any], list[str]]]] = {}
        self._evicted = False  # whether a draw stored through put_draws has left memory
        self._lock = threading.RLock()
        self._disk = disk(self.file, timeout)
        _live.add(self)

    @property
    def path(self) -> Path:
        """The SQLite file."""
        return self.file

    def __repr__(self) -> str:
        return f"Cache({str(self.file)!r}, max_bytes={self.max_bytes})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Cache, (str(self.file), self.max_bytes))

    def get_many(
        self, keys: Sequence[bytes], *, record: bool = True, expect: type | None = None
    ) -> dict[bytes, Any]:
        """Values of the ``keys`` that are stored (queued or committed); misses are absent. One query.

        The keyed API, for users holding ``draw_key`` digests: it reads the
        file (and the writes queued for it) by key; memory holds only the
        draws stored by slot (``put_draws``), which the scheduler uses.
        ``record=False`` (dry runs) leaves the hit and miss counters and the
        least-recently-used stamps alone. With ``expect`` (``str`` for model
        draws), a value of another type is a miss, with a warning, and is
        overwritten when the draw is stored again.

        Raises
        ------
        TypeError
            When a key is not a ``draw_key`` digest (16 bytes).
        """
        _check_keys(keys)
        found, damaged = self._disk.read(keys)
        if damaged:
            self._warn_damaged(damaged, stacklevel=3)
        if expect is not None:
            self._drop_wrong(found, expect, lambda key: f"key {key.hex()[:16]}...", stacklevel=3)
        if record:
            with self._lock:
                self.hits += len(found)
                self.misses += len(keys) - len(found)
            if self.max_bytes is not None and found:
                self._disk.submit((), list(found), self.max_bytes)
        return found

    def put_many(self, items: Mapping[bytes, Any]) -> None:
        """Store ``items`` (key -> JSON value) in the file; each call is committed whole or not at all.

        Raises
        ------
        TypeError
            When a key is not a ``draw_key`` digest (16 bytes).
        """
        _check_keys(items)
        rows: list[tuple[bytes, str | bytes]] = []
        for key, value in items.items():
            try:
                rows.append((key, value if type(value) is str else encode(value)))
            except (TypeError, ValueError) as exc:
                warnings.warn(f"outlines cache: not storing a non-JSON value ({exc})", CacheWarning, stacklevel=2)
        if rows:
            self._disk.submit(rows, (), self.max_bytes)

    def get_draws(
        self, identity: Sequence[Any], draws: Sequence[Draw], *, record: bool = True, members: Any = None
    ) -> list[str | None]:
        """The cached text of each of a batch's ``draws`` under a backend ``identity``; ``None``: a miss.

        The draws' keys (``draw_keys``) are what the file holds, but memory
        holds draws by slot and prompt (``outlines.cache.keys.draw_slots``):
        a batch of 100,000 draws is a few C-speed passes, and a key is hashed
        only for a draw that has to be read from the file. A stored value
        that is not text is a miss, with a warning. ``record=False`` counts
        no hits and refreshes no use stamps. ``members``: a set or dict view
        holding (at least) the batch's prompts, when the caller has one: then
        draws stored since the last lookup are set aside unread unless they
        share a prompt with the batch.
        """
        draws = DrawColumns.of(draws)
        prompts_all = draws.prompts
        out: list[Any] = [None] * len(prompts_all)
        looked: list[tuple[SlotDraws, list[Any], list[Any]]] = []  # per slot: its prompts, their values so far
        for part in draw_slots(identity, draws):
            prompts = prompts_all if part.positions is None else [prompts_all[i] for i in part.positions]
            with self._lock:
                table = self._slots.get(part.slot)
                if part.slot in self._unindexed:
                    self._index(part.slot, members if part.positions is None else None)
                if table:
                    values: list[Any] = list(map(table.get, prompts))
                    if record:
                        self._slots.move_to_end(part.slot)
                else:
                    values = [None] * len(prompts)
            looked.append((part, prompts, values))
        # The misses of every slot are read from the file in one lookup.
        wanted = [(at, [p for p, v in zip(prompts, values) if v is None] if misses < len(prompts) else prompts)
                  for at, (_, prompts, values) in enumerate(looked) if (misses := values.count(None))]
        if wanted:
            with self._lock:
                sole = not self._evicted and self._disk.block_writers <= {id(self)}
            founds = self._read_draws([(looked[at][0], prompts) for at, prompts in wanted], sole)
            for (at, _), found in zip(wanted, founds):
                if found:
                    part, prompts, values = looked[at]
                    get = found.get
                    looked[at] = (part, prompts, [get(p) if v is None else v for p, v in zip(prompts, values)])
        hits = 0
        touched: list[bytes] = []
        for part, prompts, values in looked:
            got = len(values) - values.count(None)
            hits += got
            if part.positions is None:
                out = values
            else:
                for position, value in zip(part.positions, values):
                    out[position] = value
            if record and self.max_bytes is not None and got:
                touched.extend(prompt_keys(part.hasher, part.number, [p for p, v in zip(prompts, values) if v is not None]))
        if record:
            with self._lock:
                self.hits += hits
                self.misses += len(prompts_all) - hits
        if touched:
            self._disk.submit((), touched, self.max_bytes)
        return out

    def peek_draws(self, identity: Sequence[Any], draws: Sequence[Draw]) -> list[str] | None:
        """The texts of ``draws`` when memory holds every one of them (counted as hits), else ``None``.

        One pass and no file access: the scheduler asks before queueing a
        large node, so a warm re-evaluation skips the queue altogether.
        """
        draws = DrawColumns.of(draws)
        prompts = draws.prompts
        if not prompts:
            return None
        parts = draw_slots(identity, draws)
        if len(parts) != 1:
            return None
        slot = parts[0].slot
        with self._lock:
            table = self._slots.get(slot)
            if table is None:
                return None
            values = self._peek_block(slot, prompts)  # a re-run of one stored call: its block answers as it is
            if values is None:
                if prompts[0] not in table:
                    blocks = self._unindexed.get(slot, ())
                    if not any(prompts[0] in block for block, _ in blocks):
                        return None
                self._index(slot)
                found: list[Any] = list(map(table.get, prompts))
                if None in found:
                    return None
                values = found
            self._slots.move_to_end(slot)
            self.hits += len(values)
        if self.max_bytes is not None:
            self._disk.submit((), prompt_keys(parts[0].hasher, parts[0].number, prompts), self.max_bytes)
        return values

    def _peek_block(self, slot: SlotKey, prompts: list[Any]) -> list[str] | None:
        """Called with the lock held: ``prompts``' texts from the slot's newest block holding exactly them.

        That block must hold them in order, and no newer block may share a
        prompt with it; else ``None``.

        What indexing every block and looking each prompt up gives (a block's
        text wins over the table's, a newer block's over an older's), without
        hashing a block into the table: a re-run of one call finds the block
        its first run stored, with one comparison of the prompt lists.
        """
        blocks = self._unindexed.get(slot)
        if not blocks:
            return None
        count, first = len(prompts), prompts[0]
        for at in range(len(blocks) - 1, -1, -1):
            stored, texts = blocks[at]
            if len(stored) == count and stored[0] == first and stored == prompts:
                break
        else:
            return None
        if at + 1 < len(blocks):
            wanted = set(prompts)
            if not all(wanted.isdisjoint(newer) for newer, _ in blocks[at + 1 :]):
                return None
        return list(texts)

    def _read_draws(self, wanted: list[tuple[SlotDraws, list[Any]]], sole: bool) -> list[dict[Any, str]]:
        """The texts the file (or the writer's queue) holds of each slot's ``prompts``: one lookup for all."""
        founds, damaged = self._disk.get_draws([(part.slot, part.hasher, part.number, prompts)
                                                for part, prompts in wanted], sole=sole)
        if damaged:
            self._warn_damaged(damaged, stacklevel=4)
        for found in founds:
            self._drop_wrong(found, str, lambda prompt: f"the draw of prompt {str(prompt)[:40]!r}", stacklevel=4)
        with self._lock:
            for (part, _), found in zip(wanted, founds):
                if found:
                    self._remember_draws(part.slot, list(found), list(found.values()))
        return founds

    def _drop_wrong(self, found: dict[Any, Any], expect: type, example: Callable[[Any], str], stacklevel: int) -> None:
        """Drop the values in ``found`` not of type ``expect`` (misses, recomputed), with one warning."""
        wrong = [key for key, value in found.items() if not isinstance(value, expect)]
        if not wrong:
            return
        warnings.warn(
            f"outlines cache: {len(wrong)} entr{'y' if len(wrong) == 1 else 'ies'} in {self.file} not of type "
            f"{expect.__name__} (e.g. {example(wrong[0])}) treated as misses; they will be recomputed",
            CacheWarning,
            stacklevel=stacklevel + 1,
        )
        for key in wrong:
            del found[key]

    def _warn_damaged(self, damaged: list[tuple[int, Any]], stacklevel: int) -> None:
        warnings.warn(
            f"outlines cache: {len(damaged)} damaged entr{'y' if len(damaged) == 1 else 'ies'} "
            f"in {self.file} (e.g. key {damaged[0][0] & 0xFFFFFFFFFFFFFFFF:016x}...) treated as misses; they will be "
            "recomputed",
            CacheWarning,
            stacklevel=stacklevel,
        )

    def put_draws(self, identity: Sequence[Any], draws: Sequence[Draw], texts: Sequence[str]) -> None:
        """Store the text of each of ``draws`` under a backend ``identity``.

        Memory takes them at once; the writer thread hashes their keys and
        commits them, each call whole. A value that is not text is stored
        through ``put_many`` (keys hashed here).
        """
        texts = list(texts)
        if not texts:
            return
        if not all_text(texts):
            self.put_many(dict(zip(draw_keys(identity, draws), texts)))
            return
        draws = DrawColumns.of(draws)
        prompts_all = draws.prompts
        blocks = []
        for part in draw_slots(identity, draws):
            if part.positions is None:
                prompts, values = list(prompts_all), texts
            else:
                prompts, values = [prompts_all[i] for i in part.positions], [texts[i] for i in part.positions]
            blocks.append(Block(part.slot, part.hasher, part.number, prompts, values))
        with self._lock:
            for block in blocks:
                self._remember_draws(block.slot, block.prompts, block.values, index=False)
        self._disk.submit_blocks(blocks, id(self), self.max_bytes)

    def _remember_draws(self, slot: SlotKey, prompts: list[Any], texts: list[str], index: bool = True) -> None:
        """Called with the lock held. ``index=False``: keep them as a block until a lookup needs them."""
        table = self._slots.get(slot)
        if table is None:
            table = self._slots[slot] = {}
            self._slot_bytes[slot] = 0
        else:
            self._slots.move_to_end(slot)
        size = sum(map(len, prompts)) + sum(map(len, texts))
        if index:
            before = len(table)
            table.update(zip(prompts, texts))
            added = len(table) - before
        else:  # counted whole until indexed
            self._unindexed.setdefault(slot, []).append((prompts, texts))
            added = len(prompts)
        size += _ENTRY_BYTES * added
        self._slot_bytes[slot] += size
        self._slot_entries += added
        self._memory_size += size
        self._trim()

    def _index(self, slot: SlotKey, members: Any = None) -> None:
        """Put a slot's blocks in its table: all, or those sharing a prompt with ``members``."""
        blocks = self._unindexed.pop(slot, None)
        if not blocks:
            return
        table = self._slots[slot]
        kept = []
        for prompts, texts in blocks:
            if members is not None and members.isdisjoint(prompts):
                kept.append((prompts, texts))
                continue
            before = len(table)
            table.update(zip(prompts, texts))
            repeated = len(prompts) - (len(table) - before)  # counted when stored, not new here
            self._slot_entries -= repeated
            self._memory_size -= repeated * _ENTRY_BYTES
        if kept:
            self._unindexed[slot] = kept

    def flush(self) -> None:
        """Wait until every entry put so far is committed to the file."""
        self._disk.writer.flush()

    def clear(self) -> None:
        """Remove every entry (memory and disk); counters are kept."""
        with self._lock:
            self._slots.clear()
            self._unindexed.clear()
            self._slot_bytes.clear()
            self._slot_entries = 0
            self._memory_size = 0
            self._disk.clear()

    def stats(self) -> dict[str, Any]:
        """``entries`` and ``bytes`` on disk, this process's ``hits`` and ``misses``."""
        totals = self._disk.totals()
        with self._lock:
            entries, size = totals if totals is not None else (self._slot_entries, 0)
            return {"entries": entries, "bytes": size, "hits": self.hits, "misses": self.misses,
                    "path": str(self.file)}

    def close(self) -> None:
        """Commit what is queued and close the file (it reopens on next use)."""
        self._disk.close()

    def _trim(self) -> None:
        """Evict the least recently used slots until within bounds."""
        slots = self._slots
        size = self._memory_size
        while size > self.memory_bytes or self._slot_entries > self.memory_entries:
            if not slots:
                break
            self._evicted = True
            slot, table = next(iter(slots.items()))
            if len(slots) == 1 and slot in self._unindexed:  # about to keep half of it: all of it first
                self._memory_size = size
                self._index(slot)
                size, table = self._memory_size, slots[slot]
            if len(slots) > 1 or len(table) < 2:
                del slots[slot]
                size -= self._slot_bytes.pop(slot)
                self._slot_entries -= len(table) + sum(len(p) for p, _ in self._unindexed.pop(slot, ()))
                continue
            # One slot over the bounds alone: keep its newer half.
            kept = dict(islice(table.items(), len(table) // 2, None))
            freed = self._slot_bytes[slot] * (len(table) - len(kept)) // len(table)
            slots[slot] = kept
            self._slot_bytes[slot] -= freed
            self._slot_entries -= len(table) - len(kept)
            size -= freed
        self._memory_size = size


def _check_keys(keys: Iterable[bytes]) -> None:
    keys = list(keys)
    try:
        whole = len(b"".join(keys)) == KEY_BYTES * len(keys)  # one C pass; no key is longer or shorter
    except TypeError:
        whole = False
    if not whole:
        bad = next(k for k in keys if type(k) is not bytes or len(k) != KEY_BYTES)
        raise TypeError(f"cache keys are {KEY_BYTES}-byte digests from outlines.cache.draw_key, got {bad!r:.60}")


#: What an entry of the memory layer costs beyond its text (key, node, links), roughly.
_ENTRY_BYTES = 120


def _after_fork() -> None:
    for cache in list(_live):
        cache._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def default_directory() -> Path:
    """``OUTLINES_CACHE_DIR``, else ``~/.cache/outlines`` (read at each call).

    Returns
    -------
    pathlib.Path
        The folder of the default cache (created when first used).

    Examples
    --------
    >>> import os
    >>> default_directory() == Path(os.environ.get("OUTLINES_CACHE_DIR") or "~/.cache/outlines").expanduser()
    True
    """
    return Path(os.environ.get("OUTLINES_CACHE_DIR") or Path.home() / ".cache" / "outlines").expanduser()
