"""The consumer's counters for ``--metrics-port`` (``idemctl.metrics`` serves them)."""

from __future__ import annotations

from idemctl.consume.loop import Summary
from idemctl.metrics import family

OUTCOMES = ("executed", "replayed", "dead_lettered", "retried", "busy", "store_unavailable",
            "lease_lost")  # fmt: skip


def render(summary: Summary) -> str:
    lines = [
        *family(
            "idemctl_messages_total", "counter", "Messages by what became of them.",
            {f'outcome="{o}"': summary.counts[o] for o in OUTCOMES},
        ),
        *family(
            "idemctl_paused_partitions", "gauge",
            "Partitions held now (busy keys, retries, outages).", {"": summary.paused},
        ),
        *family(
            "idemctl_assigned_partitions", "gauge",
            "Partitions assigned to this consumer now.", {"": summary.partitions},
        ),
        *(family(
            "idemctl_lag_messages", "gauge",
            "Messages behind the end of the assigned partitions.", {"": summary.lag},
        ) if summary.lag is not None else ()),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"
