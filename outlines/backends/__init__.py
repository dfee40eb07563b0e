"""Backends: the wire (or the model) behind each ``Model``; see ``base``."""
from outlines.backends.base import Backend, BackendError, BatchReport, Draw, GenerationParams

__all__ = ["Backend", "BackendError", "BatchReport", "Draw", "GenerationParams"]
