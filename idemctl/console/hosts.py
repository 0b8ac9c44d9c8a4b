"""The names the console answers to, and the origins its forms may come from.

DNS rebinding points a name of the attacker's at 127.0.0.1: the browser then takes the
console's answers for the attacker's own origin and lets its scripts read them. The
console answers only the ``Host`` names it was given (``--allowed-host``) and its own: the
loopback names (``localhost``, ``127.0.0.1``, ``[::1]``), the name or address it is bound
to, the machine's host name for a wildcard bind, and any address literal a connection
came in on. Anything else gets 421.

A name (``console.example.com``) matches the ``Host`` without a port and with the console's
own port; a name with a port (``console.example.com:8443``) matches that exactly.

A state-changing request (POST) that says where it comes from (``Origin``) must come from
the console's own origin: the origin of the ``Host`` it was sent to, or one named with
``--allowed-host`` (a proxy that rewrites ``Host``)."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from idemctl.errors import ConfigError

LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
WILDCARD = ("0.0.0.0", "::", "[::]", "")  # noqa: S104 (recognized, never bound here)
DEFAULT_PORTS = {"http": 80, "https": 443}
_NAME = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)$")

Named = tuple[str, int | None]
"""A host name (an IPv6 address in brackets) and its port, if one was given."""


def split(value: str) -> Named | None:
    """``Host``'s name (lower case, no trailing dot) and port; None when it is no name."""
    text = value.strip().lower()
    name, port = text, None
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            return None
        name, rest = text[: close + 1], text[close + 1 :]
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                return None
            port = int(rest[1:])
    elif ":" in text:
        name, _, number = text.rpartition(":")
        if not number.isdigit():
            return None
        port = int(number)
    name = name.rstrip(".") if not name.startswith("[") else name
    if not name or not _NAME.match(name) or (port is not None and not 0 < port < 65536):
        return None
    return name, port


def _literal(name: str) -> str:
    """An address as a ``Host`` writes it: IPv6 in brackets."""
    try:
        address = ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return name.lower()
    return f"[{address.compressed}]" if address.version == 6 else address.compressed


class Hosts:
    """The ``Host`` names one console answers to (its port: ``port``)."""

    def __init__(self, names: Iterable[str], port: int | None, given: Iterable[str] = ()) -> None:
        self.port = port
        self._names: set[Named] = set()
        self._given: set[Named] = set()
        for text in names:
            self._names.add(self._entry(text))
        for text in given:
            entry = self._entry(text)
            self._names.add(entry)
            self._given.add(entry)

    @staticmethod
    def _entry(text: str) -> Named:
        found = split(text)
        if found is None:
            raise ConfigError(f"--allowed-host {text!r}: write a name, an address or NAME:PORT")
        return _literal(found[0]), found[1]

    @classmethod
    def loopback(cls, port: int | None = None) -> Hosts:
        return cls(LOOPBACK, port)

    @classmethod
    def for_bind(cls, host: str, port: int, given: Iterable[str] = ()) -> Hosts:
        """The names a console bound to ``host:port`` answers to, ``given`` besides."""
        names = list(LOOPBACK)
        if host in WILDCARD:
            names.append(socket.gethostname())  # no DNS asked: it must not stall a start
        else:
            names.append(host)
        return cls([n for n in names if split(n) is not None], port, given)

    @property
    def names(self) -> list[str]:
        """The names, as an operator reads them (``NAME`` or ``NAME:PORT``)."""
        return sorted(n if p is None else f"{n}:{p}" for n, p in self._names)

    def _listed(self, named: Named, among: set[Named]) -> bool:
        name, port = named
        if (name, port) in among:
            return True
        return (name, None) in among and (port is None or port == self.port)

    def allows(self, host: str | None, server: tuple[str, int] | None = None) -> bool:
        """Whether the console answers to a request sent with ``Host: host``; ``server``
        is the address the connection came in on (an address literal of it is allowed)."""
        named = split(host) if host else None
        if named is None:
            return False
        named = (_literal(named[0]), named[1])
        if self._listed(named, self._names):
            return True
        if server is not None and named[0] == _literal(server[0]):
            return named[1] is None or named[1] == server[1]
        return False

    def own_origin(self, origin: str, host: str | None) -> bool:
        """Whether a request with ``Origin: origin`` sent to ``Host: host`` comes from the
        console's own pages."""
        try:
            parts = urlsplit(origin.strip())
            name, port = parts.hostname, parts.port
        except ValueError:
            return False
        if parts.scheme not in DEFAULT_PORTS or not name or parts.path not in ("", "/"):
            return False
        name = _literal(name.rstrip("."))
        sent = split(host) if host else None
        default = DEFAULT_PORTS[parts.scheme]
        if (
            sent is not None
            and _literal(sent[0]) == name
            and (sent[1] or default) == (port or default)
        ):
            return True
        return self._listed((name, port), self._given)
