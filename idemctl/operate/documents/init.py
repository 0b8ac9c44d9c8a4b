"""``schemas/init.schema.json``: ``idemctl init --json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from idemctl.model import Provisioning


def document(where: Mapping[str, str], plan: Provisioning, dry_run: bool) -> dict[str, Any]:
    return {
        **where,
        "dry_run": dry_run,
        "changed": plan.changed,
        "statements": plan.statements,
        "notes": plan.notes,
    }
