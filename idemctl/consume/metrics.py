"""The consumer's counters for ``--metrics-port`` (``idemctl.metrics`` serves them)."""

from __future__ import annotations

from idemctl.consume.options import Summary
from idemctl.metrics import family

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
    "gap_wait",
    "gaps",
)


def render(summary: Summary) -> str:
    lines = [
        *family(
            "idemctl_messages_total",
            "counter",
            "Messages by what became of them.",
            {f'outcome="{o}"': summary.counts[o] for o in OUTCOMES},
        ),
        *family(
            "idemctl_dead_letters_total",
            "counter",
            "Dead letters by reason.",
            {f'reason="{_label(r)}"': n for r, n in sorted(summary.dead_letters.items())},
        ),
        *family(
            "idemctl_paused_partitions",
            "gauge",
            "Partitions held now (busy keys, retries, outages).",
            {"": summary.paused},
        ),
        *family(
            "idemctl_assigned_partitions",
            "gauge",
            "Partitions assigned to this consumer now.",
            {"": summary.partitions},
        ),
        *(
            family(
                "idemctl_lag_messages",
                "gauge",
                "Messages behind the end of the assigned partitions.",
                {"": summary.lag},
            )
            if summary.lag is not None
            else ()
        ),
    ]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
