"""``schemas/audit.schema.json``: ``idemctl audit --json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemctl.audit.model import CLASSES

if TYPE_CHECKING:
    from idemctl.audit import AuditReport


def document(report: AuditReport, where: dict[str, str], failing: list[str]) -> dict[str, Any]:
    totals = report.totals()
    doubts = report.doubts()
    return {
        "topic": report.topic,
        "group": report.group,
        **where,
        "ok": not failing and not doubts,
        "failing": failing,
        "doubts": [{"cause": d.cause, "hint": d.hint} for d in doubts],
        "audited": report.audited,
        **{c: totals[c] for c in (*CLASSES, "pending")},
        "unkeyed": report.unkeyed,
        "found": report.found,
        "partitions": [
            {
                "partition": p.partition,
                "committed": p.committed,
                "start": p.start,
                "end": p.end,
                "audited": p.audited,
                **{c: p.counts[c] for c in CLASSES},
                "pending": p.pending,
            }
            for p in report.partitions
        ],
        "lost_keys": [
            {"partition": m.partition, "offset": m.offset, "key": m.key, "why": m.why}
            for m in report.lost
        ],
        "dlq_checked": report.dlq_checked,
        "seconds": round(report.seconds, 3),
    }
