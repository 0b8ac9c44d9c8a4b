"""``idemctl demo --json`` (no schema yet)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.harness.demo import DemoReport


def document(report: DemoReport) -> dict[str, Any]:
    return {
        "topic": report.topic,
        "payments": report.payments,
        "messages": report.messages,
        "kills": report.kills,
        "stopped": report.stopped,
        "charged_once": report.once,
        "charged_twice": report.twice,
        "never_charged": report.never,
        "fenced": report.fenced,
        "charged_again_by_a_takeover": report.retaken,
        "late_charges_refused": report.refused,
        "ok": report.ok,
    }
