"""Backends: the wire (or the model) behind each ``Model``; see ``base``.

The draws a backend answers, and their parameters, sit below it in ``outlines.draws``.
"""
from outlines.backends.base import Backend, BackendError, BatchReport

__all__ = ["Backend", "BackendError", "BatchReport"]
