"""Who may use the console, and how a request proves it.

- **Users** come from a file or the environment, a line each: ``NAME ROLE HASH``, the role
  ``viewer`` or ``operator``, the hash argon2 (``$argon2id$...``, from ``hash_password``) or
  bcrypt (``$2b$...``). A wrong password and an unknown name cost the same time.
- **Sessions** live in the server: the cookie holds a random id (256 bits) and nothing
  else, a login always starts a new one (a session id planted before login is worth
  nothing), and one ends after ``idle`` seconds without use or ``lifetime`` in all.
- **CSRF**: each session has its own token, which every form carries back.
- **An authenticating proxy** (oauth2-proxy's ``X-Forwarded-User``) is believed only for
  requests from the addresses it is configured with; its users are viewers unless the
  users file gives them a role.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from idemctl.errors import ConfigError

ROLES = ("viewer", "operator")
VIEWER, OPERATOR = ROLES
BCRYPT = ("$2a$", "$2b$", "$2y$")


def hash_password(password: str) -> str:
    """An argon2id hash of ``password``, for the users file."""
    from argon2 import PasswordHasher

    return PasswordHasher().hash(password)


def verify(hashed: str, password: str) -> bool:
    """Whether ``password`` is the one ``hashed`` (argon2 or bcrypt) was made from."""
    if hashed.startswith("$argon2"):
        from argon2 import PasswordHasher
        from argon2.exceptions import InvalidHashError, VerificationError

        try:
            return PasswordHasher().verify(hashed, password)
        except (VerificationError, InvalidHashError):
            return False
    if hashed.startswith(BCRYPT):
        import bcrypt

        try:
            return bcrypt.checkpw(password.encode(), hashed.encode())
        except ValueError:
            return False
    return False


@dataclass(frozen=True)
class User:
    name: str
    role: str

    @property
    def operator(self) -> bool:
        """May act (unlock, forget, purge) where the console allows repairs at all."""
        return self.role == OPERATOR


class Users:
    """The console's users: name -> (role, password hash)."""

    def __init__(self, entries: Mapping[str, tuple[str, str]]) -> None:
        self._entries = dict(entries)
        # An unknown name is checked against this, so that it costs what a known one does.
        self._decoy = hash_password(secrets.token_hex(16))

    @classmethod
    def parse(cls, text: str, source: str) -> Users:
        """The users in ``text`` (``source`` names it in errors: a file, an env var)."""
        entries: dict[str, tuple[str, str]] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 3:
                raise ConfigError(f"{source}, line {n}: write NAME ROLE HASH")
            name, role, hashed = parts
            if role not in ROLES:
                raise ConfigError(f"{source}, line {n}: role {role!r}: use viewer or operator")
            if not hashed.startswith(("$argon2", *BCRYPT)):
                raise ConfigError(
                    f"{source}, line {n}: the hash must be argon2 ($argon2id$...) or bcrypt "
                    "($2b$...): make one with idemctl console --hash-password"
                )
            if name in entries:
                raise ConfigError(f"{source}, line {n}: {name!r} again")
            entries[name] = (role, hashed)
        return cls(entries)

    @classmethod
    def read(cls, path: Path) -> Users:
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"users file {path}: {exc.strerror}") from None
        return cls.parse(text, str(path))

    def role_of(self, name: str) -> str | None:
        entry = self._entries.get(name)
        return entry[0] if entry else None

    def check(self, name: str, password: str) -> User | None:
        """The user, if ``password`` is theirs."""
        entry = self._entries.get(name)
        good = verify(entry[1] if entry else self._decoy, password)
        return User(name, entry[0]) if good and entry is not None else None


@dataclass
class Session:
    id: str
    user: User
    csrf: str
    started: float
    seen: float

    def csrf_valid(self, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token, self.csrf)


@dataclass
class Sessions:
    """The sessions of one console process."""

    idle: float = 30 * 60.0
    lifetime: float = 12 * 3600.0
    clock: Callable[[], float] = time.monotonic
    _live: dict[str, Session] = field(default_factory=dict)

    def start(self, user: User) -> Session:
        """A new session for ``user``: always a fresh id."""
        now = self.clock()
        session = Session(secrets.token_urlsafe(32), user, secrets.token_urlsafe(32), now, now)
        self._live[session.id] = session
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session ``sid`` names, or None (unknown, idle too long, too old)."""
        session = self._live.get(sid) if sid else None
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > self.idle or now - session.started > self.lifetime:
            del self._live[session.id]
            return None
        session.seen = now
        return session

    def end(self, sid: str | None) -> None:
        if sid:
            self._live.pop(sid, None)


class Proxy:
    """An authenticating proxy in front of the console: its user header is believed only
    from ``networks`` (addresses or CIDR ranges)."""

    def __init__(self, networks: Iterable[str], header: str = "X-Forwarded-User") -> None:
        try:
            self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]
        except ValueError as exc:
            raise ConfigError(f"--trust-proxy: {exc}") from None
        self.header = header

    def user(
        self, client: str | None, headers: Mapping[str, str], users: Users | None
    ) -> User | None:
        """The user the proxy vouches for, if the request came from it."""
        if client is None or not self.trusts(client):
            return None
        name = headers.get(self.header.lower()) or headers.get(self.header)
        if not name:
            return None
        role = users.role_of(name) if users is not None else None
        return User(name, role or VIEWER)

    def trusts(self, client: str) -> bool:
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return False
        return any(address in network for network in self.networks)
