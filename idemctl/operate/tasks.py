"""The background tasks' keys (``idemctl.tasks``' ``task:<queue>:<task name>#<key>``),
counted by queue and task: what ``idemctl tasks`` and the console's tasks page show."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from idemctl.errors import OptionError
from idemctl.model import Record, Status
from idemctl.operate.look import records
from idemctl.operate.targets import Query, Target, now

PREFIX = "task:"


@dataclass
class TaskCounts:
    """One task's keys on one queue."""

    queue: str
    task: str
    in_progress: int = 0
    completed: int = 0
    failed: int = 0
    failed_for_good: int = 0
    """Of ``failed``: not retriable (a redelivery gets PreviouslyFailed)."""
    stale: int = 0
    """In progress with its lease expired: its worker may be gone (``unlock --stale``)."""
    oldest_in_progress: datetime | None = None

    @property
    def prefix(self) -> str:
        """What ``list --prefix`` takes to show these keys."""
        return f"{PREFIX}{self.queue}:{self.task}#"


def task_of(key: str) -> tuple[str, str] | None:
    """The queue and task name of a task's key; None for any other key."""
    if not key.startswith(PREFIX):
        return None
    queue, colon, rest = key[len(PREFIX) :].partition(":")
    task, hash_, _ = rest.partition("#")
    return (queue, task) if colon and hash_ and queue and task else None


def tasks(target: Target, queue: str | None = None, task: str | None = None) -> list[TaskCounts]:
    """Each task's counts, by queue and task name (sorted so), from every task key of the
    store, or of ``queue`` (and the task named ``task``); reads each of those records."""
    if task is not None and queue is None:
        raise OptionError("task", "a task is named within its queue: give the queue too")
    prefix = PREFIX + (f"{queue}:" if queue else "") + (f"{task}#" if task else "")
    found: dict[tuple[str, str], TaskCounts] = {}
    at = now()
    for page in records(target, Query(prefix=prefix), 0):
        for record in page.items:
            named = task_of(record.key)
            if named is None or not isinstance(record, Record):
                continue
            counts = found.get(named)
            if counts is None:
                counts = found[named] = TaskCounts(*named)
            _count(counts, record, at)
    return [found[named] for named in sorted(found)]


def _count(counts: TaskCounts, record: Record, at: datetime) -> None:
    if record.status is Status.IN_PROGRESS:
        counts.in_progress += 1
        counts.stale += record.stale(at)
        oldest = counts.oldest_in_progress
        counts.oldest_in_progress = (
            record.created_at if oldest is None else min(oldest, record.created_at)
        )
    elif record.status is Status.COMPLETED:
        counts.completed += 1
    else:
        counts.failed += 1
        counts.failed_for_good += not record.retriable
