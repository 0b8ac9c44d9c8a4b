"""A flow (``stores.postgres.flows``) run on a connection.

This module is the original of ``idemctl.stores.postgres.drive`` (scripts/unasync.py).

The driver throws a driver error back into the flow at the statement that raised it, so a
flow may catch it (transactional mode catches ``LockNotAvailable``); what the flow does not
catch leaves the driver as it came, for the connection's translation into idemctl's errors.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import pq

from idemctl.stores.postgres.flows import Flow, Reply, T


async def drive_async(conn: psycopg.AsyncConnection[Any], flow: Flow[T]) -> T:
    """Run ``flow``'s statements on ``conn``, one after the other; its answer."""
    try:
        step = next(flow)
        while True:
            try:
                cur = await conn.execute(step.sql, step.params)
                rows = await cur.fetchall() if _has_rows(cur) else []
                reply = Reply(rows, cur.rowcount)
            except psycopg.Error as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as stop:
        answer: T = stop.value
        return answer


def _has_rows(cur: psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement gave rows (RETURNING, SELECT): its result's status, not
    ``cur.description``, which builds every column's description each time it is read."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK
