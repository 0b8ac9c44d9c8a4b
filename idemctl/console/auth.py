"""Who may use the console, and how a request proves it.

- **Users** come from a file or the environment, a line each: ``NAME ROLE HASH``, the role
  ``viewer`` or ``operator``, the hash argon2 (``$argon2id$...``, from ``hash_password``) or
  bcrypt (``$2b$...``). A file is watched: read again when it changes (checked at most
  every ``interval`` seconds), a user removed or changed losing their sessions at once; a
  file that stops being valid keeps the last good users (and a warning says why).
- **Timing**: a wrong password and an unknown name cost the same. An unknown name is
  checked against a decoy hash of the kind and parameters of a user's own (the bcrypt cost,
  argon2's memory, time and lanes), the user picked by the name (a keyed hash of it), so
  the same name always costs the same and no kind of hash answers faster for strangers.
- **Sessions** live in the server: the cookie holds a random id (256 bits) and nothing
  else, a login always starts a new one (a session id planted before login is worth
  nothing), a user holds at most ``per_user`` (the oldest ends), and one ends after
  ``idle`` seconds without use or ``lifetime`` in all; the ended ones are swept.
- **CSRF**: each session has its own token, which every form carries back.
- **An authenticating proxy** (oauth2-proxy's ``X-Forwarded-User``) is believed only for
  requests whose TCP peer is one of the addresses it is configured with; its users are
  viewers unless the users file gives them a role.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from idemctl.errors import ConfigError

ROLES = ("viewer", "operator")
VIEWER, OPERATOR = ROLES
BCRYPT = ("$2a$", "$2b$", "$2y$")
WEAK_BCRYPT = 10
"""A bcrypt cost below this (``htpasswd -B`` writes 5) is guessed fast: the start warns."""
log = logging.getLogger("idemctl.console")


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


def parameters_of(hashed: str) -> str:
    """What a hash's cost is made of: ``$argon2id$v=19$m=65536,t=3,p=4``, ``$2b$12``."""
    parts = hashed.split("$")
    return "$".join(parts[:4] if hashed.startswith("$argon2") else parts[:3])


def decoy_like(hashed: str) -> str:
    """A hash of a random text, of ``hashed``'s kind and parameters: checking a password
    against it costs what checking against ``hashed`` does."""
    text = secrets.token_hex(16)
    if hashed.startswith("$argon2"):
        from argon2 import PasswordHasher, extract_parameters

        return PasswordHasher.from_parameters(extract_parameters(hashed)).hash(text)
    import bcrypt

    prefix = b"2a" if hashed.startswith("$2a$") else b"2b"
    return bcrypt.hashpw(
        text.encode(), bcrypt.gensalt(rounds=_cost(hashed), prefix=prefix)
    ).decode()


def _cost(hashed: str) -> int:
    return int(hashed.split("$")[2])


@dataclass(frozen=True)
class User:
    name: str
    role: str

    @property
    def operator(self) -> bool:
        """May act (unlock, forget, purge) where the console allows repairs at all."""
        return self.role == OPERATOR


def parse(text: str, source: str) -> dict[str, tuple[str, str]]:
    """``text``'s users: name -> (role, hash). ``source`` names it in errors (never the
    hash itself)."""
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
        if not _well_formed(hashed):
            raise ConfigError(
                f"{source}, line {n}: the hash must be argon2 ($argon2id$...) or bcrypt "
                "($2b$...): make one with idemctl console --hash-password"
            )
        if name in entries:
            raise ConfigError(f"{source}, line {n}: {name!r} again")
        entries[name] = (role, hashed)
    return entries


def _well_formed(hashed: str) -> bool:
    if hashed.startswith("$argon2"):
        from argon2 import extract_parameters
        from argon2.exceptions import InvalidHashError

        try:
            extract_parameters(hashed)
        except (InvalidHashError, ValueError):
            return False
        return True
    if hashed.startswith(BCRYPT):
        parts = hashed.split("$")
        return len(parts) == 4 and parts[2].isdigit() and 4 <= int(parts[2]) <= 31
    return False


@dataclass(frozen=True)
class _State:
    entries: dict[str, tuple[str, str]]
    decoys: dict[str, str]
    """A hash's parameters (``parameters_of``) -> a decoy of them; ``""``: no users."""
    order: list[str]


Signature = tuple[int, int, int, int]
"""A file's (inode, device, size, mtime in ns): a change of any is a change."""


class Users:
    """The console's users: name -> (role, password hash); read from ``path`` again
    when it changes (``refresh``)."""

    def __init__(
        self,
        entries: Mapping[str, tuple[str, str]],
        path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 1.0,
    ) -> None:
        self.path, self.clock, self.interval = path, clock, interval
        self._pepper = secrets.token_bytes(32)
        self._state = _State({}, {}, [])
        self._lock = threading.Lock()
        self._checked = clock()
        self._signature = _signature(path) if path is not None else None
        self._take(dict(entries))

    @classmethod
    def parse(cls, text: str, source: str) -> Users:
        """The users in ``text`` (``source`` names it in errors: a file, an env var)."""
        return cls(parse(text, source))

    @classmethod
    def read(cls, path: Path, clock: Callable[[], float] = time.monotonic) -> Users:
        """The users of the file ``path``, watched."""
        return cls(_read(path), path, clock)

    def _take(self, entries: dict[str, tuple[str, str]]) -> None:
        """Use ``entries``, with a decoy for each kind of hash they hold (kept across
        reads, so that a change costs a new decoy only for a new kind)."""
        kinds = {parameters_of(h) for _, h in entries.values()} or {""}
        decoys = {k: self._state.decoys.get(k) or "" for k in kinds}
        for kind in [k for k, d in decoys.items() if not d]:
            like = next((h for _, h in entries.values() if parameters_of(h) == kind), None)
            decoys[kind] = decoy_like(like) if like else hash_password(secrets.token_hex(16))
        self._state = _State(entries, decoys, sorted(entries))  # one assignment: atomic

    @property
    def _entries(self) -> dict[str, tuple[str, str]]:
        return self._state.entries

    def role_of(self, name: str) -> str | None:
        entry = self._entries.get(name)
        return entry[0] if entry else None

    def weak(self) -> list[str]:
        """The users whose hash is bcrypt below cost ``WEAK_BCRYPT``."""
        return sorted(
            n for n, (_, h) in self._entries.items()
            if h.startswith(BCRYPT) and _cost(h) < WEAK_BCRYPT
        )  # fmt: skip

    def decoy_for(self, name: str) -> str:
        """The hash an unknown ``name`` is checked against: like the hash of the user its
        keyed digest picks."""
        return self._decoy(self._state, name)

    def _decoy(self, state: _State, name: str) -> str:
        if not state.order:
            return state.decoys[""]
        digest = hmac.new(self._pepper, name.encode("utf-8", "replace"), hashlib.sha256)
        picked = state.order[int.from_bytes(digest.digest()[:8], "big") % len(state.order)]
        return state.decoys[parameters_of(state.entries[picked][1])]

    def check(self, name: str, password: str) -> User | None:
        """The user, if ``password`` is theirs (one hash checked, whoever asks)."""
        state = self._state
        entry = state.entries.get(name)
        good = verify(entry[1] if entry else self._decoy(state, name), password)
        return User(name, entry[0]) if good and entry is not None else None

    def due(self) -> bool:
        """Whether ``refresh`` would look at the file now."""
        return self.path is not None and self.clock() - self._checked >= self.interval

    def refresh(self) -> set[str]:
        """Read the file again if it changed: the names removed or changed (whose sessions
        must end). A file that cannot be read or is not valid keeps the users as they
        were, and logs a warning (the line's place and what is wrong, never a hash)."""
        if self.path is None or not self.due():
            return set()
        with self._lock:
            if not self.due():
                return set()
            self._checked = self.clock()
            signature = _signature(self.path)
            if signature == self._signature:
                return set()
            self._signature = signature
            try:
                entries = _read(self.path)
            except ConfigError as exc:
                log.warning("%s: the last good users stay", exc)
                return set()
            before = self._entries
            self._take(entries)
        changed = {n for n, e in before.items() if entries.get(n) != e}
        log.info("users file %s read again: %d users, %d changed or removed",
                 self.path, len(entries), len(changed))  # fmt: skip
        return changed


def _read(path: Path) -> dict[str, tuple[str, str]]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"users file {path}: {reason}") from None
    return parse(text, f"users file {path}")


def _signature(path: Path) -> Signature | None:
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_dev, found.st_size, found.st_mtime_ns


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
    per_user: int = 10
    """Sessions one user holds at most: a new one ends their oldest."""
    sweep_every: float = 60.0
    """Seconds between sweeps of the ended sessions."""
    _live: dict[str, Session] = field(default_factory=dict)
    _by_user: dict[str, dict[str, None]] = field(default_factory=dict)
    _swept: float = float("-inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __len__(self) -> int:
        return len(self._live)

    def start(self, user: User, replacing: str | None = None) -> Session:
        """A new session for ``user``: always a fresh id. ``replacing``: the session the
        same browser held (its cookie), which ends."""
        now = self.clock()
        session = Session(secrets.token_urlsafe(32), user, secrets.token_urlsafe(32), now, now)
        with self._lock:
            self._end(replacing)
            self._sweep(now)
            held = self._by_user.setdefault(user.name, {})
            while len(held) >= self.per_user:
                self._end(next(iter(held)))  # the oldest first: dicts keep their order
            self._live[session.id] = session
            self._by_user.setdefault(user.name, {})[session.id] = None
        return session

    def get(self, sid: str | None) -> Session | None:
        """The live session ``sid`` names, or None (unknown, idle too long, too old)."""
        now = self.clock()
        with self._lock:
            self._sweep(now)
            session = self._live.get(sid) if sid else None
            if session is None:
                return None
            if self._over(session, now):
                self._end(session.id)
                return None
            session.seen = now
            return session

    def end(self, sid: str | None) -> None:
        with self._lock:
            self._end(sid)

    def end_user(self, name: str) -> int:
        """End every session of ``name``; how many there were."""
        with self._lock:
            held = list(self._by_user.get(name, {}))
            for sid in held:
                self._end(sid)
            return len(held)

    def sweep(self) -> int:
        """End the sessions past their idle time or lifetime; how many."""
        with self._lock:
            self._swept = float("-inf")
            return self._sweep(self.clock())

    def _over(self, session: Session, now: float) -> bool:
        return now - session.seen > self.idle or now - session.started > self.lifetime

    def _sweep(self, now: float) -> int:
        if now - self._swept < self.sweep_every:
            return 0
        self._swept = now
        ended = [s.id for s in self._live.values() if self._over(s, now)]
        for sid in ended:
            self._end(sid)
        return len(ended)

    def _end(self, sid: str | None) -> None:
        session = self._live.pop(sid, None) if sid else None
        if session is None:
            return
        held = self._by_user.get(session.user.name)
        if held is not None:
            held.pop(session.id, None)
            if not held:
                del self._by_user[session.user.name]


class Proxy:
    """An authenticating proxy in front of the console: its user header is believed only
    from ``networks`` (addresses or CIDR ranges), judged by the TCP peer's own address."""

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

    def address_of(self, client: str | None, headers: Mapping[str, str]) -> str:
        """The client's address: the peer's, or, from the proxy, the last address its
        ``X-Forwarded-For`` names that is not a proxy of its own."""
        if client is None:
            return "-"
        if not self.trusts(client):
            return client
        chain = [a.strip() for a in headers.get("x-forwarded-for", "").split(",") if a.strip()]
        for address in reversed(chain):
            if not self.trusts(address):
                return address if _is_address(address) else client
        return client

    def trusts(self, client: str) -> bool:
        try:
            address = ipaddress.ip_address(client)
        except ValueError:
            return False
        return any(address in network for network in self.networks)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
