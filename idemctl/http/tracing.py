"""The middleware's span, ``idemctl.http``: one per guarded request, under the server's
own span when the app is instrumented, with ``idemctl.key`` (hashed, as consume's),
``http.request.method``, ``url.path`` and ``idemctl.outcome``. Nothing without a tracer
provider (``idemctl.tracing``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from idemctl import tracing


def _nothing(outcome: str) -> None:
    pass


@contextmanager
def span(key: str, method: str, path: str) -> Iterator[Callable[[str], None]]:
    """A span for the request; the function it gives records the outcome."""
    tracer = tracing.tracer()
    if tracer is None:
        yield _nothing
        return
    attributes: dict[str, Any] = {
        **tracing.key_attribute(key, "hash"),
        "http.request.method": method,
        "url.path": path,
    }
    with tracer.start_as_current_span("idemctl.http", attributes=attributes) as current:
        yield lambda outcome: current.set_attribute("idemctl.outcome", outcome)
