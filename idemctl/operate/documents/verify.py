"""``schemas/verify.schema.json``: ``idemctl verify --json``; and what its live status
shows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.harness.verify import Progress, VerifyReport


def fields(progress: Progress) -> dict[str, Any]:
    """What ``verify``'s live status shows."""
    return {
        "phase": progress.phase,
        "produced": progress.produced,
        "handled": progress.handled,
        "kills": progress.kills,
        "rebalances": progress.rebalances or None,
        "store_faults": progress.faults or None,
    }


def document(where: dict[str, str], report: VerifyReport) -> dict[str, Any]:
    return {**where, **report.to_json()}
