# Written by scripts/unasync.py from idemctl/stores/postgres/drive_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""A flow (``stores.postgres.flows``) run on a connection.

Written by scripts/unasync.py from ``idemctl.stores.postgres.drive_async``.

The driver throws a driver error back into the flow at the statement that raised it, so a
flow may catch it (transactional mode catches ``LockNotAvailable``); what the flow does not
catch leaves the driver as it came, for the connection's translation into idemctl's errors.
"""

from __future__ import annotations

import weakref
from typing import Any

import psycopg
from psycopg import pq

from idemctl.stores.postgres.flows import Flow, Reply, T

REPLAN_EVERY = 500
"""Executions of prepared statements (the single-key path) on one connection before the
connection drops their plans (DISCARD PLANS; the statements stay prepared), so that
PostgreSQL plans them again for the table as it is now. A plan it keeps is made for the
table's size then, and made again only once the table is analyzed: one made while the table
was tiny (where a sequential scan is cheapest) gets slower with every key until autovacuum
analyzes the table again (its next visit, a minute by default; never where autovacuum is
off). Made again this often, such a plan lasts at most 500 calls, whatever the statistics
say (a plan is made for the table's pages now), at the cost of a round trip and the
planning of the next executions, per 500."""
_executed: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
"""Prepared executions on each connection since it last dropped its plans."""


def drive(conn: psycopg.Connection[Any], flow: Flow[T]) -> T:
    """Run ``flow``'s statements on ``conn``, one after the other; its answer."""
    try:
        step = next(flow)
        while True:
            try:
                if step.prepare:
                    _replan_due(conn)
                cur = conn.execute(step.sql, step.params, prepare=step.prepare)
                rows = cur.fetchall() if _has_rows(cur) else []
                reply = Reply(rows, cur.rowcount)
            except psycopg.Error as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(reply)
    except StopIteration as stop:
        answer: T = stop.value
        return answer


def _replan_due(conn: psycopg.Connection[Any]) -> None:
    """Count a prepared execution on ``conn``; past REPLAN_EVERY, drop the plans its
    prepared statements keep first."""
    n = _executed.get(conn, 0) + 1
    if n > REPLAN_EVERY:
        conn.execute("DISCARD PLANS")
        n = 1
    _executed[conn] = n


def _has_rows(cur: psycopg.Cursor[Any]) -> bool:
    """Whether the statement gave rows (RETURNING, SELECT): its result's status, not
    ``cur.description``, which builds every column's description each time it is read."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK
