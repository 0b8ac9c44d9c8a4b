"""What ``verify --http`` sends and gets: one request on a connection of its own
(``http.client``), or several at once (threads), and the answer as it came."""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from urllib.parse import urlsplit

from idemctl.harness.httpcheck.target import HttpTarget, Unreachable
from idemctl.urls import redact_url

REPLAYED = "Idempotent-Replayed"


@dataclass(frozen=True)
class Answer:
    """What one request got: the status (None: no answer, ``error`` says why), headers,
    body."""

    status: int | None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    error: str | None = None

    def header(self, name: str) -> str | None:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return None

    @property
    def replayed(self) -> bool:
        """Marked as a replay (``Idempotent-Replayed: true``)."""
        return (self.header(REPLAYED) or "").strip().lower() in ("true", "?1", "1", "yes")

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def problem(self) -> bool:
        return (self.header("content-type") or "").startswith("application/problem+json")

    def shown(self) -> str:
        return f"no answer ({self.error})" if self.status is None else str(self.status)


def difference(first: Answer, then: Answer) -> str | None:
    """How ``then`` differs from ``first`` (status, Content-Type, body), or None."""
    if first.status != then.status:
        return f"{then.shown()}, not {first.shown()}"
    if first.header("content-type") != then.header("content-type"):
        return f"{then.status} with another Content-Type"
    if first.body != then.body:
        return f"{then.status} with another body"
    return None


def _describe(exc: BaseException, timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"nothing within {timeout:g}s"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host: {exc.strerror or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without an answer"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class Requester:
    """Requests to the target's host: the caller's headers, the key if any, the body."""

    def __init__(self, target: HttpTarget) -> None:
        self.target = target
        parts = urlsplit(target.url)
        self.https = parts.scheme == "https"
        self.host, self.port = parts.hostname or "", parts.port
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def connection(self) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=self.target.timeout)

    def reach(self) -> None:
        conn = self.connection()
        try:
            conn.connect()
        except (OSError, http.client.HTTPException) as exc:
            shown = redact_url(self.target.url)
            raise Unreachable(
                f"{shown}: cannot connect: {_describe(exc, self.target.timeout)}"
            ) from None
        finally:
            conn.close()

    def send(
        self,
        key: str | None,
        body: bytes,
        *,
        headers: Sequence[tuple[str, str]] | None = None,
        path: str | None = None,
        conn: http.client.HTTPConnection | None = None,
    ) -> Answer:
        given = self.target.headers if headers is None else headers
        sent = [(n, v) for n, v in given if n.lower() != "content-length"]  # the body's own
        if key is not None:
            sent.append((self.target.key_header, key))
        conn = conn or self.connection()
        names = {name.lower() for name, _ in sent}
        method = self.target.method
        try:
            conn.putrequest(
                method,
                path or self.path,
                skip_host="host" in names,
                skip_accept_encoding="accept-encoding" in names,
            )
            for name, value in sent:
                conn.putheader(name, value)
            if body or method.upper() in ("POST", "PUT", "PATCH"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            response = conn.getresponse()
            return Answer(response.status, tuple(response.getheaders()), response.read())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return Answer(None, error=_describe(exc, self.target.timeout))
        finally:
            conn.close()

    def at_once(self, count: int, key: str, body: bytes) -> list[Answer]:
        """``count`` requests sent together: each connects, then all send at once."""
        answers: list[Answer | None] = [None] * count
        barrier = threading.Barrier(count)
        timeout = self.target.timeout

        def one(i: int) -> None:
            conn = self.connection()
            try:
                conn.connect()
            except OSError as exc:
                answers[i] = Answer(None, error=_describe(exc, timeout))
                conn.close()
            with suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=timeout)
            if answers[i] is None:
                answers[i] = self.send(key, body, conn=conn)

        threads = [
            threading.Thread(target=one, args=(i,), name=f"idemctl-verify-http-{i}", daemon=True)
            for i in range(count)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=3 * timeout + 5)
        return [answer or Answer(None, error="no answer") for answer in answers]
