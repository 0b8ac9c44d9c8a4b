"""``schemas/verify-http.schema.json``: ``idemctl verify --http URL --json``, each point's
verdict on the API at URL. It names no store: verify --http uses none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from idemctl.harness.httpcheck import HttpReport


def document(report: HttpReport) -> dict[str, Any]:
    return report.to_json()
