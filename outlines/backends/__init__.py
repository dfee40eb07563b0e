"""Backends: the wire (or the model) behind each ``Model``; see ``base``."""
from outlines.backends.base import Backend, BackendError, GenerationParams, Request, report_requests, report_usage

__all__ = ["Backend", "BackendError", "GenerationParams", "Request", "report_requests", "report_usage"]
