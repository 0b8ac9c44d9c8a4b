"""The fence across HTTP: the key and the token as headers for the service being called,
and what that service needs to refuse a stale token with the same rules.

The caller, inside its handler::

    from idemctl.fence.http import fence_headers, raise_if_stale

    def charge(event, ctx):
        response = httpx.post(url, json=body, headers=fence_headers(ctx.fence))
        raise_if_stale(response)  # 409 stale-fence -> StaleFence: this attempt lost its key

The service being called reads the fence from the request (:func:`fence_from_headers`),
writes through a fenced write of its own store (``idemctl.fence.sql``, ``.redis``,
``.dynamodb``: the same rules, in the same transaction as its effect), and answers a
:class:`~idemctl.errors.StaleFence` with :func:`stale_fence_problem` (409, RFC 9457).
No framework and no HTTP client is imported here: headers are a mapping or ASGI's
``(name, value)`` byte pairs, a response is anything with ``status_code``, ``headers``
and ``content`` (requests, httpx).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from idemctl.errors import StaleFence
from idemctl.fence import Fence

__all__ = [
    "KEY_HEADER",
    "STALE_FENCE",
    "TOKEN_HEADER",
    "BadFenceHeaders",
    "fence_from_headers",
    "fence_headers",
    "raise_if_stale",
    "stale_fence_problem",
]

KEY_HEADER = "Idempotency-Key"
TOKEN_HEADER = "Fencing-Token"  # noqa: S105 (a header's name, not a secret)
STALE_FENCE = "https://idemctl.dev/problems/stale-fence"
"""The problem type (RFC 9457) of a refused write, as idemctl's own problems are named."""
_MAX_TOKEN = 2**63 - 1  # a signed 64-bit column holds every token a service may stamp

Headers = Mapping[str, str] | Iterable[tuple[bytes, bytes]] | Iterable[tuple[str, str]]


class BadFenceHeaders(ValueError):
    """The request's fence headers cannot be read: a token that is not a whole number, or
    a token without the key it belongs to. Answer it with a 400: the caller is wrong."""


class _Response(Protocol):
    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> bytes: ...


def fence_headers(fence: Fence) -> dict[str, str]:
    """The headers that carry ``fence`` to the service being called."""
    return {KEY_HEADER: fence.key, TOKEN_HEADER: str(fence.token)}


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def fence_from_headers(headers: Headers) -> Fence | None:
    """The fence a request carries, or None when it carries no ``Fencing-Token`` (an
    unfenced caller: its write is the service's to allow or not). Names are matched without
    regard to case. Raises :class:`BadFenceHeaders` for a token that is not a whole number
    in 0..2**63-1, a token without an ``Idempotency-Key``, or a header given twice."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    found: dict[str, str] = {}
    for name, value in pairs:
        lowered = _text(name).lower()
        if lowered in (KEY_HEADER.lower(), TOKEN_HEADER.lower()):
            if lowered in found:
                raise BadFenceHeaders(f"the {_text(name)} header is given twice")
            found[lowered] = _text(value).strip()
    raw = found.get(TOKEN_HEADER.lower())
    if raw is None:
        return None
    key = found.get(KEY_HEADER.lower())
    if not key:
        raise BadFenceHeaders(f"{TOKEN_HEADER} {raw!r} comes without the {KEY_HEADER} it fences")
    if not raw.isascii() or not raw.isdigit() or int(raw) > _MAX_TOKEN:
        raise BadFenceHeaders(f"{TOKEN_HEADER} {raw!r} is not a whole number in 0..2**63-1")
    return Fence(key, int(raw))


def stale_fence_problem(stale: StaleFence) -> tuple[int, dict[str, str], bytes]:
    """The answer to a refused write: ``(409, headers, body)``, an RFC 9457 problem whose
    ``token`` and ``last`` let the caller's :func:`raise_if_stale` rebuild the error."""
    body = {
        "type": STALE_FENCE,
        "title": "Stale fencing token",
        "status": 409,
        "detail": str(stale),
        "resource": stale.resource,
        "key": stale.key,
        "token": stale.token,
        "last": stale.last,
    }
    headers = {"content-type": "application/problem+json", "cache-control": "no-store"}
    return 409, headers, json.dumps(body).encode()


def raise_if_stale(response: _Response) -> None:
    """Raises :class:`~idemctl.errors.StaleFence` when ``response`` (requests, httpx) is
    the called service's stale-fence problem; does nothing otherwise (other errors are the
    caller's to check, e.g. with ``response.raise_for_status()``)."""
    if response.status_code != 409:
        return
    problem: Any
    try:
        problem = json.loads(response.content)
    except ValueError:
        return
    if not isinstance(problem, dict) or problem.get("type") != STALE_FENCE:
        return
    try:
        resource, key = str(problem["resource"]), str(problem["key"])
        token, last = int(problem["token"]), int(problem["last"])
    except (KeyError, TypeError, ValueError):  # its fields missing: still a refusal
        resource, key, token, last = "the called service", str(problem.get("key")), -1, -1
    raise StaleFence(resource, key, token, last)
