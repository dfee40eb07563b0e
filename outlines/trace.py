"""Events of an evaluation (placeholder: the hook protocol only).

The scheduler reports to the active ``Recorder``: node start/end, batches sent
to backends, cache hits and token usage. ``outlines.trace()`` installs one.
"""
from __future__ import annotations

import contextvars
from typing import Any

__all__ = ["Recorder", "active_recorder"]


class Recorder:
    """Receives scheduler events; every method is a no-op here."""

    def eval_started(self, plan: Any, t: float) -> None: ...

    def eval_finished(self, t: float, error: BaseException | None) -> None: ...

    def node_started(self, node: Any, t: float) -> None: ...

    def node_finished(self, node: Any, t: float, error: BaseException | None = None) -> None: ...

    def node_cache(self, node: Any, hits: int, misses: int) -> None: ...

    def batch_started(self, batch_id: int, backend: Any, nodes: list[Any], size: int, t: float) -> None: ...

    def batch_finished(
        self, batch_id: int, t: float, error: BaseException | None, usage: tuple[int, int], worker: str | None
    ) -> None: ...


NULL_RECORDER = Recorder()
_active: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("outlines_recorder", default=None)


def active_recorder() -> Recorder:
    return _active.get() or NULL_RECORDER
