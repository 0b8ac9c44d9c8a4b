"""consume's spans (see ``idemctl.tracing``): one ``idemctl.process`` span a message, which
continues the trace its ``traceparent`` header carries, with ``idemctl.claim``,
``idemctl.run``, ``idemctl.complete`` and ``idemctl.dead_letter`` under it. Made only when
a tracer provider is set: the consumer asks ``Tracing.start()`` once for these hooks
(``consume.hooks``), and runs none of this otherwise."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from idemctl import tracing
from idemctl.consume.hooks import Hooks

if TYPE_CHECKING:
    from idemctl.consume.item import Item
    from idemctl.runner import RunResult

CLAIMED = {"held": "acquired"}
"""A claim's outcome as the span tells it (a key held is one acquired)."""


class Tracing(Hooks):
    """The spans, as consume's hooks: each message's process span is kept on it
    (``Item.span``) while it is open."""

    def __init__(self, tracer: Any, store_kind: str, key_form: str) -> None:
        self.tracer, self.store_kind, self.key_form = tracer, store_kind, key_form

    @classmethod
    def start(cls, store_url: str, key_form: str) -> Tracing | None:
        """consume's tracing when a tracer provider is set, else None."""
        tracer = tracing.tracer()
        if tracer is None:
            return None
        return cls(tracer, store_url.partition(":")[0], key_form)

    def claimed(self, items: list[Item], sent: tuple[int, int] | None) -> None:
        for item in items:
            item.claim_ns = sent

    def begin(self, item: Item, claimed: RunResult | None) -> None:
        """The message's process span, and its claim span where the claim was made."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        msg = item.msg
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation": "process",
            "messaging.destination.name": msg.topic(),
            "messaging.destination.partition.id": str(msg.partition()),
            "messaging.kafka.offset": msg.offset(),
            "idemctl.store": self.store_kind,
        }
        if item.key is not None:
            attributes.update(tracing.key_attribute(item.key, self.key_form))
        span = item.span = self.tracer.start_span(
            "idemctl.process",
            context=tracing.extract(msg.headers()),
            kind=SpanKind.CONSUMER,
            attributes=attributes,
        )
        claim_ns = item.claim_ns
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

    def run(self, item: Item, run: Callable[[], RunResult]) -> RunResult:
        """The handler's span, current while it runs."""
        from opentelemetry.trace import Status, StatusCode, set_span_in_context

        with self.tracer.start_as_current_span(
            "idemctl.run", context=set_span_in_context(item.span), record_exception=False
        ) as span:
            result = run()
            span.set_attributes({**self._of(result), "idemctl.outcome": result.outcome.value})
            if result.error is not None:
                span.record_exception(result.error)
                span.set_status(Status(StatusCode.ERROR, f"{type(result.error).__name__}"))
        item.ran_ns = time.time_ns()
        return result

    def failed(self, item: Item, exc: BaseException) -> None:
        if item.span is not None:
            item.span.record_exception(exc)

    def completed(self, item: Item, result: RunResult) -> None:
        """The completion, from when the handler returned to its answer."""
        from opentelemetry.trace import set_span_in_context

        if item.span is None:
            return
        complete = self.tracer.start_span(
            "idemctl.complete",
            context=set_span_in_context(item.span),
            start_time=item.ran_ns,
            attributes={**self._of(result), "idemctl.outcome": result.outcome.value},
        )
        complete.end()

    def lettering(self, item: Item, reason: str, topic: str) -> Any:
        """The dead letter's span: its trace goes on in the dead letter's own header."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        if item.span is None:
            return None
        return self.tracer.start_span(
            "idemctl.dead_letter",
            context=set_span_in_context(item.span),
            kind=SpanKind.PRODUCER,
            attributes={"idemctl.reason": reason, "messaging.destination.name": topic},
        )

    def lettered(self, item: Item, span: Any) -> None:
        if span is not None:
            span.end()

    def end(self, item: Item, outcome: str | None) -> None:
        span, item.span = item.span, None
        if span is None:
            return
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
