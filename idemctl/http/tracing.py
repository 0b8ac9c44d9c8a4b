"""What the middlewares record of a guarded request: its span, ``idemctl.http`` (under the
server's own span when the app is instrumented, with ``idemctl.key`` hashed as consume's,
``http.request.method``, ``url.path`` and ``idemctl.outcome``; nothing without a tracer
provider, see ``idemctl.tracing``), and its outcome and added time in
``idemctl.http.stats.STATS``."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from idemctl import tracing
from idemctl.http.policy import Guarded
from idemctl.http.stats import DURATIONS, STATS


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


class Observed:
    """One guarded request under way: ``app_seconds`` is the app's own time, left out of
    the time the middleware added, and, for a stored response, the route's duration."""

    def __init__(self, guarded: Guarded, started: float, traced: Callable[[str], None]) -> None:
        self.guarded, self.started, self.app_seconds, self._traced = guarded, started, 0.0, traced

    def ended(self, outcome: str) -> None:
        self._traced(outcome)
        STATS.count(outcome, time.perf_counter() - self.started - self.app_seconds)
        if outcome == "new":
            request = self.guarded.request
            DURATIONS.add(request.method, request.path, self.app_seconds)

    def typical(self) -> float | None:
        """The route's usual seconds, for a 409's ``Retry-After``."""
        return DURATIONS.typical(self.guarded.request.method, self.guarded.request.path)


@contextmanager
def observed(guarded: Guarded, started: float) -> Iterator[Observed]:
    """The request's span and figures; an exception out of it ends it as ``error``."""
    request = guarded.request
    with span(guarded.stored_key, request.method, request.path) as traced:
        seen = Observed(guarded, started, traced)
        try:
            yield seen
        except Exception:
            seen.ended("error")
            raise
