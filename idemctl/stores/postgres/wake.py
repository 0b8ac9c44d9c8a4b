"""Wake-ups for waiters (``wait=``) on PostgreSQL: complete, fail and release notify the
keys table's channel with the key (``sql.keys_channel``) as they commit; one connection per
store and process LISTENs, outside the pool, and a thread of its own hands each key to the
watch. A connection that fails is made again; meanwhile the waiters poll."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from idemctl.errors import IdemctlError
from idemctl.stores.postgres.sql import keys_channel

if TYPE_CHECKING:
    from collections.abc import Callable

    import psycopg

    from idemctl.stores.postgres.core import PostgresCore
    from idemctl.stores.waiting import Watch

log = logging.getLogger("idemctl.stores")

RECONNECT = 2.0
"""Seconds between two attempts to listen again after the connection failed."""
READ = 0.5
"""Seconds at most between two looks at the stop flag."""


def listening(store: PostgresCore, channel: str) -> psycopg.Connection[Any]:
    """A connection of its own (outside the store's pool) that LISTENs on ``channel``;
    driver errors become idemctl's (StoreUnavailable, ...). The outbox relay's wake-up
    listens with it too."""
    import psycopg

    settings = store.pool_settings
    with store.translated():
        conn = psycopg.connect(settings.conninfo, **settings.connect_kwargs())
        try:
            conn.execute(f'LISTEN "{channel}"')
        except BaseException:
            conn.close()
            raise
    return conn


class Listener:
    def __init__(self, store: PostgresCore, watch: Watch) -> None:
        self.store, self.watch = store, watch
        self.channel = keys_channel(store.names)
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="idemctl-wait-listen", daemon=True)

    def start(self) -> bool:
        """LISTEN (done when this returns True: later commits reach the watch), then read
        in the thread; False when the server cannot be reached (the waiters poll)."""
        try:
            self._conn = self._connect()
        except IdemctlError as exc:
            log.debug("cannot listen for keys let go, waiters poll: %s", exc)
            return False
        self._thread.start()
        return True

    def _connect(self) -> psycopg.Connection[Any]:
        return listening(self.store, self.channel)

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            conn = self._conn
            if conn is None:
                try:
                    conn = self._conn = self._connect()
                except IdemctlError as exc:
                    log.debug("cannot listen for keys let go, waiters poll: %s", exc)
                    self._stop.wait(RECONNECT)
                    continue
            try:
                for notification in conn.notifies(timeout=READ):  # each as it comes
                    self.watch.notify([notification.payload])
            except psycopg.Error as exc:
                log.debug("stopped listening for keys let go, waiters poll: %s", exc)
                self._close()

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(READ + 2)
        self._close()


def listen(store: PostgresCore, watch: Watch) -> Callable[[], None] | None:
    """Start feeding ``watch`` from the statements' notifications; returns what stops it."""
    listener = Listener(store, watch)
    return listener.stop if listener.start() else None
