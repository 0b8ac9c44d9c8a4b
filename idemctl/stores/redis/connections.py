"""The script calls' own connections to one server, outside redis-py's pool."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from redis.exceptions import ResponseError

from idemctl.stores.redis.client import Connection, ConnectionPool

_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis comes with idemctl[redis]
    _pack = None


class Connections:
    """The script calls' own connections to one server, outside redis-py's pool.

    redis-py's client takes a connection from its pool around every command and polls its
    socket for a stale reply before each use: on a small machine that is a third of a
    script call's client time. Here a caller pops a connection off a free list and puts it
    back; one whose command did not finish (a network error, a timeout, an interrupt) is
    disconnected instead of polled, so it can never hold a stale reply, and reconnects on
    its next use. The pool's settings (address, TLS, timeouts, retry) make every connection.
    """

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._pid = os.getpid()
        self._free: list[Connection] = []
        self._all: list[Connection] = []

    def execute(self, args: tuple[Any, ...]) -> Any:
        if self._pid != os.getpid():  # a forked child must not share its parent's sockets
            self._pid, self._free, self._all = os.getpid(), [], []
        try:
            conn = self._free.pop()
        except IndexError:
            conn = self._pool.make_connection()
            self._all.append(conn)
        try:
            return conn.retry.call_with_retry(
                lambda: _send(conn, args), lambda _error: conn.disconnect()
            )
        except ResponseError:
            raise  # a whole error reply was read: the connection is fine
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._free.append(conn)

    def close(self) -> None:
        for conn in self._all:
            conn.disconnect()
        self._free.clear()
        self._all.clear()


def _send(conn: Connection, args: tuple[Any, ...]) -> Any:
    # hiredis packs str, bytes and numbers as they are; redis-py's packer first copies
    # every argument through a generator.
    conn.send_packed_command([_pack(args)] if _pack is not None else conn.pack_command(*args))
    return conn.read_response()
