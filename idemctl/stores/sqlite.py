"""``sqlite:///path``: the embedded default store (stdlib sqlite3, WAL).

Every write is one ``BEGIN IMMEDIATE`` transaction, so several processes on one machine
can share a database file safely. Three slashes and a relative path
(``sqlite:///./idemctl.db``), four for an absolute one (``sqlite:////var/lib/idemctl.db``).
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from idemctl.durations import MAX_TIMEOUT_MS
from idemctl.errors import ConfigError, NotProvisioned, StoreError, StoreUnavailable
from idemctl.model import Entity, Finding, Provisioning, Record, Stats, Status
from idemctl.resources import read_resource
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION, LEASE_RANGE, RETENTION_RANGE
from idemctl.stores.queries import RecordFilter
from idemctl.stores.rows import RowStore
from idemctl.urls import UrlOptions, redact_url

SCHEMA_VERSION = 2
_COLUMNS = (
    "key, status, fingerprint, owner, fencing_token, attempts, lease_expires_at, created_at, "
    "updated_at, completed_at, expires_at, result, error, retriable"
)
_ENTITY_COLUMNS = (
    "entity, sequence, key, applied_at, holder, holder_token, lock_expires_at, updated_at, "
    "expires_at"
)
_SYNCHRONOUS = ("full", "normal", "extra")


def _ms(value: datetime | None) -> int | None:
    return None if value is None else round(value.timestamp() * 1000)


def _ms_floor(value: datetime) -> int:
    """``value`` in whole milliseconds, rounded down: for integer milliseconds ``t``,
    ``t > _ms_floor(value)`` exactly when ``t`` is after ``value`` (what Python compares)."""
    return math.floor(value.timestamp() * 1000)


def _after_prefix(prefix: str) -> str | None:
    """The least string above every string that starts with ``prefix`` (None: none is):
    its last character that can be raised, raised by one, what follows dropped. SQLite
    compares text as UTF-8 bytes, in code point order as Python does, so every key that
    starts with ``prefix`` lies in [prefix, this): the range lets a query seek the primary
    key instead of testing every row (the substr() test stays, and decides)."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop())
        if last < 0x10FFFF:
            raised = 0xE000 if 0xD800 <= last + 1 <= 0xDFFF else last + 1  # no surrogates
            return "".join(chars) + chr(raised)
    return None


def _prefixed(column: str, prefix: str) -> tuple[list[str], list[Any]]:
    """The clauses (and their arguments) that select ``column`` values starting with
    ``prefix``: substr comparison, not LIKE (a key may contain % and _), and the range
    those values lie in, for the index."""
    clauses = [f"substr({column}, 1, ?) = ?", f"{column} >= ?"]
    args: list[Any] = [len(prefix), prefix, prefix]
    above = _after_prefix(prefix)
    if above is not None:
        clauses.append(f"{column} < ?")
        args.append(above)
    return clauses, args


def _dt(value: int | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value / 1000, UTC)


def _record(row: tuple[Any, ...]) -> Record:
    return Record(
        key=row[0],
        status=Status(row[1]),
        fingerprint=row[2],
        owner=row[3],
        fencing_token=row[4],
        attempts=row[5],
        lease_expires_at=_dt(row[6]),
        created_at=datetime.fromtimestamp(row[7] / 1000, UTC),
        updated_at=datetime.fromtimestamp(row[8] / 1000, UTC),
        completed_at=_dt(row[9]),
        expires_at=_dt(row[10]),
        result=None if row[11] is None else json.loads(row[11]),
        error=row[12],
        retriable=bool(row[13]),
    )


def _entity(row: tuple[Any, ...]) -> Entity:
    return Entity(
        entity=row[0],
        sequence=row[1],
        key=row[2],
        applied_at=_dt(row[3]),
        holder=row[4],
        holder_token=row[5],
        lock_expires_at=_dt(row[6]),
        updated_at=datetime.fromtimestamp(row[7] / 1000, UTC),
        expires_at=_dt(row[8]),
    )


def schema_statements() -> list[str]:
    text = read_resource("schemas", "sqlite.sql")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";\n") if s.strip().rstrip(";")]


class _SQLiteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def get(self, key: str) -> Record | None:
        row = self._conn.execute(
            f"SELECT {_COLUMNS} FROM idem_keys WHERE key = ?", (key,)
        ).fetchone()
        return None if row is None else _record(row)

    def put(self, r: Record) -> None:
        result = None if r.result is None else json.dumps(r.result, separators=(",", ":"))
        self._conn.execute(
            f"INSERT OR REPLACE INTO idem_keys ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                r.key,
                r.status.value,
                r.fingerprint,
                r.owner,
                r.fencing_token,
                r.attempts,
                _ms(r.lease_expires_at),
                _ms(r.created_at),
                _ms(r.updated_at),
                _ms(r.completed_at),
                _ms(r.expires_at),
                result,
                r.error,
                int(r.retriable),
            ),
        )

    def delete(self, key: str) -> None:
        self._conn.execute("DELETE FROM idem_keys WHERE key = ?", (key,))

    def select(self, query: RecordFilter) -> list[Record]:
        where, args = _where(query)
        sql = f"SELECT {_COLUMNS} FROM idem_keys WHERE {where} ORDER BY key"
        if query.limit is not None:
            sql += " LIMIT ?"
            args.append(query.limit)
        return [_record(row) for row in self._conn.execute(sql, args)]

    def get_entity(self, entity: str) -> Entity | None:
        row = self._conn.execute(
            f"SELECT {_ENTITY_COLUMNS} FROM idem_entities WHERE entity = ?", (entity,)
        ).fetchone()
        return None if row is None else _entity(row)

    def put_entity(self, e: Entity) -> None:
        self._conn.execute(
            f"INSERT OR REPLACE INTO idem_entities ({_ENTITY_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
            (
                e.entity,
                e.sequence,
                e.key,
                _ms(e.applied_at),
                e.holder,
                e.holder_token,
                _ms(e.lock_expires_at),
                _ms(e.updated_at),
                _ms(e.expires_at),
            ),
        )

    def delete_entity(self, entity: str) -> None:
        self._conn.execute("DELETE FROM idem_entities WHERE entity = ?", (entity,))

    def select_entities(
        self,
        prefix: str | None,
        after: str | None,
        limit: int | None,
        live_at: datetime | None = None,
    ) -> list[Entity]:
        """``live_at``: only the entities not past retention at that time."""
        sql = f"SELECT {_ENTITY_COLUMNS} FROM idem_entities WHERE 1 = 1"
        args: list[Any] = []
        if prefix:
            clauses, prefix_args = _prefixed("entity", prefix)
            sql += "".join(f" AND {c}" for c in clauses)
            args += prefix_args
        if live_at is not None:
            sql += " AND (expires_at IS NULL OR expires_at > ?)"
            args.append(_ms_floor(live_at))
        if after is not None:
            sql += " AND entity > ?"
            args.append(after)
        sql += " ORDER BY entity"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [_entity(row) for row in self._conn.execute(sql, args)]


def _where(q: RecordFilter) -> tuple[str, list[Any]]:
    clauses: list[str] = ["1 = 1"]
    args: list[Any] = []
    if q.status is not None:
        clauses.append("status = ?")
        args.append(q.status.value)
    if q.prefix:
        prefix_clauses, prefix_args = _prefixed("key", q.prefix)
        clauses += prefix_clauses
        args += prefix_args
    if q.after is not None:
        clauses.append("key > ?")
        args.append(q.after)
    if q.live_at is not None:
        clauses.append("(expires_at IS NULL OR expires_at > ?)")
        args.append(_ms(q.live_at))
    if q.lease_expired_at is not None:
        clauses.append("status = 'in_progress' AND lease_expires_at <= ?")
        args.append(_ms(q.lease_expired_at))
    if q.owned is not None:
        clauses.append("owner IS NOT NULL" if q.owned else "owner IS NULL")
    if q.retention_over_at is not None:
        clauses.append("expires_at <= ?")
        args.append(_ms(q.retention_over_at))
    if q.created_by is not None:
        clauses.append("created_at <= ?")
        args.append(_ms(q.created_by))
    return " AND ".join(clauses), args


class SQLiteStore(RowStore):
    scheme = "sqlite"
    wait_poll = (0.02, 0.1)
    """Waiters in other processes see a key let go only by reading the file: a read of a
    local file costs little, so it is read often."""

    def __init__(
        self,
        path: str,
        *,
        url: str | None = None,
        synchronous: str = "full",
        busy_timeout: float = 10.0,
        auto_provision: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(url or f"sqlite:///{path}", **kwargs)
        self.path = path
        self._lock = threading.Lock()
        self._busy_timeout = busy_timeout
        self._synchronous = synchronous
        self._connection: sqlite3.Connection | None = None
        self.auto_provision = auto_provision
        """Create the database and its tables on first use (the embedded default)."""
        self._ready = False

    @property
    def _conn(self) -> sqlite3.Connection:
        """Opened on first use: until then (``provision(dry_run=True)``, say) no file is made."""
        if self._connection is None:
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self._busy_timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                # WAL lets readers run beside the one writer; synchronous=FULL makes a
                # completed key survive power loss, so it never runs twice.
                conn.execute("PRAGMA journal_mode=WAL").fetchone()
                conn.execute(f"PRAGMA synchronous={self._synchronous.upper()}")
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            self._connection = conn
        return self._connection

    def _exists(self) -> bool:
        return self._connection is not None or self.path == ":memory:" or os.path.exists(self.path)

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        options = UrlOptions(url)
        parts = options.parts
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise ConfigError(
                f"bad SQLite URL {redact_url(url)!r}: use sqlite:///relative/path.db "
                "or sqlite:////absolute/path.db"
            )
        settings: dict[str, Any] = {
            "synchronous": options.choice("synchronous", _SYNCHRONOUS, "full"),
            "busy_timeout": options.duration("busy_timeout", 10.0, 0.0, MAX_TIMEOUT_MS),
            "auto_provision": options.flag("auto_provision", True),
            "lease": options.duration("lease", DEFAULT_LEASE, *LEASE_RANGE),
            "retention": options.duration("retention", DEFAULT_RETENTION, *RETENTION_RANGE),
        }
        options.finish()
        return cls(parts.path[1:], url=url, **settings)

    def _translate(self, exc: sqlite3.Error) -> StoreError:
        text = str(exc)
        if "no such table: idem_entities" in text:
            return NotProvisioned(
                f"SQLite database {self.path} has an older idemctl schema, without the "
                "sequence guard's table: run 'idemctl init' to upgrade it"
            )
        if "no such table" in text:
            return NotProvisioned(
                f"SQLite database {self.path} has no idemctl tables: run 'idemctl init'"
            )
        if "locked" in text or "busy" in text:
            return StoreUnavailable(
                f"SQLite database {self.path} stayed locked by another writer for "
                f"{self._busy_timeout:g}s ({text})"
            )
        if "unable to open" in text or "readonly" in text or "disk" in text:
            return StoreUnavailable(f"cannot use SQLite database {self.path}: {text}")
        return StoreError(f"SQLite database {self.path}: {text}")

    def _prepare(self) -> None:
        if self._ready:
            return
        if not self.auto_provision:
            if not self._exists():
                # Opening it would create an empty file: looking must not change anything.
                raise NotProvisioned(
                    f"there is no SQLite database at {self.path}: run 'idemctl init'"
                )
            self._ready = True
            return
        # Processes that create one database at once can meet the file while another turns
        # it to WAL (busy at once, whatever the timeout), or keep a view of its schema from
        # before the tables: start over on a new connection until the tables show.
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                if self._schema_version() != SCHEMA_VERSION:
                    self.provision()
                with self._lock:
                    self._conn.execute("SELECT 1 FROM idem_keys LIMIT 0")
                self._ready = True
                return
            except (StoreError, sqlite3.OperationalError) as exc:
                self._ready = False
                retry = isinstance(exc, NotProvisioned) or any(
                    word in str(exc) for word in ("locked", "busy", "no such table")
                )
                if not retry or time.monotonic() > deadline:
                    raise self._translate(exc) if isinstance(exc, sqlite3.Error) else exc from None
                self._reconnect()
                time.sleep(random.uniform(0.01, 0.05))

    def _reconnect(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    @contextmanager
    def _transaction(self, write: bool = True) -> Iterator[_SQLiteTx]:
        self._prepare()
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc
            try:
                yield _SQLiteTx(self._conn)
            except sqlite3.Error as exc:
                self._conn.execute("ROLLBACK")
                raise self._translate(exc) from exc
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            try:
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self._conn.execute("ROLLBACK")
                raise self._translate(exc) from exc

    def stats(self, exact: bool = False) -> Stats:
        # Four reads of one snapshot, none of which sorts rows or looks rows up by an index
        # that may hold most of them: the rows (the primary key's count), the failed rows
        # (a walk of the table reading the status: no index has it), the rows in progress
        # (their partial index), and the rows past retention (their index, counted without
        # reading the rows). The completed ones are what is left. One GROUP BY status over
        # the live rows took 0.8 s on a million keys; these take 0.2 s.
        now = _ms(self.now())
        with self._transaction(write=False):
            (total,) = self._conn.execute("SELECT count(*) FROM idem_keys").fetchone()
            failed_all, failed_past = self._conn.execute(
                "SELECT count(*), sum(expires_at <= ?) FROM idem_keys WHERE status = 'failed'",
                (now,),
            ).fetchone()
            in_progress_all, in_progress, stale, oldest_ms, released = self._conn.execute(
                """SELECT count(*), sum(live), sum(live AND owner IS NOT NULL
                                                   AND lease_expires_at <= :now),
                          min(CASE WHEN live THEN created_at END), sum(live AND owner IS NULL)
                   FROM (SELECT owner, lease_expires_at, created_at,
                                (expires_at IS NULL OR expires_at > :now) AS live
                         FROM idem_keys WHERE status = 'in_progress')""",
                {"now": now},
            ).fetchone()
            (past,) = self._conn.execute(
                "SELECT count(*) FROM idem_keys WHERE expires_at <= ?", (now,)
            ).fetchone()
        failed_past, in_progress = failed_past or 0, in_progress or 0
        completed_past = past - failed_past - (in_progress_all - in_progress)
        by_status = dict.fromkeys(Status, 0)
        by_status[Status.IN_PROGRESS] = in_progress
        by_status[Status.COMPLETED] = total - failed_all - in_progress_all - completed_past
        by_status[Status.FAILED] = failed_all - failed_past
        return Stats(
            sum(by_status.values()),
            by_status,
            stale or 0,
            _dt(oldest_ms),
            past,
            released or 0,
            counted_by="query",
        )

    def count_entities(self) -> int:
        # Counted by the query: the base class reads every entity into Python.
        now = self.now()
        with self._transaction(write=False):
            (count,) = self._conn.execute(
                "SELECT count(*) FROM idem_entities WHERE expires_at IS NULL OR expires_at > ?",
                (_ms_floor(now),),
            ).fetchone()
        return int(count)

    def _schema_version(self) -> int | None:
        if not self._exists():
            return None
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT value FROM idem_meta WHERE name = 'schema_version'"
                ).fetchone()
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return None
                raise self._translate(exc) from exc
        return None if row is None else int(row[0])

    def provision(self, dry_run: bool = False) -> Provisioning:
        current = self._schema_version()
        if current == SCHEMA_VERSION:
            return Provisioning(
                [], changed=False, dry_run=dry_run, notes=[f"schema version {current} is current"]
            )
        statements = schema_statements()
        if not dry_run:
            self._ready = True
            with self._transaction() as tx:
                for statement in statements:
                    tx._conn.execute(statement)
        return Provisioning(statements, changed=not dry_run, dry_run=dry_run)

    def check(self) -> list[Finding]:
        findings = []
        version = self._schema_version()
        findings.append(
            Finding(
                "schema",
                version == SCHEMA_VERSION,
                f"schema version {version} of {SCHEMA_VERSION}"
                if version is not None
                else f"no idemctl schema in {self.path}",
                None if version == SCHEMA_VERSION else "run 'idemctl init'",
            )
        )
        levels = ["off", "normal", "full", "extra"]
        if self._exists():
            with self._lock:
                (mode,) = self._conn.execute("PRAGMA journal_mode").fetchone()
                (sync,) = self._conn.execute("PRAGMA synchronous").fetchone()
            findings.append(
                Finding(
                    "journal",
                    mode == "wal",
                    f"journal_mode={mode}",
                    None
                    if mode == "wal"
                    else "the store sets WAL itself; is the file on a network filesystem?",
                )
            )
            setting, where = levels[sync], self.path
        else:  # looking must not create the file: say what opening it would set
            setting, where = self._synchronous.lower(), os.path.dirname(self.path) or "."
        durable = levels.index(setting) >= 2
        findings.append(
            Finding(
                "durability",
                durable,
                f"synchronous={setting}",
                None
                if durable
                else "add ?synchronous=full: with less, a power loss can forget a completed key",
            )
        )
        writable = self.path == ":memory:" or os.access(where, os.W_OK)
        findings.append(
            Finding("file", writable, f"{where} {'is' if writable else 'is not'} writable")
        )
        return findings

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
