"""``outlines.tracing``: the public name of ``outlines.runtime.tracing`` (``Trace`` and its records).

The runtime never imports this module; it is the documented path for users
(``outlines.trace()`` returns an ``outlines.tracing.Trace``).
"""
from __future__ import annotations

from outlines.runtime.events import Recorder
from outlines.runtime.tracing import (
    BatchRecord,
    IterationRecord,
    ModelLoadRecord,
    NodeRecord,
    RequestRecord,
    Trace,
    trace,
)

__all__ = [
    "BatchRecord",
    "IterationRecord",
    "ModelLoadRecord",
    "NodeRecord",
    "Recorder",
    "RequestRecord",
    "Trace",
    "trace",
]
