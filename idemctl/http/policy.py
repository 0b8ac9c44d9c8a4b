"""The ``Idempotency-Key`` policy, pure: which requests it guards, the key and its scope,
the fingerprint, the problems it answers, what is stored and how it is replayed.

No I/O and no framework: ``idemctl.http.asgi`` and ``idemctl.http.wsgi`` read a request
into a ``Request``, ask this module what to do, and drive the store with
``idemctl.http.attempt`` (the way ``idemctl.kafka.policy`` is shared by consume and FastStream).

Semantics: draft-ietf-httpapi-idempotency-key-header-07 and Stripe's documented behaviour;
the table is in docs/guides/http.md.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from fnmatch import fnmatchcase
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

from idemctl.errors import ConfigError
from idemctl.http.fingerprint import MODES, Mode, fingerprint
from idemctl.http.stored import (
    FORMAT,
    REPLAYED,
    Response,
    Streamed,
    is_stored_response,
    replay,
    stored_form,
    too_large,
)
from idemctl.model import (
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

if TYPE_CHECKING:
    from idemctl.fence import Fence

__all__ = [
    "FORMAT",
    "REPLAYED",
    "Response",
    "Streamed",
    "is_stored_response",
    "replay",
    "stored_form",
    "too_large",
]

HEADER = "Idempotency-Key"
DEFAULT_RETENTION = 86400.0
"""24 hours: how long Stripe keeps a key, and what a client may count on for its retries."""
DEFAULT_MAX_BODY = 1 << 20
"""Response bodies up to 1 MiB are stored; a larger one is sent as it streams, and its key
completed with the status and headers alone: a retry is told so, never run again."""
STORE_BODY_LIMITS = {"dynamodb": 256 << 10}
"""The most body a store family keeps, below ``max_body``: a DynamoDB item holds 400 KB, and
the body is kept in base64 (4/3 of its size) beside the record's other attributes."""
DEFAULT_UNSTORED_STATUSES = (422,)
"""Statuses answered before the endpoint runs (FastAPI's and Starlette's request
validation): the key is released, so the corrected request with the same key runs."""
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
    "vary",
)
"""Response headers stored and replayed (``("*",)``: every header but ``drop_headers``)."""
DEFAULT_DROP_HEADERS = ("set-cookie",)
"""Response headers never stored, even when ``replay_headers`` names them or is ``*``: a
session cookie replayed to whoever sends the key next would hand that session over."""
PROBLEM_BASE = "https://idemctl.dev/problems/"
UNAVAILABLE_RETRY_AFTER = 2
"""Seconds a client is asked to wait when the store does not answer."""

_PRINTABLE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
"""A bare key as clients send one (Stripe's convention: a bare UUID, base64, a ULID):
printable ASCII, spaces only inside."""
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
"""A Structured Field string (RFC 8941 3.3.3): printable ASCII in quotes, ``\\"`` and
``\\\\`` escaped."""
_SF_PARAMETERS = re.compile(
    r'(?:;[ ]*[a-z*][a-z0-9_\-.*]*(?:=(?:"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'
    r"|[\x21\x23-\x3a\x3c-\x7e]+))?)*"
)
"""A Structured Field item's parameters (RFC 8941 3.1.2), ignored: ``"abc";v=1`` is ``abc``."""


@dataclass(frozen=True)
class Request:
    """What the policy reads of a request: the method, the path as sent (percent-encoded),
    the headers, names in lower case (repeated ones joined with ``, ``), and the query
    string as sent (without its ``?``)."""

    method: str
    path: str
    headers: Mapping[str, str]
    query: str = ""


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
    """Response headers stored and replayed (an allow list); ``("*",)``: all of them."""
    drop_headers: Sequence[str] = DEFAULT_DROP_HEADERS
    """Response headers never stored (a deny list, over ``replay_headers``)."""
    store_server_errors: bool = False
    """Store 5xx responses too (Stripe does); by default the key is released instead, so
    the client's retry runs again."""
    unstored_statuses: Sequence[int] = DEFAULT_UNSTORED_STATUSES
    """Statuses the app answers before its endpoint runs (a framework's own validation):
    not stored, the key released, so the corrected request runs under the same key."""
    scope: Literal["route", "key"] = "route"
    """``"route"``: a key names one operation per method and path (the stored key holds
    them). ``"key"``: Stripe's rule, the key alone; reused on another method or path it is
    refused (422), as another payload is."""
    fingerprint: Mode = "semantic"
    """``"semantic"``: the request's meaning (the query's pairs, JSON in canonical form, a
    form's fields, a multipart body's parts, whatever the client's encoding or boundary).
    ``"raw"``: the query string and body byte for byte."""
    redact: Callable[[Response], Response] | None = None
    """Given each response before it is stored, returns what is kept and replayed (a card
    number masked); the first client gets the response as the app wrote it."""
    max_body: int = DEFAULT_MAX_BODY
    retention: float = DEFAULT_RETENTION
    lease: float | None = None
    """Seconds a request holds its key; the runner extends it while the app runs. None:
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
    _drop: frozenset[str] = field(init=False, repr=False)

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
        if self.redact is not None and not callable(self.redact):
            raise ConfigError("redact must be a function of the response")
        if self.scope not in ("route", "key"):
            raise ConfigError(f"scope must be 'route' or 'key', not {self.scope!r}")
        if self.fingerprint not in MODES:
            raise ConfigError(f"fingerprint must be 'semantic' or 'raw', not {self.fingerprint!r}")
        if any(not 100 <= int(s) <= 599 for s in self.unstored_statuses):
            raise ConfigError(f"unstored_statuses must be HTTP statuses: {self.unstored_statuses}")
        object.__setattr__(self, "_methods", frozenset(m.upper() for m in self.methods))
        object.__setattr__(self, "_replay", frozenset(h.lower() for h in self.replay_headers))
        object.__setattr__(self, "_drop", frozenset(h.lower() for h in self.drop_headers))

    def guards(self, method: str, path: str) -> bool:
        """Whether a request to ``path`` with ``method`` is guarded."""
        return method.upper() in self._methods and any(fnmatchcase(path, p) for p in self.paths)

    def replayed(self, name: str) -> bool:
        """Whether the response header ``name`` is stored and replayed."""
        name = name.lower()
        return (name in self._replay or "*" in self._replay) and name not in self._drop

    def body_limit(self, family: str) -> int:
        """The most body stored on a store of ``family`` (``redis``, ``dynamodb``, ...)."""
        return min(self.max_body, STORE_BODY_LIMITS.get(family, self.max_body))


@dataclass(frozen=True)
class Problem:
    """An RFC 9457 problem the middleware answers instead of running the app."""

    name: str
    """The ``type``'s last segment, and the metric's outcome."""
    status: int
    title: str
    detail: str
    retry_after: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    """More members of the problem's JSON (RFC 9457 extensions)."""

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
                **self.extra,
            }
        )
        headers = [
            ("content-type", "application/problem+json"),
            ("content-length", str(len(body))),
        ]
        if self.retry_after is not None:
            headers.append(("retry-after", str(self.retry_after)))
        return Response(self.status, headers, body)


def missing(options: Options) -> Problem:
    return Problem(
        "missing-key",
        400,
        f"{options.header} is missing",
        f"This operation needs an {options.header} header: a unique value per operation, "
        "the same on each retry of it.",
    )


def key_of(options: Options, raw: str | None, fields: int = 1) -> str | Problem | None:
    """The client's key from the header's value: a Structured Field string (``"abc"``,
    its parameters ignored) or the value as sent (a bare UUID, base64, a ULID: any
    printable ASCII); a Problem when it is malformed, empty, too long or sent in ``fields``
    header fields; None when there is none and none is required."""
    if raw is None:
        return missing(options) if options.required else None
    header = options.header
    if fields > 1:
        return _invalid(options, f"{header} was sent {fields} times", "Send one header field.")
    raw = raw.strip(" \t")
    quoted = _SF_STRING.match(raw)
    if quoted is not None and _SF_PARAMETERS.fullmatch(raw, quoted.end()):
        key = re.sub(r"\\(.)", r"\1", quoted.group(1))
    elif _PRINTABLE.fullmatch(raw):
        key = raw
    elif not raw:
        key = ""
    else:
        return _invalid(
            options,
            f"{header} is malformed",
            f"{header} must be printable ASCII (a UUID, say, bare or as a Structured Field "
            'string: "8e03978e-40d5-43e8-bc93-6894a57f9324"), with no control characters.',
        )
    if not key:
        return _invalid(options, f"{header} is empty", "Send a unique value.")
    if len(key) > options.max_key_length:
        return _invalid(
            options,
            f"{header} is too long",
            f"The key is {len(key)} characters; at most {options.max_key_length} are accepted.",
        )
    return key


def _invalid(options: Options, title: str, detail: str) -> Problem:
    return Problem("invalid-key", 400, title, detail)


def stored_key(options: Options, request: Request, key: str) -> str:
    """The key in the store: ``http:<caller>:<METHOD>:<path>:<key>`` (``scope="key"``:
    ``http:<caller>:<key>``), ``-`` for no caller. A path that would make it longer than a
    store key may be is replaced by its hash."""
    caller = options.caller(request) or "-"
    if options.scope == "key":
        return f"http:{caller}:{key}"
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
    """SHA-256 of what the request means (``idemctl.http.fingerprint``): method, path,
    query, body, and the values of ``fingerprint_headers``."""
    return fingerprint(
        options.fingerprint,
        request.method,
        request.path,
        request.query,
        request.headers,
        body,
        options.fingerprint_headers,
    )


@dataclass(frozen=True)
class Ran:
    """The app ran: ``response`` to send (None: sent already, as it streamed), and whether
    it was stored."""

    response: Response | None
    stored: bool


@dataclass(frozen=True)
class Unavailable:
    """The store did not answer: before the app ran (it did not run), or while its
    response was being stored, for as long as the attempt's lease could hold."""

    reason: str
    ran: bool = False


def answer(
    options: Options,
    result: Ran | Unavailable | ClaimOutcome,
    now: datetime,
    request: Request | None = None,
    typical: float | None = None,
) -> tuple[str, Response | None]:
    """The outcome's name (the metric's, the span's) and the response to send for what an
    attempt came to: the app's response, or the answer to a claim that did not win (a
    replay in a form ``request`` accepts; ``typical``: the route's usual seconds, for a
    409's ``Retry-After``)."""
    if isinstance(result, Ran):
        return ("new" if result.stored else "not_stored"), result.response
    if isinstance(result, Unavailable):
        return "unavailable", unavailable(result).response(options)
    return answer_of(options, result, now, request, typical)


def unavailable(result: Unavailable) -> Problem:
    detail = (
        "The request ran, but its response could not be stored: the store did not answer "
        "for as long as the request could hold its key. Retry with the same key."
        if result.ran
        else "The request was not run: the idempotency store did not answer. Retry with "
        "the same key."
    )
    return Problem(
        "store-unavailable",
        503,
        "The idempotency store is unavailable",
        detail,
        retry_after=UNAVAILABLE_RETRY_AFTER,
    )


def answer_of(
    options: Options,
    outcome: ClaimOutcome,
    now: datetime,
    request: Request | None = None,
    typical: float | None = None,
) -> tuple[str, Response]:
    """The outcome's name and the response to a claim that did not win the key."""
    if isinstance(outcome, Completed):
        result = outcome.record.result
        if too_large(result):
            assert isinstance(result, dict)
            first = result.get("status")
            return "too_large", Problem(
                "response-too-large",
                422,
                "The first response is too large to replay",
                f"The first request with this {options.header} succeeded with {first} and "
                f"its response ({result.get('size')} bytes) is too large to replay. It is "
                "not run again under this key.",
                extra={"first_status": first},
            ).response(options)
        accept = None if request is None else request.headers.get("accept-encoding")
        return "replayed", replay(result, accept)
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
            retry_after=retry_after(outcome, now, typical),
        ).response(options)
    raise TypeError(f"not an answer: {outcome!r}")  # pragma: no cover - Acquired runs the app


def retry_after(outcome: Busy, now: datetime, typical: float | None) -> int:
    """Seconds until the request in flight has likely finished (at least 1): the route's
    ``typical`` seconds less how long the holder has run, never past its lease's end. With
    no figures for the route, 1: a request's own time is unknown, the lease's end is not
    when it finishes."""
    record = outcome.record
    if record is None or record.lease_expires_at is None or typical is None:
        return 1
    # created_at is the first claim's time; a later attempt's start is no earlier than its
    # last write (updated_at, moved by each extension of its lease), so its running time is a floor.
    since = record.created_at if record.attempts <= 1 else record.updated_at
    running = max(0.0, (now - since).total_seconds())
    lease_left = (record.lease_expires_at - now).total_seconds()
    left = min(typical - running, lease_left)
    return max(1, math.ceil(left))


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

    @property
    def fence(self) -> Fence:
        """The stored key and the fencing token, as the fenced writes of ``idemctl.fence``
        take them. An app whose fenced write raises ``StaleFence`` lost its key to a later
        attempt: the client is answered as that attempt's retry would be (its response, or
        409 while it runs)."""
        from idemctl.fence import Fence

        return Fence(self.stored_key, self.fencing_token)
