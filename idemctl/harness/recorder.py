"""The handler ``idemctl verify`` runs in its ``idemctl consume`` processes: it records each
effect in a ledger that survives a SIGKILL, and raises on the poison messages verify planted.

Where the ledger is comes from IDEMCTL_VERIFY_LEDGER:

- ``file:PATH``: a line appended to PATH (one ``write`` per line, so concurrent processes'
  lines never mix) before the handler returns, that is before its key is completed: a kill
  between the two leaves the effect, and the message runs again once its lease runs out;
- ``table:SCHEMA.TABLE`` (PostgreSQL, ``consume --transactional``): a row inserted on
  ``ctx.connection``, in the transaction that completes the key: a kill rolls both back;
- ``fenced:PATH`` (``verify --fenced``): a row of the SQLite ledger at PATH (``effects``, a
  row a key) written through the fence (``idemctl.fence.sql.fenced_insert``): a takeover's
  write replaces what a killed attempt left, a late write under an older token is refused
  (StaleFence: the attempt ends as lost). Each write that landed is counted in ``writes``,
  in the same transaction; each refusal in ``refused``.

A ledger line or row: the key, the consumer's PID, when the message was produced (its
Kafka timestamp) and when it was handled, and the fencing token.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from typing import Any

from idemctl.consume import Event
from idemctl.errors import StaleFence
from idemctl.runner import Context

LEDGER = "IDEMCTL_VERIFY_LEDGER"
_local = threading.local()


class Poison(Exception):
    """A message verify planted to be dead-lettered: consume runs with this class in
    ``--permanent-errors``, so it goes to the dead-letter topic on its first run."""


def record(event: Event, ctx: Context) -> None:
    body: dict[str, Any] = event.json()
    if body.get("poison"):
        raise Poison(f"poison message {body['key']} (planted by idemctl verify)")
    if body.get("drop"):  # --sabotage lose: a handler that returns without doing its work
        return
    handled = time.time()
    sent = (event.timestamp or 0) / 1000  # the producer's CreateTime
    where = os.environ[LEDGER]
    kind, _, target = where.partition(":")
    if kind == "fenced":
        _fenced(target, body["key"], sent, handled, ctx)
        return
    if kind == "table":
        if ctx.connection is None:
            raise RuntimeError(f"{LEDGER}={where} needs consume --transactional")
        ctx.connection.execute(
            f"INSERT INTO {target} (key, pid, sent, handled, token) VALUES (%s, %s, %s, %s, %s)",  # noqa: S608 - verify's own table name
            (body["key"], os.getpid(), sent, handled, ctx.fencing_token),
        )
        return
    line = f"{body['key']} {os.getpid()} {sent} {handled} {ctx.fencing_token}\n"
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _ledger(path: str) -> sqlite3.Connection:
    """This lane's connection to the fenced ledger (transactions begun and ended here)."""
    db: sqlite3.Connection | None = getattr(_local, "db", None)
    if db is None:
        db = _local.db = sqlite3.connect(path, timeout=60, isolation_level=None)
    return db


def _fenced(path: str, key: str, sent: float, handled: float, ctx: Context) -> None:
    from idemctl.fence.sql import fenced_insert

    db, pid, token = _ledger(path), os.getpid(), ctx.fencing_token
    row = {"key": key, "pid": pid, "sent": sent, "handled": handled}
    db.execute("BEGIN IMMEDIATE")
    try:
        fenced_insert(db, "effects", row, ctx.fence, unique=("key",))
        db.execute("INSERT INTO writes (key, pid, token) VALUES (?, ?, ?)", (key, pid, token))
    except StaleFence:
        db.execute("ROLLBACK")
        db.execute("INSERT INTO refused (key, pid, token) VALUES (?, ?, ?)", (key, pid, token))
        raise  # this attempt lost its key: consume logs it and lets it go
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
