"""The consumer's metrics for ``--metrics-port`` (``idemctl.metrics`` serves them):

- ``idemctl_messages_total{outcome}``: messages by what became of them (the summary's
  counts: executed, replayed, dead_lettered, stale, retried, busy, ...);
- ``idemctl_dead_letters_total{reason}`` and ``idemctl_stale_events_total``;
- ``idemctl_handler_duration_seconds``: each handler run;
- ``idemctl_store_call_duration_seconds{store,op}``: each claim (``claim_many``) and
  completion (``complete_many``) round trip;
- gauges: ``idemctl_in_flight_leases`` (keys held now), ``idemctl_assigned_partitions``,
  ``idemctl_paused_partitions``, ``idemctl_stalled_partitions`` (the watchdogs', see
  ``consume.stalls`` and ``consume.overdue``), ``idemctl_handlers_overdue`` (handlers
  running past --stall-timeout), ``idemctl_lag_messages`` (where the broker reports it);
- ``idemctl_stalls_total``: stalled partitions found and recovered;
- ``idemctl_build_info``.

``/readyz`` is ready while partitions are assigned, none is stalled, no handler is overdue,
and the store answers a read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from idemctl.metrics import SECONDS, Ready, Scraped, build_info, counter, gauge, store_answers

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from idemctl.consume.loop import Consumer

OUTCOMES = (
    "executed",
    "replayed",
    "dead_lettered",
    "skipped",
    "stale",
    "retried",
    "busy",
    "store_unavailable",
    "lease_lost",
    "dead_letter_refused",
    "revoked",
    "gap_wait",
    "gaps",
)


def register(consumer: Consumer, registry: CollectorRegistry) -> Ready:
    """The consumer's collectors in ``registry``, its handler and store calls timed from
    now on; returns its readiness."""
    from prometheus_client import Histogram

    build_info(registry, consumer.store)
    registry.register(Scraped(lambda: _families(consumer)))
    handler = Histogram(
        "idemctl_handler_duration_seconds",
        "Seconds each handler run took.",
        registry=registry,
        buckets=SECONDS,
    )
    calls = Histogram(
        "idemctl_store_call_duration_seconds",
        "Seconds each claim and completion round trip to the store took.",
        ["store", "op"],
        registry=registry,
        buckets=SECONDS,
    )
    scheme = consumer.store.url.partition(":")[0]
    by_op = {op: calls.labels(scheme, op) for op in ("claim", "complete")}
    consumer.timed(handler.observe, lambda op, seconds: by_op[op].observe(seconds))

    def ready() -> str | None:
        if not consumer.summary.partitions:
            return f"no partitions assigned ({consumer.summary.state})"
        stalled = consumer.stalled
        if stalled:
            return "; ".join(stalled)
        return store_answers(consumer.store)

    return ready


def _families(consumer: Consumer) -> Iterator[Any]:
    """The summary's counts and gauges, as they are at this scrape."""
    s = consumer.gauges()
    yield counter(
        "idemctl_messages",
        "Messages by what became of them.",
        {outcome: s.counts[outcome] for outcome in OUTCOMES},
        "outcome",
    )
    yield counter(
        "idemctl_dead_letters",
        "Dead letters by reason.",
        dict(sorted(s.dead_letters.items())),
        "reason",
    )
    yield counter(
        "idemctl_stalls",
        "Partitions found stalled (assigned, not paused, behind, no progress) and recovered.",
        s.stalls,
    )
    yield counter(
        "idemctl_stale_events",
        "Events the sequence guard found stale (not run: a later one was applied).",
        s.counts["stale"],
    )
    gauges = (
        ("idemctl_in_flight_leases", "Keys this consumer holds now.", consumer.in_flight),
        ("idemctl_assigned_partitions", "Partitions assigned now.", s.partitions),
        ("idemctl_paused_partitions", "Partitions paused now (busy, retries).", s.paused),
        (
            "idemctl_stalled_partitions",
            "Partitions stalled now (not paused), or whose handler runs past --stall-timeout.",
            s.stalled,
        ),
        (
            "idemctl_handlers_overdue",
            "Handlers running past --stall-timeout now.",
            s.overdue,
        ),
        ("idemctl_lag_messages", "Messages behind the partitions' ends.", s.lag),
    )
    for name, text, value in gauges:
        if value is not None:
            yield gauge(name, text, value)
