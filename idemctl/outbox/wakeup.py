"""The relay's wake-up: LISTEN on the outbox table's channel, which every statement that
writes outbox rows notifies at its commit (the trigger of schemas/postgres.sql's migration
5), so that an idle relay takes new rows at once instead of at its next poll. The poll stays:
a missed notification (a dropped connection, a table written before the trigger existed)
only costs the time to the next one."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from idemctl.errors import IdemctlError

if TYPE_CHECKING:
    import psycopg

    from idemctl.stores.postgres import PostgresStore

log = logging.getLogger("idemctl.outbox")

STOP_CHECK = 0.2
"""Seconds at most between two looks at the relay's stop flag while it waits."""
RECONNECT = 5.0
"""Seconds between two attempts to listen again after the connection failed."""


def channel(schema: str, table: str) -> str:
    """The channel the trigger on ``schema.table`` notifies (names as written, unquoted):
    at most 47 bytes, within PostgreSQL's 63 whatever the names."""
    return "idemctl_outbox_" + hashlib.md5(f"{schema}.{table}".encode()).hexdigest()  # noqa: S324 - a name, not a secret


class Wakeup:
    """Waits for the outbox table's notification on a connection of its own, outside the
    store's pool (it listens for as long as the relay runs)."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.channel = channel(store.schema, store.prefix + "outbox")
        self._conn: psycopg.Connection[Any] | None = None
        self._failed_at = -RECONNECT
        self._deaf = True
        """Rows may have been committed while this relay did not listen (before its first
        LISTEN, or while its connection was lost): their notifications went to nobody."""

    def _listen(self) -> psycopg.Connection[Any] | None:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if time.monotonic() - self._failed_at < RECONNECT:
            return None
        from idemctl.stores.postgres.wake import listening

        try:
            conn = listening(self.store, self.channel)
        except IdemctlError as exc:
            self._failed_at, self._deaf = time.monotonic(), True
            log.debug("cannot listen for new outbox rows, polling only: %s", exc)
            return None
        self._conn = conn
        return conn

    def _heard_nothing_yet(self) -> bool:
        """Whether this relay just started listening (again): then it looks at the table
        at once, for the rows committed while it did not listen."""
        deaf, self._deaf = self._deaf, False
        return deaf

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Wait up to ``seconds`` for new rows (or ``stop``). True when rows may have come:
        a notification, or the relay just started listening (again). Without a connection
        to listen on, this is ``stop.wait(seconds)``, in slices."""
        import psycopg

        deadline = time.monotonic() + seconds
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            conn = self._listen()
            if conn is None:
                stop.wait(min(left, STOP_CHECK))
                continue
            if self._heard_nothing_yet():
                return True
            try:
                if list(conn.notifies(timeout=min(left, STOP_CHECK), stop_after=1)):
                    list(conn.notifies(timeout=0))  # the others queued: one round takes all
                    return True
            except psycopg.Error as exc:  # the connection is gone: poll till it listens again
                log.debug("stopped listening for new outbox rows, polling: %s", exc)
                self.close()
                self._failed_at, self._deaf = time.monotonic(), True
        return False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
