"""The request ``verify --http`` sends, as the user gives it: the URL, method, body, the
caller's headers (and a second caller's), checked; and how a header is shown (masked)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from idemctl.errors import ConfigError, OptionError
from idemctl.urls import redact_url

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SECRET_WORDS = (
    "auth",
    "cookie",
    "token",
    "secret",
    "key",
    "password",
    "passwd",
    "session",
    "signature",
    "credential",
)
"""A header whose name holds one of these is shown masked (``Authorization: Bearer ***``)."""


class Unreachable(ConfigError):
    """The API's URL takes no connection: nothing was checked (exit 2)."""


def header_pair(text: str, option: str) -> tuple[str, str]:
    """``'Name: value'`` as given to ``option``, checked: (name, value)."""
    name, colon, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not colon or not _TOKEN.fullmatch(name):
        raise OptionError(option, f"{text!r}: expected 'Name: value' (e.g. 'Authorization: ...')")
    if "\r" in value or "\n" in value:
        raise OptionError(option, f"{name}: a header value cannot hold a line break")
    return name, value


def masked(name: str, value: str) -> str:
    """``value`` as it may be shown: a header that may carry a credential is masked, its
    scheme kept (``Bearer ***``)."""
    if not any(word in name.lower() for word in _SECRET_WORDS):
        return value
    scheme, space, rest = value.partition(" ")
    if space and rest and scheme.isalpha() and len(scheme) <= 16:
        return f"{scheme} ***"
    return "***"


def merged(
    headers: Sequence[tuple[str, str]], over: Sequence[tuple[str, str]]
) -> tuple[tuple[str, str], ...]:
    """``headers`` with those of ``over`` in place of theirs of the same name."""
    replaced = {name.lower() for name, _ in over}
    return (*((n, v) for n, v in headers if n.lower() not in replaced), *over)


@dataclass(frozen=True)
class HttpTarget:
    """The request to send, as the user gives it, and how to send the cases."""

    url: str
    method: str = "POST"
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    """The caller's headers (Authorization, Content-Type, ...), sent with every request."""
    second_caller: tuple[tuple[str, str], ...] = ()
    """Another caller's headers, in place of the caller's of the same name."""
    key_header: str = "Idempotency-Key"
    bare_key: bool = False
    """Send keys bare (Stripe's form) instead of as the draft's ``"..."`` string."""
    fault_path: str | None = None
    """A path (and query) of the same host that answers the request with a 5xx."""
    fault_body: bytes | None = None
    """A body the API answers with a 5xx (``{uuid}`` replaced)."""
    concurrency: int = 5
    timeout: float = 30.0
    """Seconds to wait for each connection and answer."""

    def check(self) -> None:
        shown = redact_url(self.url)
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - parses the port, raising for a bad one
        except ValueError as exc:
            raise OptionError("http", f"{shown}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OptionError(
                "http", f"{shown}: expected http://HOST[:PORT]/PATH or https://HOST[:PORT]/PATH"
            )
        if "@" in parts.netloc:
            raise OptionError("http", f"{shown}: give credentials as --header 'Authorization: ...'")
        if not _TOKEN.fullmatch(self.method):
            raise OptionError("method", f"{self.method!r} is no HTTP method")
        if not _TOKEN.fullmatch(self.key_header):
            raise OptionError("key_header", f"{self.key_header!r} is no header name")
        for name, _ in (*self.headers, *self.second_caller):
            if name.lower() == self.key_header.lower():
                raise OptionError("header", f"{name}: verify sends the keys itself")
        if self.fault_path is not None and not self.fault_path.startswith("/"):
            raise OptionError("fault_path", f"{self.fault_path!r}: a path of the same host, /...")
        if self.concurrency < 2:
            raise OptionError("concurrency", "at least 2 requests at once")
        if self.timeout <= 0:
            raise OptionError("timeout", "must be more than 0")
