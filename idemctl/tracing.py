"""OpenTelemetry spans, with the ``otel`` extra (``pip install 'idemctl[otel]'``, which is
opentelemetry-api) and a tracer provider the application set up; without them nothing,
at the cost of one check a message.

What consume traces, for each message: ``idemctl.process`` (a CONSUMER span continuing the
trace of the message's W3C ``traceparent`` header), and under it ``idemctl.claim``,
``idemctl.run`` (the handler: its own spans nest under it), ``idemctl.complete`` and
``idemctl.dead_letter``. A dead letter carries the trace on in its own ``traceparent``, and
so does an outbox event written by a handler (``ctx.outbox.add``), which the relay
continues in ``idemctl.publish``.

Attributes: ``idemctl.key`` (by default its SHA-256, the first 16 hex digits: a key may hold
personal data; ``raw`` gives it as it is, ``none`` leaves it out), ``idemctl.outcome``,
``idemctl.fencing_token``, ``idemctl.attempt``, ``idemctl.store``, and the messaging ones
(``messaging.system``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.kafka.offset``).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

KEY_FORMS = ("hash", "raw", "none")
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


@functools.cache
def installed() -> bool:
    """Whether opentelemetry-api can be imported (asked once)."""
    try:
        import opentelemetry.trace  # noqa: F401
    except ImportError:
        return False
    return True


def tracer() -> Any | None:
    """idemctl's tracer when opentelemetry-api is installed and a tracer provider is set
    (the SDK, or a vendor's); None otherwise, so callers skip all tracing work."""
    if not installed():
        return None
    from opentelemetry import trace

    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return None  # nothing would record the spans
    from idemctl import __version__

    return trace.get_tracer("idemctl", __version__)


def key_attribute(key: str, form: str) -> dict[str, str]:
    """``idemctl.key`` as ``form`` says (see KEY_FORMS)."""
    if form == "none":
        return {}
    if form == "raw":
        return {"idemctl.key": key}
    return {"idemctl.key": hashlib.sha256(key.encode()).hexdigest()[:16]}


def extract(headers: Iterable[tuple[str, bytes | str | None]] | None) -> Any:
    """The trace context a message's ``traceparent`` (and ``tracestate``) header carries,
    or None."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {}
    for name, value in headers or ():
        if name in (TRACEPARENT, TRACESTATE) and value is not None:
            carrier[name] = value.decode("latin-1") if isinstance(value, bytes) else value
    if TRACEPARENT not in carrier:
        return None
    return TraceContextTextMapPropagator().extract(carrier)


def inject(span: Any, headers: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``headers`` with ``span``'s trace context as ``traceparent`` (and ``tracestate``),
    replacing any the headers had."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, trace.set_span_in_context(span))
    kept = [(k, v) for k, v in headers if k not in (TRACEPARENT, TRACESTATE)]
    return kept + [(k, v.encode()) for k, v in carrier.items()]


def current_traceparent() -> dict[str, str]:
    """The current span's ``traceparent`` (and ``tracestate``), for an outbox event's
    headers; empty without a recording span."""
    if not installed():
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier
