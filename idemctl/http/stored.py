"""What the store keeps of a response and how it is replayed, pure: the headers kept (an
allow list and a deny list), the redaction hook, a response too large to keep, and a
replay in a form the retry accepts (``Accept-Encoding``).
"""

from __future__ import annotations

import base64
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemctl.errors import ConfigError

if TYPE_CHECKING:
    from idemctl.http.policy import Options, Request
    from idemctl.model import JSON

FORMAT = 1
"""The version of the stored response's JSON (``"http"`` in the record's result)."""
REPLAYED = "Idempotent-Replayed"
"""The header a replayed response carries (Stripe's name), with the value ``true``."""
NEVER_STORED = frozenset(
    {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
)
"""Headers that describe one transfer, not the response: the replay writes its own."""
DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""The content codings a replay can undo for a client that does not accept them."""


@dataclass(frozen=True)
class Response:
    """A response: the status, the headers as sent (names as the app wrote them, values
    as latin-1 text, the way WSGI has them), the body."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The value of the header ``name`` (any case), None without it."""
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


@dataclass(frozen=True)
class Streamed:
    """A response too large to keep: sent to the client as it came, its status, headers and
    size known once it ended."""

    status: int
    headers: list[tuple[str, str]]
    size: int


def kept_headers(options: Options, headers: list[tuple[str, str]]) -> list[list[str]]:
    return [[k, v] for k, v in headers if options.replayed(k) and k.lower() not in NEVER_STORED]


def stored_form(
    options: Options, request: Request, response: Response | Streamed, limit: int | None = None
) -> JSON | None:
    """What the store keeps of ``response`` to replay it, or None when it is not kept (a
    5xx unless ``store_server_errors``; a status of ``unstored_statuses``): the key is
    released. A body over ``limit`` bytes (``max_body``) is kept as its status, headers and
    size alone."""
    limit = options.max_body if limit is None else limit
    if response.status >= 500 and not options.store_server_errors:
        return None
    if response.status in options.unstored_statuses:
        return None
    if isinstance(response, Response) and options.redact is not None:
        response = options.redact(response)
    size = response.size if isinstance(response, Streamed) else len(response.body)
    form: dict[str, Any] = {
        "http": FORMAT,
        "method": request.method.upper(),
        "path": request.path,
        "status": response.status,
        "headers": kept_headers(options, response.headers),
        "size": size,
    }
    if isinstance(response, Streamed) or size > limit:
        form["body"] = None
        form["too_large"] = True
    else:
        form["body"] = base64.b64encode(response.body).decode("ascii")
    return form


def is_stored_response(result: Any) -> bool:
    """Whether a record's result is a stored HTTP response (``inspect`` shows it so)."""
    return isinstance(result, dict) and result.get("http") == FORMAT and "status" in result


def too_large(result: JSON) -> bool:
    """Whether the stored response is its status and headers alone (its body was over the
    limit): it cannot be replayed."""
    return isinstance(result, dict) and bool(result.get("too_large"))


def replay(result: JSON, accept_encoding: str | None = None) -> Response:
    """The stored response, byte for byte, marked as a replay; a body in a content coding
    that ``accept_encoding`` (the retry's ``Accept-Encoding``) refuses is decoded first.
    Every replay of an encoded body varies by ``Accept-Encoding``."""
    if not is_stored_response(result) or too_large(result):
        raise ConfigError(f"the key holds a result that is not a stored HTTP response: {result!r}")
    assert isinstance(result, dict)
    headers = [(str(k), str(v)) for k, v in result["headers"]]
    body = base64.b64decode(str(result["body"]))
    coding = next((v.strip().lower() for k, v in headers if k.lower() == "content-encoding"), "")
    if coding and coding != "identity":
        if not accepts(accept_encoding, coding) and coding in DECODERS:
            try:
                body = zlib.decompress(body, DECODERS[coding])
            except zlib.error:
                if coding != "deflate":
                    raise
                body = zlib.decompress(body, -zlib.MAX_WBITS)  # raw deflate, as some send it
            headers = [(k, v) for k, v in headers if k.lower() not in {"content-encoding", "etag"}]
        headers = _vary(headers, "Accept-Encoding")
    headers += [(REPLAYED, "true"), ("content-length", str(len(body)))]
    return Response(int(str(result["status"])), headers, body)


def accepts(accept_encoding: str | None, coding: str) -> bool:
    """Whether a client sending ``Accept-Encoding: accept_encoding`` takes ``coding``
    (RFC 9110 12.5.3: no header takes any coding; ``*`` any coding not named; q=0 refuses)."""
    if accept_encoding is None:
        return True
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        if not name:
            continue
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[name.strip().lower()] = q
    coding = coding.lower()
    if coding == "x-gzip":
        coding = "gzip" if "gzip" in weights else coding
    if coding in weights:
        return weights[coding] > 0
    return weights.get("*", 0.0) > 0


def _vary(headers: list[tuple[str, str]], name: str) -> list[tuple[str, str]]:
    """``headers`` with ``name`` in their ``Vary``."""
    for i, (k, v) in enumerate(headers):
        if k.lower() == "vary":
            named = {part.strip().lower() for part in v.split(",")}
            if name.lower() in named or "*" in named:
                return headers
            return [*headers[:i], (k, f"{v}, {name}"), *headers[i + 1 :]]
    return [*headers, ("Vary", name)]
