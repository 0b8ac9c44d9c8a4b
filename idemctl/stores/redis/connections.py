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

    def _take(self) -> Connection:
        if self._pid != os.getpid():  # a forked child must not share its parent's sockets
            self._pid, self._free, self._all = os.getpid(), [], []
        try:
            return self._free.pop()
        except IndexError:
            conn: Connection = self._pool.make_connection()
            self._all.append(conn)
            return conn

    def send(self, commands: list[tuple[Any, ...]]) -> Connection:
        """Send ``commands`` in one write, on a connection taken for their replies: hand it
        to ``receive``, or to ``discard`` when they are not wanted. No retry: the caller
        has another way."""
        conn = self._take()
        try:
            conn.send_packed_command([b"".join(b"".join(_packed(conn, c)) for c in commands)])
        except BaseException:
            self.discard(conn)
            raise
        return conn

    def receive(self, conn: Connection, n: int) -> list[Any]:
        """The ``n`` replies of what ``send`` sent; an error reply is returned, not raised."""
        replies: list[Any] = []
        try:
            for _ in range(n):
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # a whole error reply was read
                    replies.append(exc)
        except BaseException:
            conn.disconnect()
            raise
        finally:
            self._free.append(conn)
        return replies

    def discard(self, conn: Connection) -> None:
        """A connection whose replies will not be read: closed (it reconnects on next use)."""
        conn.disconnect()
        self._free.append(conn)

    def execute(self, args: tuple[Any, ...]) -> Any:
        conn = self._take()
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


def _packed(conn: Connection, args: tuple[Any, ...]) -> list[bytes]:
    # hiredis packs str, bytes and numbers as they are; redis-py's packer first copies
    # every argument through a generator.
    return [_pack(args)] if _pack is not None else conn.pack_command(*args)


def _send(conn: Connection, args: tuple[Any, ...]) -> Any:
    conn.send_packed_command(_packed(conn, args))
    return conn.read_response()
