"""The operator log: who did what, when, to what, from where, and what came of it, one JSON
object a line (``schemas/operator-log.schema.json``) in a file of the console's own.

It is the record, so nothing is done that it does not hold: the console checks at start
that it can append to the file, and an action's line is written before the action
(``write`` raises ``OperatorLogUnwritable`` when it cannot be, and the caller does
nothing). An action writes its intent first (``started``), then what came of it
(``finished``, the same ``id``). Logins, failed logins, logouts, refusals and each result
revealed are lines too. A target is typed (``target_kind``): a key and an entity of the
same name are two targets. ``recent`` reads the newest lines for the log page."""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections import deque
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from idemctl.errors import IdemctlError

Kind = Literal["key", "entity", "row", "sweep", "keys", "user", "host", "path"]
"""What a line's ``target`` names: a key, an entity, an outbox row's id, a sweep (its
``older than``), several keys (a bulk action), a user (a login), a ``Host`` name (a foreign
one refused), a path (a refused request)."""
KINDS: tuple[str, ...] = Kind.__args__  # type: ignore[attr-defined]
ANONYMOUS = "-"
"""The ``user`` of a line no login vouches for (a failed login, a refused stranger)."""
STARTED = "started"
"""An action's first line: what it is about to do, before it does it."""
MAX_FIELD = 1024
"""Characters a free text field keeps (a key is at most 512 bytes; an error may be long)."""


class OperatorLogUnwritable(IdemctlError):
    """The operator log cannot be appended to: whatever was to be logged is not done."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(
            f"the operator log {path} cannot be written ({reason}): what it was to record "
            "is not done"
        )
        self.path, self.reason = path, reason


@dataclass(frozen=True)
class Entry:
    at: str
    user: str
    action: str
    target: str
    result: str
    target_kind: str = "key"
    id: str | None = None
    """Ties an action's ``started`` line to the line that says what came of it."""
    address: str | None = None
    """The client's address: the TCP peer, or what a trusted proxy says it is."""
    keys: tuple[str, ...] | None = None
    """A sweep's or a bulk action's keys."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if self.keys is not None:
            data["keys"] = list(self.keys)
        return {k: v for k, v in data.items() if v is not None}


FIELDS = {f.name for f in fields(Entry)}


class OperatorLog:
    """An append-only JSON-lines file; ``recent`` reads its last entries."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise ``OperatorLogUnwritable`` unless a line can be appended (the file is created,
        empty, if missing; its folder is not)."""
        try:
            with self._lock:
                self._append(b"")
        except OSError as exc:
            raise OperatorLogUnwritable(self.path, exc.strerror or str(exc)) from None

    def write(
        self,
        user: str,
        action: str,
        target: str,
        result: str,
        *,
        kind: str = "key",
        address: str | None = None,
        id: str | None = None,
        keys: list[str] | tuple[str, ...] | None = None,
    ) -> Entry:
        """Append one line and return it; ``OperatorLogUnwritable`` when it cannot be
        written (and then do nothing the line was to record)."""
        if kind not in KINDS:
            raise ValueError(f"target kind {kind!r}: one of {', '.join(KINDS)}")
        entry = Entry(
            datetime.now(UTC).isoformat(timespec="milliseconds"), _cut(user), action,
            _cut(target), _cut(result), kind, id, address,
            tuple(keys) if keys is not None else None,
        )  # fmt: skip
        line = json.dumps(entry.to_json(), ensure_ascii=False) + "\n"
        try:
            with self._lock:
                self._append(line.encode("utf-8"))
        except OSError as exc:
            raise OperatorLogUnwritable(self.path, exc.strerror or str(exc)) from None
        return entry

    def started(
        self, user: str, action: str, target: str, *, kind: str = "key",
        address: str | None = None, keys: list[str] | tuple[str, ...] | None = None,
    ) -> Entry:  # fmt: skip
        """An action's intent, written before it is done (``result``: ``started``) with a
        fresh ``id``; ``OperatorLogUnwritable``: do not do it."""
        return self.write(user, action, target, STARTED, kind=kind, address=address,
                          id=secrets.token_hex(8), keys=keys)  # fmt: skip

    def finished(
        self, started: Entry, result: str, keys: list[str] | tuple[str, ...] | None = None
    ) -> Entry:
        """What came of the action ``started`` announced (its ``id``). Once the action is
        done a failure here cannot undo it: it raises all the same, for the caller to say
        that the record lacks its end."""
        return self.write(started.user, started.action, started.target, result,
                          kind=started.target_kind, address=started.address, id=started.id,
                          keys=keys if keys is not None else started.keys)  # fmt: skip

    def _append(self, data: bytes) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if data:
                os.write(fd, data)  # one write: a line is never interleaved with another
                os.fsync(fd)
        finally:
            os.close(fd)

    def recent(self, n: int = 200) -> list[Entry]:
        """The last ``n`` entries, newest first."""
        try:
            with self._lock, self.path.open(encoding="utf-8", errors="replace") as lines:
                last: deque[str] = deque(lines, maxlen=n)
        except OSError:
            return []
        entries = []
        for line in reversed(last):
            try:
                data: dict[str, Any] = json.loads(line)
                known = {k: v for k, v in data.items() if k in FIELDS}
                if isinstance(known.get("keys"), list):
                    known["keys"] = tuple(known["keys"])
                entries.append(Entry(**known))
            except (ValueError, TypeError, AttributeError):
                continue  # a line cut short by a crash
        return entries


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD else text[: MAX_FIELD - 1] + "…"


def default_path() -> Path:
    """``$XDG_STATE_HOME/idemctl/console-operator.log``, else under ``~/.local/state``."""
    state = os.environ.get("XDG_STATE_HOME") or ""
    base = Path(state) if Path(state).is_absolute() else Path.home() / ".local" / "state"
    return base / "idemctl" / "console-operator.log"
