"""The ``Idempotency-Key`` policy, pure: which requests it guards, the key and its scope,
the fingerprint, the problems it answers, what is stored and how it is replayed.

No I/O and no framework: ``idemctl.http.asgi`` and ``idemctl.http.wsgi`` read a request
into a ``Request``, ask this module what to do, and drive the store with
``idemctl.http.attempt`` (the way ``consume.policy`` is shared by consume and FastStream).

Semantics: draft-ietf-httpapi-idempotency-key-header-07 and Stripe's documented behaviour;
the table is in docs/guides/http.md.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from http import HTTPStatus
from typing import Any
from urllib.parse import quote

from idemctl.errors import ConfigError
from idemctl.model import (
    JSON,
    MAX_KEY_BYTES,
    Busy,
    ClaimOutcome,
    Completed,
    Failed,
    Mismatch,
    canonical_json,
)
from idemctl.stores.limits import checked
from idemctl.stores.waiting import MAX_WAIT

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
"""The header a replayed response carries (Stripe's name), with the value ``true``."""
DEFAULT_RETENTION = 86400.0
"""24 hours: how long Stripe keeps a key, and what a client may count on for its retries."""
DEFAULT_MAX_BODY = 1 << 20
"""Responses up to 1 MiB are stored; a larger one is sent as it streams and not stored."""
DEFAULT_REPLAY_HEADERS = (
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "content-location",
    "content-type",
    "etag",
    "last-modified",
    "link",
    "location",
)
"""Response headers stored and replayed. Never ``Set-Cookie`` unless it is listed: a
session cookie replayed to whoever sends the key next would hand that session over."""
PROBLEM_BASE = "https://idemctl.dev/problems/"
FORMAT = 1
"""The version of the stored response's JSON (``"http"`` in the record's result)."""

_TOKEN = re.compile(r"[A-Za-z*][A-Za-z0-9!#$%&'*+\-.^_`|~:/]*")
"""A bare Structured Field token (RFC 8941 3.3.4), accepted leniently for a key."""
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
"""A Structured Field string (RFC 8941 3.3.3): printable ASCII in quotes, ``\\"`` and
``\\\\`` escaped."""


@dataclass(frozen=True)
class Request:
    """What the policy reads of a request: the method, the path as sent (percent-encoded),
    and the headers, names in lower case (repeated ones joined with ``, ``)."""

    method: str
    path: str
    headers: Mapping[str, str]


def authorization_caller(request: Request) -> str | None:
    """The default caller: the SHA-256 of the ``Authorization`` header (its first 16 hex
    digits), or None for a request without one. Two callers' keys never meet."""
    auth = request.headers.get("authorization")
    if not auth:
        return None
    return hashlib.sha256(auth.encode("latin-1")).hexdigest()[:16]


@dataclass(frozen=True)
class Options:
    """How the middleware guards requests. Every field has the default the guide gives."""

    methods: Sequence[str] = ("POST", "PATCH")
    """Methods guarded; the others pass through untouched."""
    paths: Sequence[str] = ("*",)
    """Path patterns guarded (``fnmatch``, case-sensitive: ``/charges*``); others pass."""
    required: bool = True
    """A guarded request without the header: 400 (True), or passed through (False)."""
    header: str = HEADER
    max_key_length: int = 255
    caller: Callable[[Request], str | None] = authorization_caller
    """Whose key it is: part of the stored key, so equal keys of two callers never meet."""
    fingerprint_headers: Sequence[str] = ()
    """Request headers hashed with the body: same key, other value, 422."""
    replay_headers: Sequence[str] = DEFAULT_REPLAY_HEADERS
    store_server_errors: bool = False
    """Store 5xx responses too (Stripe does); by default the key is released instead, so
    the client's retry runs again."""
    max_body: int = DEFAULT_MAX_BODY
    retention: float = DEFAULT_RETENTION
    lease: float | None = None
    """Seconds a request holds its key; a heartbeat extends it while the app runs. None:
    the store's default (30 s)."""
    wait: float | None = None
    """Seconds a request waits for the same key's request in flight (its response, or the
    key once that one lets go) instead of an immediate 409."""
    transactional: bool = False
    """PostgreSQL: the claim, the app's SQL on the attempt's ``connection`` and the stored
    response commit in one transaction."""
    problem_base: str = PROBLEM_BASE
    """Each problem's ``type`` is this followed by its name (``missing-key``, ...)."""
    _methods: frozenset[str] = field(init=False, repr=False)
    _replay: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.max_key_length <= 255:
            raise ConfigError(f"max_key_length must be 1 to 255, not {self.max_key_length!r}")
        if self.max_body < 0:
            raise ConfigError(f"max_body must be 0 or more bytes, not {self.max_body!r}")
        if self.wait is not None and not 0 < self.wait <= MAX_WAIT:
            raise ConfigError(f"wait must be above 0 and at most {MAX_WAIT:g} s, not {self.wait!r}")
        if not self.retention > 0:
            raise ConfigError(f"retention must be above 0 seconds, not {self.retention!r}")
        if self.lease is not None:
            checked("lease", self.lease)
        if not callable(self.caller):
            raise ConfigError("caller must be a function of the request")
        object.__setattr__(self, "_methods", frozenset(m.upper() for m in self.methods))
        object.__setattr__(self, "_replay", frozenset(h.lower() for h in self.replay_headers))

    def guards(self, method: str, path: str) -> bool:
        """Whether a request to ``path`` with ``method`` is guarded."""
        return method.upper() in self._methods and any(fnmatchcase(path, p) for p in self.paths)

    def replayed(self, name: str) -> bool:
        return name.lower() in self._replay


@dataclass(frozen=True)
class Problem:
    """An RFC 9457 problem the middleware answers instead of running the app."""

    name: str
    """The ``type``'s last segment, and the metric's outcome."""
    status: int
    title: str
    detail: str
    retry_after: int | None = None

    @property
    def outcome(self) -> str:
        """The metric's name for it: ``missing_key``, ``invalid_key``."""
        return self.name.replace("-", "_")

    def response(self, options: Options) -> Response:
        body = canonical_json(
            {
                "type": options.problem_base + self.name,
                "title": self.title,
                "status": self.status,
                "detail": self.detail,
            }
        )
        headers = [
            ("content-type", "application/problem+json"),
            ("content-length", str(len(body))),
        ]
        if self.retry_after is not None:
            headers.append(("retry-after", str(self.retry_after)))
        return Response(self.status, headers, body)


@dataclass(frozen=True)
class Response:
    """A response: the status, the headers as sent (names as the app wrote them, values
    as latin-1 text, the way WSGI has them), the body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def missing(options: Options) -> Problem:
    return Problem(
        "missing-key",
        400,
        f"{options.header} is missing",
        f"This operation needs an {options.header} header: a unique value per operation, "
        "the same on each retry of it.",
    )


def key_of(options: Options, raw: str | None) -> str | Problem | None:
    """The client's key from the header's value: a Structured Field string (``"abc"``)
    or, leniently, a bare token; a Problem when it is malformed, empty or too long; None
    when there is none and none is required."""
    if raw is None:
        return missing(options) if options.required else None
    raw = raw.strip(" \t")
    quoted = _SF_STRING.fullmatch(raw)
    if quoted is not None:
        key = re.sub(r"\\(.)", r"\1", quoted.group(1))
    elif _TOKEN.fullmatch(raw):
        key = raw
    else:
        return Problem(
            "invalid-key",
            400,
            f"{options.header} is malformed",
            f"{options.header} must be a Structured Field string of printable ASCII in "
            'double quotes ("8e03978e-40d5-43e8-bc93-6894a57f9324") or a bare token.',
        )
    if not key:
        return Problem("invalid-key", 400, f"{options.header} is empty", "Send a unique value.")
    if len(key) > options.max_key_length:
        return Problem(
            "invalid-key",
            400,
            f"{options.header} is too long",
            f"The key is {len(key)} characters; at most {options.max_key_length} are accepted.",
        )
    return key


def stored_key(options: Options, request: Request, key: str) -> str:
    """The key in the store: ``http:<caller>:<METHOD>:<path>:<key>``, ``-`` for no caller.
    A path that would make it longer than a store key may be is replaced by its hash."""
    caller = options.caller(request) or "-"
    scoped = f"http:{caller}:{request.method.upper()}:{request.path}:{key}"
    if len(scoped) <= MAX_KEY_BYTES:
        return scoped
    digest = hashlib.sha256(request.path.encode()).hexdigest()[:32]
    return f"http:{caller}:{request.method.upper()}:#{digest}:{key}"


def request_path(raw: bytes) -> str:
    """A request's path in the form the stored key holds it: its bytes after percent-
    decoding (ASGI's ``path`` in UTF-8, WSGI's ``PATH_INFO`` in latin-1), encoded again
    the one way, so both servers give one path one form, of printable ASCII."""
    data = raw
    return quote(data, safe="/:@!$&'()*+,;=-._~")


@dataclass(frozen=True)
class Guarded:
    """A guarded request with its key: what an attempt claims, and under which names."""

    request: Request
    key: str
    """The client's ``Idempotency-Key``."""
    stored_key: str
    fingerprint: str


def guarded(options: Options, request: Request, key: str, body: bytes) -> Guarded:
    """``request`` with the client's ``key`` and ``body``: its stored key and fingerprint."""
    return Guarded(
        request, key, stored_key(options, request, key), fingerprint_of(options, request, body)
    )


def fingerprint_of(options: Options, request: Request, body: bytes) -> str:
    """SHA-256 of the body as sent, and the values of ``fingerprint_headers``."""
    digest = hashlib.sha256(body)
    for name in options.fingerprint_headers:
        digest.update(b"\0" + name.lower().encode() + b"\0")
        digest.update(request.headers.get(name.lower(), "").encode("latin-1"))
    return digest.hexdigest()


def stored_form(options: Options, request: Request, response: Response) -> JSON | None:
    """What the store keeps of ``response`` to replay it, or None when it is not kept (a
    5xx unless ``store_server_errors``; a body over ``max_body``): the key is released."""
    if response.status >= 500 and not options.store_server_errors:
        return None
    if len(response.body) > options.max_body:
        return None
    return {
        "http": FORMAT,
        "method": request.method.upper(),
        "path": request.path,
        "status": response.status,
        "headers": [[k, v] for k, v in response.headers if options.replayed(k)],
        "size": len(response.body),
        "body": base64.b64encode(response.body).decode("ascii"),
    }


def is_stored_response(result: Any) -> bool:
    """Whether a record's result is a stored HTTP response (``inspect`` shows it so)."""
    return isinstance(result, dict) and result.get("http") == FORMAT and "status" in result


def replay(result: JSON) -> Response:
    """The stored response, byte for byte, marked as a replay."""
    if not is_stored_response(result):
        raise ConfigError(f"the key holds a result that is not a stored HTTP response: {result!r}")
    assert isinstance(result, dict)
    headers = [(str(k), str(v)) for k, v in result["headers"]]
    body = base64.b64decode(str(result["body"]))
    headers += [(REPLAYED, "true"), ("content-length", str(len(body)))]
    return Response(int(str(result["status"])), headers, body)


@dataclass(frozen=True)
class Ran:
    """The app ran: ``response`` to send (None: sent already, as it streamed), and whether
    it was stored."""

    response: Response | None
    stored: bool


def answer(
    options: Options, result: Ran | ClaimOutcome, now: datetime
) -> tuple[str, Response | None]:
    """The outcome's name (the metric's, the span's) and the response to send for what an
    attempt came to: the app's response, or the answer to a claim that did not win."""
    if isinstance(result, Ran):
        return ("new" if result.stored else "not_stored"), result.response
    return answer_of(options, result, now)


def answer_of(options: Options, outcome: ClaimOutcome, now: datetime) -> tuple[str, Response]:
    """The outcome's name and the response to a claim that did not win the key."""
    if isinstance(outcome, Completed):
        return "replayed", replay(outcome.record.result)
    if isinstance(outcome, Mismatch):
        return "mismatch", Problem(
            "key-reused",
            422,
            f"{options.header} is already used",
            "This key was used with another request: a key names one operation. "
            "Send a new key for a new request.",
        ).response(options)
    if isinstance(outcome, Failed):
        return "failed", Problem(
            "key-failed",
            422,
            f"The request with this {options.header} failed for good",
            "It is not run again under this key; send a new key.",
        ).response(options)
    if isinstance(outcome, Busy):
        return "conflict", Problem(
            "request-in-progress",
            409,
            f"A request with this {options.header} is in progress",
            "Retry once it has finished: the first request's response is replayed then.",
            retry_after=_retry_after(outcome, now),
        ).response(options)
    raise TypeError(f"not an answer: {outcome!r}")  # pragma: no cover - Acquired runs the app


def _retry_after(outcome: Busy, now: datetime) -> int:
    """Seconds until the holder's lease ends (at least 1): when a retry may take it over."""
    if outcome.record is None or outcome.record.lease_expires_at is None:
        return 1
    left = (outcome.record.lease_expires_at - now).total_seconds()
    return max(1, int(left + 0.999))


def status_line(status: int) -> str:
    """``201 Created``: a WSGI status line for a status code."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


@dataclass(frozen=True)
class Attempt:
    """What the app sees of the attempt running it: ``scope["state"]["idempotency"]``
    (``request.state.idempotency`` in Starlette and FastAPI), ``environ["idemctl.attempt"]``
    under WSGI."""

    key: str
    """The client's ``Idempotency-Key``."""
    stored_key: str
    """The key in the store: caller, method and path before it."""
    fencing_token: int
    """Grows with every claim of the key: pass it to a downstream write that must reject a
    stale attempt's."""
    attempt: int
    takeover: bool
    """True when an earlier attempt held the key and vanished (its server killed): it may
    have done part of the work."""
    connection: Any = None
    """With ``transactional=True`` (PostgreSQL): the transaction's connection. The app's
    SQL on it commits with the stored response, or not at all."""
