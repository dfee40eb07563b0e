"""Warm a provider's prompt cache once per shared head, then send the rest.

A provider caches a prompt's head only once a request carrying it has been
processed (OpenAI: automatically, for 1,024 tokens or more; Anthropic: at
``cache_control`` breakpoints, and its documentation says to wait for the
first response before sending parallel requests that should hit it).
Sending a batch's siblings all at once makes them all miss.

``Warmup`` plans the requests of each batch: per group of requests that share
a head long enough to be cached (``prefix.prefix_groups``, then the
backend's ``cacheable`` test), one *leader* goes at once and the *followers*
wait until the leader's response starts (its status line and headers
arrived, or its attempt failed), at most ``wait`` seconds: one request
latency more per group, never more. Heads are remembered for the life of the
``Warmup`` (one per event loop and backend client: one evaluation), so the
batches of one round that share a head (the scheduler cuts 200 prompts into
batches of 16) warm it once: a later group whose head matches a remembered
one, within ``tolerance`` characters, follows that leader instead of leading.

``exact`` is for caches that hit only at marked boundaries (Anthropic's
breakpoints): a remembered head then serves a group only if the group's head
starts with it, and each request's ``Turn.heads`` lists the boundaries to
mark: the remembered heads its text starts with (the longest three) and its
group's own head, within Anthropic's limit of four breakpoints.
"""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from outlines.draws.prefix import common_prefix_length, prefix_groups

__all__ = ["ALONE", "MAX_BOUNDARIES", "TOLERANCE", "Turn", "Warm", "Warmup", "joined"]

#: Characters a remembered head may fall short of a group's head and still
#: serve it (about one 128-token block of OpenAI's cache, at 4 characters a token).
TOLERANCE = 512
#: Cache boundaries marked in one request (Anthropic allows four breakpoints).
MAX_BOUNDARIES = 4
#: Heads remembered; the oldest are forgotten first.
REMEMBERED = 1024


class Warm:
    """One head being put in the provider's cache: its leader's response starts, then followers go."""

    def __init__(self, head: str, deadline: float) -> None:
        self.head = head
        self.deadline = deadline
        self.ready = asyncio.Event()

    def started(self) -> None:
        """The leader's response started (or its attempt ended): release the followers."""
        self.ready.set()

    async def wait(self) -> None:
        """Until the leader's response starts, or the deadline passes."""
        if self.ready.is_set():
            return
        remaining = self.deadline - asyncio.get_running_loop().time()
        if remaining > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ready.wait(), remaining)


@dataclass(frozen=True)
class Turn:
    """How one request of a batch goes: it leads a head, follows one, or neither.

    ``heads``: character offsets in the request's text where the provider's
    cache should end (ascending; empty when nothing is shared).
    """

    lead: Warm | None = None
    after: Warm | None = None
    heads: tuple[int, ...] = ()

    async def ready(self) -> None:
        """Wait for the leader this request follows, if any."""
        if self.after is not None:
            await self.after.wait()

    def started(self) -> None:
        """Called when this request's response starts: a leader releases its followers."""
        if self.lead is not None:
            self.lead.started()


ALONE = Turn()


class Warmup:
    """The heads warmed so far on one event loop, and the plan of each batch (see the module docstring)."""

    def __init__(self) -> None:
        self.warm: list[Warm] = []

    def turns(
        self,
        texts: Sequence[str],
        cacheable: Callable[[str], bool],
        *,
        min_chars: int,
        wait: float,
        exact: bool = False,
        tolerance: int = TOLERANCE,
    ) -> list[Turn]:
        """One ``Turn`` per request text.

        Parameters
        ----------
        texts
            The requests' prompts as one text each (messages joined in order).
        cacheable
            Whether a shared head is long enough for the provider to cache.
        min_chars
            The shortest head, in characters, that ``cacheable`` could accept.
        wait
            The most seconds a follower waits for its leader.
        exact
            The cache hits only at marked boundaries (Anthropic).
        tolerance
            Characters a remembered head may fall short of a group's head and serve it.

        Returns
        -------
        list[Turn]
            ``ALONE`` for requests that share no cacheable head.
        """
        out = [ALONE] * len(texts)
        loop = asyncio.get_running_loop()
        for head, members in prefix_groups(texts, max(1, min_chars)).groups():
            if len(members) == 1:  # nothing to lead; it may still follow another batch's head
                if self.warm and len(texts[members[0]]) >= min_chars:
                    out[members[0]] = self._follow(texts[members[0]], cacheable, exact, None)
                continue
            text = texts[members[0]][:head]
            if not cacheable(text):
                continue
            turn = self._follow(text, cacheable, exact, tolerance)
            if turn is not ALONE:
                for member in members:
                    out[member] = turn
                continue
            chain = self._prefixes(text) if exact else []
            warm = Warm(text, loop.time() + wait)
            self._remember(warm)
            heads = tuple(len(w.head) for w in chain[-(MAX_BOUNDARIES - 1):]) + (head,)
            out[members[0]] = Turn(lead=warm, heads=heads)
            for member in members[1:]:
                out[member] = Turn(after=warm, heads=heads)
        return out

    def _follow(self, head: str, cacheable: Callable[[str], bool], exact: bool, tolerance: int | None) -> Turn:
        """The turn of requests sharing ``head`` when a remembered head serves them, else ``ALONE``.

        A remembered head serves when the two share all of ``head`` but
        ``tolerance`` characters (``None``: any cacheable part), the longest
        shared part winning.
        """
        best, best_shared = None, 0
        for warm in self.warm:
            if exact:
                shared = len(warm.head) if head.startswith(warm.head) else 0
            else:  # the provider caches whatever the two have in common
                shared = common_prefix_length(head, warm.head)
            if shared > best_shared and (tolerance is None or shared >= len(head) - tolerance):
                best, best_shared = warm, shared
        if best is None or not (exact or cacheable(head[:best_shared])):
            return ALONE
        if exact:
            return Turn(after=best, heads=tuple(len(w.head) for w in self._prefixes(head)[-MAX_BOUNDARIES:]))
        return Turn(after=best, heads=(best_shared,))

    def _prefixes(self, head: str) -> list[Warm]:
        """Remembered heads that ``head`` starts with, shortest first (one per length)."""
        found = {len(w.head): w for w in self.warm if head.startswith(w.head)}
        return [found[length] for length in sorted(found)]

    def _remember(self, warm: Warm) -> None:
        self.warm.append(warm)
        if len(self.warm) > REMEMBERED:
            del self.warm[: len(self.warm) - REMEMBERED]


def joined(messages: Sequence[Mapping[str, str]]) -> str:
    """Messages as one text, in order, each its role then its content after a separator.

    What a prompt cache sees of a chat request: two requests share a cached
    head as far as their joined texts agree (``Warmup.turns`` takes these).

    Examples
    --------
    >>> joined([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    '\\x1esystem\\x1fBe brief.\\x1euser\\x1fHi'
    """
    return "".join(f"\x1e{m['role']}\x1f{m['content']}" for m in messages)
