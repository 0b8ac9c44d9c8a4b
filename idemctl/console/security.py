"""What one console process keeps to stay closed to intruders and cheap for each caller:
the ``Host`` names it answers to, its login throttles and tokens, the gate on password
hashing, the slots for audits, and whether it serves repairs where plain HTTP can be read.

The limits are module constants, read when a ``Security`` is made (a test's
``sitecustomize`` may set them first)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from idemctl.console.hosts import Hosts
from idemctl.console.throttle import Gate, Slots, Window

NAME_FAILURES = 5
"""Failed logins a name may have in ``FAILURE_WINDOW`` seconds; then 429 until one ages out."""
ADDRESS_FAILURES = 20
"""Failed logins from one address in ``FAILURE_WINDOW`` seconds, whatever the names."""
FAILURE_WINDOW = 300.0
HASHING_AT_ONCE = 2
"""Passwords hashed at once (argon2's default takes 64 MiB each); ``HASHING_WAITING``
more wait their turn, the rest get 429."""
HASHING_WAITING = 8
AUDITS_AT_ONCE = 2
"""Audits running at once; a third gets 429 until one ends."""
AUDIT_SECONDS = 60.0
"""How long an audit's answer is awaited (504 after); it holds its slot until it ends."""
LOGIN_TOKEN_SECONDS = 3600.0
"""How long a login form's token is good for."""
REFUSALS_LOGGED = 20
"""Refusals of a stranger (no login) the operator log takes per address in
``FAILURE_WINDOW``: a flood of forged forms cannot fill the disk."""
FOREIGN_HOSTS_LOGGED = 256
"""Distinct foreign ``Host`` names logged (each once); beyond, one line says so."""


class Logins:
    """Failed logins per name and per address."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.names = Window(NAME_FAILURES, FAILURE_WINDOW, clock)
        self.addresses = Window(ADDRESS_FAILURES, FAILURE_WINDOW, clock)

    def wait(self, name: str, address: str) -> int:
        """Seconds until a login as ``name`` from ``address`` may be tried; 0: now."""
        return max(self.names.wait(name), self.addresses.wait(address))

    def failed(self, name: str, address: str) -> None:
        self.names.add(name)
        self.addresses.add(address)

    def succeeded(self, name: str) -> None:
        self.names.clear(name)


class LoginTokens:
    """The login form's tokens: issued by this process (signed with its own key, dated),
    so that a token and cookie pair chosen elsewhere is refused."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._key = secrets.token_bytes(32)
        self.clock = clock

    def issue(self) -> str:
        body = f"{secrets.token_urlsafe(24)}.{int(self.clock())}"
        return f"{body}.{self._sign(body)}"

    def valid(self, token: str) -> bool:
        body, _, signature = token.rpartition(".")
        issued = body.rpartition(".")[2]
        if not body or not issued.isdigit():
            return False
        if not hmac.compare_digest(signature, self._sign(body)):
            return False
        return 0 <= self.clock() - int(issued) <= LOGIN_TOKEN_SECONDS

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()[:32]


class Remembered:
    """Names remembered once each, up to ``most``: ``first`` is true the first time a name
    is seen, and once for the first name past ``most`` (``overflow``)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._names: set[str] = set()
        self._overflowed = False
        self._lock = threading.Lock()

    def first(self, name: str) -> tuple[bool, bool]:
        """(log it, it is the first past the limit)."""
        with self._lock:
            if name in self._names:
                return False, False
            if len(self._names) < self.most:
                self._names.add(name)
                return True, False
            if self._overflowed:
                return False, False
            self._overflowed = True
            return True, True


@dataclass
class Security:
    hosts: Hosts = field(default_factory=Hosts.loopback)
    brokers: bool = False
    """Whether Kafka brokers were configured (``--brokers``, ``bootstrap.servers``): an
    audit without them is refused at once instead of trying 127.0.0.1:9092."""
    insecure: bool = False
    """Repairs allowed on a console reachable off this machine over plain HTTP: the pages
    say so (a banner) and the start warned."""
    logins: Logins = field(default_factory=Logins)
    tokens: LoginTokens = field(default_factory=LoginTokens)
    hashing: Gate = field(default_factory=lambda: Gate(HASHING_AT_ONCE, HASHING_WAITING))
    audits: Slots = field(default_factory=lambda: Slots(AUDITS_AT_ONCE, AUDIT_SECONDS))
    refusals: Window = field(default_factory=lambda: Window(REFUSALS_LOGGED, FAILURE_WINDOW))
    foreign: Remembered = field(default_factory=lambda: Remembered(FOREIGN_HOSTS_LOGGED))
