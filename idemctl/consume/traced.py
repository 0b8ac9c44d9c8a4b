"""consume's spans (see ``idemctl.tracing``): one ``idemctl.process`` span a message, which
continues the trace its ``traceparent`` header carries, with ``idemctl.claim``,
``idemctl.run``, ``idemctl.complete`` and ``idemctl.dead_letter`` under it. Made only when
a tracer provider is set; the loop asks ``Tracing.start()`` once and skips all of this
otherwise."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from idemctl import tracing

if TYPE_CHECKING:
    from idemctl.runner import RunResult

CLAIMED = {"held": "acquired"}
"""A claim's outcome as the span tells it (a key held is one acquired)."""


class Tracing:
    def __init__(self, tracer: Any, store_kind: str, key_form: str) -> None:
        self.tracer, self.store_kind, self.key_form = tracer, store_kind, key_form

    @classmethod
    def start(cls, store_url: str, key_form: str) -> Tracing | None:
        """consume's tracing when a tracer provider is set, else None."""
        tracer = tracing.tracer()
        if tracer is None:
            return None
        return cls(tracer, store_url.partition(":")[0], key_form)

    def begin(
        self, msg: Any, key: str | None, claimed: RunResult | None, claim_ns: tuple[int, int] | None
    ) -> Any:
        """The message's process span, and its claim span where the claim was made."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation": "process",
            "messaging.destination.name": msg.topic(),
            "messaging.destination.partition.id": str(msg.partition()),
            "messaging.kafka.offset": msg.offset(),
            "idemctl.store": self.store_kind,
        }
        if key is not None:
            attributes.update(tracing.key_attribute(key, self.key_form))
        span = self.tracer.start_span(
            "idemctl.process",
            context=tracing.extract(msg.headers()),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )
        if claimed is not None and claim_ns is not None:
            claim = self.tracer.start_span(
                "idemctl.claim",
                context=set_span_in_context(span),
                start_time=claim_ns[0],
                attributes={
                    **self._of(claimed),
                    "idemctl.outcome": CLAIMED.get(claimed.outcome.value, claimed.outcome.value),
                },
            )
            claim.end(end_time=claim_ns[1])
        return span

    @contextmanager
    def run(self, span: Any) -> Iterator[Any]:
        """The handler's span, current while it runs; the caller sets its outcome."""
        from opentelemetry.trace import set_span_in_context

        with self.tracer.start_as_current_span(
            "idemctl.run", context=set_span_in_context(span), record_exception=False
        ) as run:
            yield run

    def ran(self, run: Any, result: RunResult) -> None:
        from opentelemetry.trace import Status, StatusCode

        run.set_attributes({**self._of(result), "idemctl.outcome": result.outcome.value})
        if result.error is not None:
            run.record_exception(result.error)
            run.set_status(Status(StatusCode.ERROR, f"{type(result.error).__name__}"))

    def completed(self, span: Any, since_ns: int, result: RunResult) -> None:
        """The completion, from when the handler returned to its answer."""
        from opentelemetry.trace import set_span_in_context

        complete = self.tracer.start_span(
            "idemctl.complete",
            context=set_span_in_context(span),
            start_time=since_ns,
            attributes={**self._of(result), "idemctl.outcome": result.outcome.value},
        )
        complete.end()

    @contextmanager
    def dead_letter(self, span: Any, reason: str, topic: str) -> Iterator[Any]:
        """The dead letter's span: its trace goes on in the dead letter's own header."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        with self.tracer.start_as_current_span(
            "idemctl.dead_letter",
            context=set_span_in_context(span),
            kind=SpanKind.PRODUCER,
            attributes={"idemctl.reason": reason, "messaging.destination.name": topic},
        ) as letter:
            yield letter

    def end(self, span: Any, outcome: str | None) -> None:
        if outcome is not None:
            span.set_attribute("idemctl.outcome", outcome)
        span.end()

    @staticmethod
    def _of(result: RunResult) -> dict[str, Any]:
        attributes: dict[str, Any] = {}
        if result.fencing_token is not None:
            attributes["idemctl.fencing_token"] = result.fencing_token
        if result.attempt is not None:
            attributes["idemctl.attempt"] = result.attempt
        return attributes
