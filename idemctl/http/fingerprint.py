"""What a request means, hashed: its fingerprint, pure.

Two sends of one request must hash alike even when the client re-encodes it: a multipart
form gets a new random boundary on every send (requests, httpx), a JSON body may come with
its keys in another order, a form may encode a space as ``+`` or ``%20``. So the
fingerprint (``"semantic"``, the default) hashes the method, the path, the query string's
decoded pairs, and the body by its media type: JSON by its canonical form, a urlencoded
form by its decoded pairs, ``multipart/form-data`` by its parts (name, filename, content
type and the hash of the bytes) and anything else by its bytes. A body that does not parse
as its media type says is hashed as bytes. ``"raw"`` hashes the method, the path, the query
string and the body exactly as sent.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from email.message import Message
from typing import Literal
from urllib.parse import parse_qsl

from idemctl.model import canonical_json

Mode = Literal["semantic", "raw"]
MODES: tuple[Mode, ...] = ("semantic", "raw")


def fingerprint(
    mode: Mode,
    method: str,
    path: str,
    query: str,
    headers: Mapping[str, str],
    body: bytes,
    fingerprint_headers: Sequence[str] = (),
) -> str:
    """SHA-256 (hex) of what the request means (``mode="semantic"``) or of its bytes
    (``"raw"``), with the values of ``fingerprint_headers``."""
    digest = hashlib.sha256()
    _field(digest, b"m", method.upper().encode())
    _field(digest, b"p", path.encode())
    if mode == "raw":
        _field(digest, b"q", query.encode("latin-1"))
        _field(digest, b"b", body)
    else:
        _field(digest, b"q", _pairs(_decoded_pairs(query)) if query else b"")
        kind, form = _body_form(headers.get("content-type", ""), body)
        _field(digest, kind, form)
    for name in fingerprint_headers:
        _field(digest, b"h:" + name.lower().encode(), headers.get(name.lower(), "").encode())
    return digest.hexdigest()


def _field(digest: hashlib._Hash, tag: bytes, value: bytes) -> None:
    """Each field tagged and length-prefixed: no two requests' fields run together."""
    digest.update(tag + b"\0" + str(len(value)).encode() + b"\0" + value)


def _decoded_pairs(text: str) -> list[tuple[str, str]]:
    """A query string's or a urlencoded form's pairs, decoded, sorted by name; the pairs of
    one name keep their order (``a=1&a=2`` is a list, ``a=2&a=1`` another)."""
    pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="surrogateescape")
    return sorted(pairs, key=lambda pair: pair[0])


def _pairs(pairs: Iterable[tuple[str, ...]]) -> bytes:
    return json.dumps(list(pairs), ensure_ascii=True).encode()


def _media(content_type: str) -> Message:
    """``content_type`` parsed, for its parameters (quoted or not)."""
    message = Message()
    message["content-type"] = content_type
    return message


def _body_form(content_type: str, body: bytes) -> tuple[bytes, bytes]:
    """The body's tag and canonical bytes by its media type; its bytes when it does not
    parse as that type says."""
    if not body:
        return b"b", b""
    kind = content_type.partition(";")[0].strip().lower()
    if kind == "application/json" or kind.endswith("+json"):
        try:
            return b"json", canonical_json(json.loads(body))
        except (ValueError, RecursionError):
            return b"b", body
    if kind == "application/x-www-form-urlencoded":
        try:
            return b"form", _pairs(_decoded_pairs(body.decode("ascii")))
        except UnicodeDecodeError:
            return b"b", body
    if kind == "multipart/form-data":
        boundary = _media(content_type).get_param("boundary")
        parts = _multipart(body, boundary) if isinstance(boundary, str) and boundary else None
        if parts is not None:
            return b"multipart", _pairs(parts)
    return b"b", body


def _multipart(body: bytes, boundary: str) -> list[tuple[str, str, str, str]] | None:
    """A ``multipart/form-data`` body's parts, in order: (name, filename, content type,
    SHA-256 of the bytes), whatever the boundary; None when the body is not well formed."""
    delimiter = b"--" + boundary.encode("latin-1")
    sections = body.split(delimiter)
    if len(sections) < 3:
        return None
    parts: list[tuple[str, str, str, str]] = []
    for section in sections[1:]:
        if section.startswith(b"--"):  # the close delimiter: what follows is the epilogue
            return parts
        if not section.startswith(b"\r\n"):
            return None
        head, separator, content = section[2:].partition(b"\r\n\r\n")
        if not separator or not content.endswith(b"\r\n"):
            return None
        headers = Message()
        for line in head.decode("latin-1").split("\r\n"):
            field, colon, value = line.partition(":")
            if not colon:
                return None
            headers[field.strip()] = value.strip()
        name = headers.get_param("name", header="content-disposition")
        filename = headers.get_param("filename", header="content-disposition")
        parts.append(
            (
                name if isinstance(name, str) else "",
                filename if isinstance(filename, str) else "",
                headers.get("content-type", "") if filename is not None else "",
                hashlib.sha256(content[:-2]).hexdigest(),
            )
        )
    return None  # no close delimiter: cut short
