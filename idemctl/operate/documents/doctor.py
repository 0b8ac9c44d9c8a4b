"""``schemas/doctor.schema.json``: ``idemctl doctor --json``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from idemctl.model import Finding

if TYPE_CHECKING:
    from idemctl.operate.doctor import DoctorReport


def finding(found: Finding) -> dict[str, Any]:
    return {
        "name": found.name,
        "ok": found.ok,
        "level": found.level,
        "detail": found.detail,
        "fix": found.fix,
    }


def document(report: DoctorReport) -> dict[str, Any]:
    return {
        "store": report.url,
        "store_source": report.source,
        "ok": report.ok,
        "findings": [finding(f) for f in report.findings],
    }
