"""``idemctl tasks``: the background tasks' keys, by queue and task name."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from idemctl.cli import render
from idemctl.cli.common import cli_open, command, emit_json, settings, target_opener
from idemctl.durations import format_duration
from idemctl.operate.tasks import TaskCounts


@command()
def tasks(
    ctx: typer.Context,
    queue: Annotated[
        str | None,
        typer.Option(
            "--queue", metavar="QUEUE", help="Only this queue's: celery, dramatiq, rq, taskiq, arq"
        ),
    ] = None,
    task: Annotated[
        str | None,
        typer.Option("--task", metavar="NAME", help="Only the task of this name (with --queue)"),
    ] = None,
) -> None:
    """Count the background tasks' keys by queue and task name: in progress, stale, done, failed.

    The keys `idemctl.tasks` writes for Celery, dramatiq, rq, taskiq and arq
    (`task:<queue>:<task name>#<key>`). Stale: in progress, the lease expired and nobody
    freed it, so its worker may be gone (`unlock --stale` frees them). Failed for good: a
    redelivery is refused. Each row's PREFIX is what `list --prefix` takes to list that
    task's keys. Reads every task key of the store: on a large store, name the queue.
    """
    from idemctl import operate
    from idemctl.operate.documents import task as task_document

    current = settings(ctx)
    with cli_open(ctx, target_opener()) as target:
        found = operate.tasks(target, queue, task)
    at = render.now()
    if current.json:
        for counts in found:
            emit_json(task_document.document(counts, at))
    elif not found:
        current.err.print("no task keys match")
    else:
        current.out.print(_table(found, at))


def _table(found: list[TaskCounts], at: datetime) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name, justify in (
        ("QUEUE", "left"), ("TASK", "left"), ("IN PROGRESS", "right"), ("STALE", "right"),
        ("COMPLETED", "right"), ("FAILED", "right"), ("FOR GOOD", "right"),
        ("OLDEST", "right"), ("PREFIX", "left"),
    ):  # fmt: skip
        table.add_column(name, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for c in found:
        oldest = c.oldest_in_progress
        age = "-" if oldest is None else format_duration((at - oldest).total_seconds())
        table.add_row(
            Text(c.queue), Text(c.task), str(c.in_progress), str(c.stale),
            str(c.completed), str(c.failed), str(c.failed_for_good), age, Text(c.prefix),
        )  # fmt: skip
    return table
