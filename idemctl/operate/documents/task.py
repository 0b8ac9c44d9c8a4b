"""``schemas/task.schema.json``: a line of ``idemctl tasks --json``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from idemctl.model import iso_time
from idemctl.operate.tasks import TaskCounts


def document(counts: TaskCounts, at: datetime) -> dict[str, Any]:
    oldest = counts.oldest_in_progress
    return {
        "queue": counts.queue,
        "task": counts.task,
        "prefix": counts.prefix,
        "in_progress": counts.in_progress,
        "completed": counts.completed,
        "failed": counts.failed,
        "failed_for_good": counts.failed_for_good,
        "stale": counts.stale,
        "oldest_in_progress_at": iso_time(oldest),
        "oldest_in_progress_age_seconds": (
            None if oldest is None else max(0.0, round((at - oldest).total_seconds(), 3))
        ),
    }
