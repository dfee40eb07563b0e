"""Export a ``Trace`` as OpenTelemetry spans: evaluations, batches, wire requests.

``export(trace)`` writes, through a tracer of the given (or the global)
``TracerProvider``, one ``outlines.eval`` span per evaluation, a child
``outlines.batch`` span per backend call (backend, size, nodes, reported
tokens, cost where a price is known) and, under it, an ``outlines.request``
span per wire request (the model asked, its error). Spans keep the times the
trace measured. Like the trace, spans hold labels and numbers only: no
prompts, no outputs, no secrets. Needs the ``otel`` extra
(``opentelemetry-api`` and ``opentelemetry-sdk``), imported only here.
"""
from __future__ import annotations

from typing import Any

from outlines.common.errors import install_hint
from outlines.tracing import BatchRecord, Trace

__all__ = ["export"]


def export(trace: Trace, tracer_provider: Any = None, *, prices: Any = None) -> list[Any]:
    """Write ``trace`` as spans; returns the eval spans (ended).

    Parameters
    ----------
    trace
        A finished (or running) ``outlines.trace()`` record.
    tracer_provider
        An OpenTelemetry ``TracerProvider`` (default: the global one).
    prices
        A price table, model name -> ``(input_per_1M, output_per_1M)``, for
        the ``outlines.cost`` attribute of batches whose model has no ``price``.

    Returns
    -------
    list
        The ``outlines.eval`` spans, one per evaluation, already ended; their
        children are ``outlines.batch`` spans and theirs ``outlines.request``.

    Raises
    ------
    ImportError
        When opentelemetry is not installed (the ``otel`` extra: ``pip install -e '.[otel]'``).

    Examples
    --------
    >>> import outlines, outlines.otel  # doctest: +SKIP
    >>> with outlines.trace() as t:  # doctest: +SKIP
    ...     program(questions)
    >>> outlines.otel.export(t)  # doctest: +SKIP
    """
    try:
        from opentelemetry import trace as otel_trace
        from opentelemetry.trace import Status, StatusCode
    except ImportError:
        raise ImportError(f"outlines.otel needs OpenTelemetry: {install_hint('otel')}") from None
    tracer = otel_trace.get_tracer("outlines", tracer_provider=tracer_provider)

    def ns(t: float) -> int:
        return trace.origin_ns + int(t * 1e9)

    now = (trace.closed_at - trace.origin) if trace.closed_at is not None else trace.wall
    requests: dict[int, list[Any]] = {}
    for request in trace.requests:
        requests.setdefault(request.batch, []).append(request)
    evals = sorted(trace.evals, key=lambda e: e.start)
    owner: dict[int, list[BatchRecord]] = {i: [] for i in range(len(evals))}
    for batch in trace.batches:
        started = [i for i, e in enumerate(evals) if e.start <= batch.start]
        if started:
            owner[started[-1]].append(batch)
    spans = []
    for position, record in enumerate(evals):
        end = record.end if record.end is not None else now
        span = tracer.start_span("outlines.eval", start_time=ns(record.start), attributes={
            "outlines.nodes": len(record.labels),
            "outlines.critical_path_s": record.critical_path,
        })
        if record.error:
            span.set_status(Status(StatusCode.ERROR, record.error))
        context = otel_trace.set_span_in_context(span)
        for batch in owner[position]:
            _batch_span(tracer, context, batch, requests.get(batch.id, []), trace, prices, ns, end)
        span.end(end_time=ns(end))
        spans.append(span)
    return spans


def _batch_span(
    tracer: Any, context: Any, batch: BatchRecord, requests: list[Any], trace: Trace, prices: Any, ns: Any, end: float
) -> None:
    from opentelemetry import trace as otel_trace
    from opentelemetry.trace import Status, StatusCode

    attributes: dict[str, Any] = {
        "outlines.backend": batch.backend,
        "outlines.size": batch.size,
        "outlines.nodes": list(batch.nodes),
        "outlines.prompt_tokens": batch.prompt_tokens,
        "outlines.completion_tokens": batch.completion_tokens,
        "outlines.requests": max(batch.requests, len(requests)),
    }
    if batch.worker:
        attributes["outlines.worker"] = batch.worker
    model, own = trace.models.get(batch.backend, (batch.backend, None))
    price = own if own is not None else (prices or {}).get(model)
    if price is not None:
        from outlines.backends.usage import Price

        attributes["outlines.cost"] = Price.of(price).cost(batch.prompt_tokens, batch.completion_tokens)
    span = tracer.start_span("outlines.batch", context=context, start_time=ns(batch.start), attributes=attributes)
    if batch.error:
        span.set_status(Status(StatusCode.ERROR, batch.error))
    inner = otel_trace.set_span_in_context(span)
    for request in requests:
        child = tracer.start_span("outlines.request", context=inner, start_time=ns(request.start),
                                  attributes={"outlines.model": request.model or batch.backend})
        if request.error:
            child.set_status(Status(StatusCode.ERROR, request.error))
        child.end(end_time=ns(request.end))
    span.end(end_time=ns(batch.end if batch.end is not None else end))
