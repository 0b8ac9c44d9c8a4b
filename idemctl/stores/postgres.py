"""``postgresql://``: the store whose keys can commit together with the handler's own data.

Normal mode: every transition is one SQL statement (claim is one ``INSERT ... ON CONFLICT
... DO UPDATE ... WHERE <claimable> RETURNING``; batches go through ``unnest``), on
connections from a psycopg_pool pool with short lock and statement timeouts.

Transactional mode (``store.transaction(key)``): claim, the handler's SQL on the same
connection, outbox rows and complete share one transaction; a crash rolls all of it back.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool, PoolTimeout

from idemctl.errors import (
    ConfigError,
    IncompleteTransaction,
    KeyNotFound,
    LeaseLost,
    NotProvisioned,
    StoreError,
    StoreUnavailable,
)
from idemctl.model import (
    JSON,
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Finding,
    Page,
    Provisioning,
    Record,
    Stats,
    Status,
    canonical_json,
    validate_key,
)
from idemctl.resources import read_resource
from idemctl.stores.base import (
    BATCH,
    DEFAULT_LEASE,
    DEFAULT_RETENTION,
    BaseStore,
    Progress,
    new_owner,
    server_clock_finding,
)
from idemctl.stores.machine import check_forgettable, decide_claim, lease_lost, unlocked

COLUMNS = (
    "key, status::text, fingerprint, owner, fencing_token, attempts, lease_expires_at, "
    "created_at, updated_at, completed_at, expires_at, result, error, retriable"
)
ADMIN_LOCK_WAIT = 3.0
"""Seconds unlock and forget wait for a key's row that another transaction holds."""
# libpq options a URL may carry through to the connection.
_LIBPQ = ("sslmode", "sslrootcert", "sslcert", "sslkey", "application_name", "target_session_attrs")


def quote_ident(name: str) -> str:
    """A SQL identifier, always quoted: any schema name or prefix is safe."""
    if not name or "\x00" in name:
        raise ConfigError(f"not a usable SQL identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


def migrations(names: dict[str, str]) -> dict[int, list[str]]:
    """The statements of each migration in schemas/postgres.sql, identifiers substituted."""
    text = read_resource("schemas", "postgres.sql")
    found: dict[int, list[str]] = {}
    for part in re.split(r"^-- migration (\d+)[^\n]*\n", text, flags=re.M)[1:]:
        if part.isdigit():
            version = int(part)
            continue
        body = "\n".join(line for line in part.splitlines() if not line.startswith("--"))
        body = re.sub(r"\{(\w+)\}", lambda m: names[m.group(1)], body)
        found[version] = [s.strip() for s in body.split(";\n") if s.strip().rstrip(";")]
    return found


def _record(row: Sequence[Any]) -> Record:
    return Record(
        key=row[0],
        status=Status(row[1]),
        fingerprint=row[2],
        owner=row[3],
        fencing_token=row[4],
        attempts=row[5],
        lease_expires_at=_utc(row[6]),
        created_at=row[7].astimezone(UTC),
        updated_at=row[8].astimezone(UTC),
        completed_at=_utc(row[9]),
        expires_at=_utc(row[10]),
        result=row[11],
        error=row[12],
        retriable=row[13],
    )


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


class _LockTimeout(Exception):
    """Another transaction held a row past lock_timeout: the key is busy."""


@dataclass
class Unit:
    """One key inside an open transaction (``PostgresStore.transaction``)."""

    outcome: ClaimOutcome
    connection: psycopg.Connection[Any] | None
    """The transaction's connection while the key is Acquired; run your own SQL on it."""
    _store: PostgresStore | None = field(default=None, repr=False)
    completed: Record | None = None

    def complete(self, result: JSON = None, retention: float | None = None) -> Record:
        """Complete the key in this transaction: it commits with everything else or not at all."""
        if not isinstance(self.outcome, Acquired) or self.connection is None or self._store is None:
            raise StoreError("complete() needs a unit that acquired its key")
        a = self.outcome
        with self._store._translated():
            records = self._store._complete_on(
                self.connection, [Completion(a.key, a.owner, a.fencing_token, result)], retention
            )
            if not records:
                raise self._store._lost(self.connection, a.key, a.owner, a.fencing_token)
        self.completed = records[0]
        return records[0]


class PostgresStore(BaseStore):
    scheme = "postgresql"

    def __init__(
        self,
        conninfo: str,
        *,
        url: str,
        schema: str = "idem",
        prefix: str = "",
        lease: float = DEFAULT_LEASE,
        retention: float = DEFAULT_RETENTION,
        pool_min: int = 1,
        pool_max: int = 8,
        lock_timeout: float = 0.1,
        statement_timeout: float = 10.0,
        connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(url, lease=lease, retention=retention)
        self.schema, self.prefix = schema, prefix
        s = quote_ident(schema)
        self.names = {
            "schema": s,
            **{n: quote_ident(prefix + n) for n in ("schema_version", "status", "keys", "outbox")},
            **{
                n: quote_ident(prefix + n)
                for n in (
                    "keys_lease",
                    "keys_expires",
                    "keys_owner_in_progress",
                    "outbox_unpublished",
                    "outbox_created",
                    "outbox_published",
                )
            },
        }
        self.keys_table = f"{s}.{self.names['keys']}"
        self.outbox_table = f"{s}.{self.names['outbox']}"
        self._connect_timeout = connect_timeout
        # plan_cache_mode: psycopg prepares what it runs often, and PostgreSQL may then keep
        # one generic plan made while the table was tiny, where a sequential scan is cheapest;
        # as the table grows that plan gets slower with every key until autovacuum's ANALYZE
        # happens to replace it. Planning each execution for its values costs a fraction of
        # a millisecond and never degrades.
        options = (
            f"-c lock_timeout={round(lock_timeout * 1000)} "
            f"-c statement_timeout={round(statement_timeout * 1000)} -c TimeZone=UTC "
            "-c plan_cache_mode=force_custom_plan"
        )
        self._pool_args: dict[str, Any] = {
            "conninfo": conninfo,
            "min_size": pool_min,
            "max_size": pool_max,
            "kwargs": {
                "autocommit": True,
                "options": options,
                "connect_timeout": max(1, round(connect_timeout)),
            },
            "timeout": connect_timeout,
            "name": f"idemctl {self.url}",
        }
        self._pool_lock = threading.Lock()
        self._pool_made = 0.0
        self._lent = 0  # connections this store holds right now
        # The pool starts only once a first, direct connection got in (see _reach).
        self._reached = False
        self._reach_lock = threading.Lock()
        self._pool = self._new_pool(start=False)
        self._sql = self._statements()

    def _new_pool(self, start: bool = True) -> ConnectionPool[Any]:
        pool: ConnectionPool[Any] = ConnectionPool(**self._pool_args, open=False)
        if start:
            pool.open(wait=False)
        self._pool_made = time.monotonic()
        return pool

    def _reach(self) -> None:
        """Make this store's first connection directly, then start the pool.

        psycopg_pool connects in the background and retries what fails, so through it a
        refused password, a missing database or a closed port all look alike: no connection
        within connect_timeout. A direct connection fails at once with the server's reason:
        refused credentials or database become ConfigError (exit 2), a refused or timed-out
        connection StoreUnavailable (exit 3)."""
        with self._reach_lock:
            if self._reached:
                return
            try:
                conn = psycopg.connect(self._pool_args["conninfo"], **self._pool_args["kwargs"])
            except psycopg.OperationalError as exc:
                raise _connect_error(exc, self.url) from exc
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL at {self.url}: {_first_line(exc)}") from exc
            conn.close()
            self._pool.open(wait=False)
            self._reached = True

    def _renew_pool(self) -> None:
        """Start over with a new pool after the server went away, at most once a second.
        psycopg_pool backs off exponentially while the server is down (1, 2, 4 ... s), so
        its own pool would keep failing long after the server is back."""
        with self._pool_lock:
            if time.monotonic() - self._pool_made < 1.0:
                return
            old, self._pool = self._pool, self._new_pool()
        # Connections still lent out are closed as they come back; nobody waits for that.
        threading.Thread(target=old.close, name="idemctl-pool-close", daemon=True).start()

    @classmethod
    def from_url(cls, url: str) -> PostgresStore:
        from idemctl.urls import UrlOptions, redact_url

        options = UrlOptions(url)
        parts = options.parts
        settings: dict[str, Any] = {
            "schema": options.text("schema", "idem") or "idem",
            "prefix": options.text("prefix", "") or "",
            "lease": options.duration("lease", DEFAULT_LEASE),
            "retention": options.duration("retention", DEFAULT_RETENTION),
            "lock_timeout": options.duration("lock_timeout", 0.1),
            "statement_timeout": options.duration("statement_timeout", 10.0),
            "connect_timeout": options.duration("connect_timeout", 5.0),
        }
        settings["pool_min"] = options.whole("pool_min", 1)
        settings["pool_max"] = options.whole("pool_max", 8, minimum=1)
        libpq = {n: v for n in _LIBPQ if (v := options.text(n)) is not None}
        options.finish()
        if not parts.hostname and not parts.path.strip("/"):
            raise ConfigError(f"PostgreSQL URL {redact_url(url)} names no host or database")
        conninfo = urlunsplit(
            parts._replace(scheme="postgresql", query=urlencode(libpq), fragment="")
        )
        return cls(conninfo, url=url, **settings)

    # Plumbing --------------------------------------------------------------------------------

    def connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        """A pooled connection in autocommit mode (``with conn.transaction():`` for more than
        one statement); driver errors inside the block become idemctl's errors."""
        return self._connection()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; driver errors become idemctl's (the password never shows)."""
        if not self._reached:
            self._reach()
        with self._translated(), self._pool.connection() as conn:
            with self._pool_lock:
                self._lent += 1
            try:
                yield conn
            finally:
                with self._pool_lock:
                    self._lent -= 1

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except PoolTimeout as exc:
            if self._lent >= self._pool_args["max_size"]:  # every connection is in use here
                raise StoreUnavailable(
                    f"PostgreSQL at {self.url}: all {self._lent} pooled connections stayed "
                    f"busy for {self._connect_timeout:g}s (raise pool_max?)"
                ) from exc
            self._renew_pool()
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} is unreachable: no connection within "
                f"{self._connect_timeout:g}s"
            ) from exc
        except pg_errors.LockNotAvailable as exc:
            raise _LockTimeout() from exc
        except (
            pg_errors.UndefinedTable,
            pg_errors.InvalidSchemaName,
            pg_errors.UndefinedObject,
        ) as exc:
            raise NotProvisioned(
                f"PostgreSQL at {self.url} has no idemctl schema {self.schema!r}: "
                "run 'idemctl init'"
            ) from exc
        except pg_errors.UndefinedColumn as exc:
            raise NotProvisioned(
                f"PostgreSQL at {self.url} has an older idemctl schema {self.schema!r}: "
                "run 'idemctl init' to upgrade it"
            ) from exc
        except pg_errors.QueryCanceled as exc:
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} did not answer in time: {exc}"
            ) from exc
        except psycopg.OperationalError as exc:
            self._renew_pool()  # the other pooled connections died with this one
            raise StoreUnavailable(
                f"PostgreSQL at {self.url} is unreachable: {_first_line(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL at {self.url}: {_first_line(exc)}") from exc

    def _fetch(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        with self._connection() as conn:
            return conn.execute(sql, params).fetchall()

    def _statements(self) -> dict[str, str]:
        # complete, fail, extend and release match the owner, not the status: an owner is set
        # only while in progress (a CHECK constraint), and a status condition would let the
        # planner prefer the partial lease index, whose dead entries grow with every completion.
        t = self.keys_table
        live = "(k.expires_at IS NULL OR k.expires_at > now())"
        complete = f"""
WITH req AS (
    SELECT * FROM unnest(%(keys)s::text[], %(owners)s::text[], %(tokens)s::bigint[],
                         %(results)s::text[]) AS r(key, owner, token, result)
)
UPDATE {t} k SET status = 'completed', owner = NULL, lease_expires_at = NULL,
    updated_at = now(), completed_at = now(),
    expires_at = now() + %(retention)s * interval '1 second',
    result = req.result::jsonb, error = NULL, retriable = false
FROM req
WHERE k.key = req.key AND k.owner = req.owner
  AND k.fencing_token = req.token"""
        return {
            "claim": f"""
WITH req AS (
    SELECT * FROM unnest(%(keys)s::text[], %(fps)s::text[], %(owners)s::text[])
        AS r(key, fingerprint, owner)
), old AS (
    SELECT k.* FROM {t} k JOIN req USING (key)
), claimed AS (
    -- A key with no row starts its fencing counter at the clock in microseconds (not now():
    -- the transaction's start), above every token of a deleted earlier life of the key.
    INSERT INTO {t} AS k (key, status, fingerprint, owner, fencing_token, attempts,
                          lease_expires_at, created_at, updated_at)
    SELECT key, 'in_progress', fingerprint, owner,
           (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, 1,
           now() + %(lease)s * interval '1 second', now(), now()
    FROM req ORDER BY key
    ON CONFLICT (key) DO UPDATE SET
        status = 'in_progress',
        owner = excluded.owner,
        fencing_token = k.fencing_token + 1,
        attempts = CASE WHEN k.expires_at <= now() THEN 1 ELSE k.attempts + 1 END,
        fingerprint = CASE WHEN k.expires_at <= now() OR k.fingerprint IS NULL
                           THEN excluded.fingerprint ELSE k.fingerprint END,
        lease_expires_at = excluded.lease_expires_at,
        created_at = CASE WHEN k.expires_at <= now() THEN now() ELSE k.created_at END,
        updated_at = now(),
        completed_at = NULL,
        expires_at = NULL,
        result = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.result END,
        error = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.error END,
        retriable = CASE WHEN k.expires_at <= now() THEN false ELSE k.retriable END
    WHERE k.expires_at <= now()
       OR ((excluded.fingerprint IS NULL OR k.fingerprint IS NULL
            OR k.fingerprint = excluded.fingerprint)
           AND ((k.status = 'in_progress' AND (k.owner IS NULL OR k.lease_expires_at <= now()))
                OR (k.status = 'failed' AND k.retriable)))
    RETURNING k.key, k.fencing_token, k.attempts, k.lease_expires_at
)
SELECT req.key, c.fencing_token, c.attempts, c.lease_expires_at,
       coalesce(o.status = 'in_progress' AND (o.expires_at IS NULL OR o.expires_at > now()),
                false) AS takeover,
       o.key, o.status::text, o.fingerprint, o.owner, o.fencing_token, o.attempts,
       o.lease_expires_at, o.created_at, o.updated_at, o.completed_at, o.expires_at,
       o.result, o.error, o.retriable, now()
FROM req LEFT JOIN claimed c USING (key) LEFT JOIN old o USING (key)""",
            "complete": f"{complete}\nRETURNING {_prefixed(COLUMNS, 'k.')}",
            "complete_keys": f"{complete}\nRETURNING k.key",
            "fail": f"""
UPDATE {t} k SET status = 'failed', owner = NULL, lease_expires_at = NULL, updated_at = now(),
    expires_at = now() + %(retention)s * interval '1 second', error = %(error)s,
    retriable = %(retriable)s
WHERE k.key = %(key)s AND k.owner = %(owner)s
  AND k.fencing_token = %(token)s
RETURNING {_prefixed(COLUMNS, "k.")}""",
            "extend": f"""
UPDATE {t} k SET lease_expires_at = now() + %(lease)s * interval '1 second', updated_at = now()
WHERE k.key = %(key)s AND k.owner = %(owner)s
  AND k.fencing_token = %(token)s
RETURNING {_prefixed(COLUMNS, "k.")}""",
            "release": f"""
UPDATE {t} k SET owner = NULL, lease_expires_at = now(), updated_at = now(),
    attempts = greatest(k.attempts - %(unrun)s, 0)
WHERE k.key = %(key)s AND k.owner = %(owner)s
  AND k.fencing_token = %(token)s
RETURNING {_prefixed(COLUMNS, "k.")}""",
            "get": f"SELECT {_prefixed(COLUMNS, 'k.')} FROM {t} k WHERE k.key = %(key)s AND {live}",
            "get_any": f"SELECT {COLUMNS} FROM {t} WHERE key = %(key)s",
            "lock": f"SELECT {COLUMNS} FROM {t} WHERE key = %(key)s FOR UPDATE",
        }

    # The protocol ------------------------------------------------------------------------------

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        try:
            with self._connection() as conn:
                return self._claim_on(conn, requests, lease)
        except _LockTimeout:
            if len(requests) == 1:
                return [Busy(None)]
        # A row of the batch is held by an open transaction: claim one by one, so only
        # that key answers Busy.
        return [self.claim(r.key, r.fingerprint, lease) for r in requests]

    def _claim_on(
        self, conn: psycopg.Connection[Any], requests: Sequence[ClaimRequest], lease: float | None
    ) -> list[ClaimOutcome]:
        # One statement cannot change a row twice, so the second claim of a key in one batch
        # goes in a second statement, and so on: each sees what the one before it did, as
        # claims one by one would.
        seen: dict[str, int] = {}
        rounds: list[list[int]] = []
        for i, r in enumerate(requests):
            n = seen[r.key] = seen.get(r.key, -1) + 1
            if n == len(rounds):
                rounds.append([])
            rounds[n].append(i)
        outcomes: list[ClaimOutcome | None] = [None] * len(requests)
        for indexes in rounds:
            batch = [requests[i] for i in indexes]
            for i, outcome in zip(indexes, self._claim_statement(conn, batch, lease), strict=True):
                outcomes[i] = outcome
        return [o for o in outcomes if o is not None]

    def _claim_statement(
        self, conn: psycopg.Connection[Any], requests: Sequence[ClaimRequest], lease: float | None
    ) -> list[ClaimOutcome]:
        """One claim statement over keys that are all different."""
        owners = [new_owner() for _ in requests]
        params = {
            "keys": [r.key for r in requests],
            "fps": [r.fingerprint for r in requests],
            "owners": owners,
            "lease": self._lease(lease),
        }
        rows = {row[0]: row for row in conn.execute(self._sql["claim"], params).fetchall()}
        outcomes: list[ClaimOutcome] = []
        for r, owner in zip(requests, owners, strict=True):
            row = rows[r.key]
            if row[1] is not None:
                outcomes.append(
                    Acquired(r.key, owner, row[1], row[2], row[3].astimezone(UTC), takeover=row[4])
                )
            else:
                outcomes.append(self._not_claimed(conn, r, row[5:19], row[19]))
        return outcomes

    def _not_claimed(
        self,
        conn: psycopg.Connection[Any],
        request: ClaimRequest,
        old: Sequence[Any],
        now: datetime,
    ) -> ClaimOutcome:
        """Why the claim statement left a key alone, from the row it saw."""
        if old[0] is None:
            # Inserted by another transaction after this statement's snapshot: read it now.
            fresh = conn.execute(self._sql["get_any"], {"key": request.key}).fetchone()
            if fresh is None:
                return Busy(None)
            old = fresh
        record = _record(old)
        outcome, _ = decide_claim(
            record, request.key, request.fingerprint, now.astimezone(UTC), 0.0
        )
        # What the row allowed changed under us: somebody else holds it now.
        return Busy(record) if isinstance(outcome, Acquired) else outcome

    def complete(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        result: JSON = None,
        retention: float | None = None,
    ) -> Record:
        with self._connection() as conn:
            records = self._complete_on(
                conn, [Completion(key, owner, fencing_token, result)], retention
            )
            if records:
                return records[0]
            raise self._lost(conn, key, owner, fencing_token)

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        params = self._completion_params(completions, retention)
        done = {row[0] for row in self._fetch(self._sql["complete_keys"], params)}
        return [c.key in done for c in completions]

    def _complete_on(
        self,
        conn: psycopg.Connection[Any],
        completions: Sequence[Completion],
        retention: float | None,
    ) -> list[Record]:
        params = self._completion_params(completions, retention)
        return [_record(row) for row in conn.execute(self._sql["complete"], params).fetchall()]

    def _completion_params(
        self, completions: Sequence[Completion], retention: float | None
    ) -> dict[str, Any]:
        return {
            "keys": [c.key for c in completions],
            "owners": [c.owner for c in completions],
            "tokens": [c.fencing_token for c in completions],
            "results": [canonical_json(c.result).decode() for c in completions],
            "retention": self._retention(retention),
        }

    def _held(
        self, statement: str, key: str, owner: str, fencing_token: int, params: dict[str, Any]
    ) -> Record:
        with self._connection() as conn:
            row = conn.execute(
                self._sql[statement], {"key": key, "owner": owner, "token": fencing_token, **params}
            ).fetchone()
            if row is not None:
                return _record(row)
            raise self._lost(conn, key, owner, fencing_token)

    def _lost(
        self, conn: psycopg.Connection[Any], key: str, owner: str, fencing_token: int
    ) -> LeaseLost:
        row = conn.execute(self._sql["get"], {"key": key}).fetchone()
        return lease_lost(key, owner, fencing_token, None if row is None else _record(row))

    def fail(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        error: str,
        retriable: bool = True,
        retention: float | None = None,
    ) -> Record:
        params = {
            "error": error,
            "retriable": retriable,
            "retention": self._retention(retention),
        }
        return self._held("fail", key, owner, fencing_token, params)

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        record = self._held("extend", key, owner, fencing_token, {"lease": self._lease(lease)})
        assert record.lease_expires_at is not None
        return record.lease_expires_at

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        params = {"unrun": int(not handler_ran)}
        return self._held("release", key, owner, fencing_token, params)

    # Transactional mode ---------------------------------------------------------------------------

    @contextmanager
    def transaction(
        self, key: str, fingerprint: str | None = None, lease: float | None = None
    ) -> Iterator[Unit]:
        """Claim ``key`` in a new transaction and keep it open around the block.

        When ``unit.outcome`` is Acquired, run your SQL on ``unit.connection`` and call
        ``unit.complete(result)``: leaving the block commits all of it. An exception, a
        crash or a block that never completes rolls everything back, the claim included.
        Another transaction on the same key meanwhile gets Busy at once: a transaction-level
        advisory lock is tried before the claim, and other claimers wait on the row at most
        lock_timeout. For any other outcome nothing is held and ``unit.connection`` is None.
        """
        validate_key(key)
        with self._connection() as conn:
            conn.execute("BEGIN")
            open_tx = True
            try:
                (locked,) = conn.execute(
                    "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"{self.keys_table}/{key}",),
                ).fetchone() or (False,)
                outcome: ClaimOutcome = Busy(None)
                if locked:
                    try:
                        conn.execute("SAVEPOINT claim")
                        outcome = self._claim_on(conn, [ClaimRequest(key, fingerprint)], lease)[0]
                    except pg_errors.LockNotAvailable:
                        conn.execute("ROLLBACK TO SAVEPOINT claim")
                if not isinstance(outcome, Acquired):
                    conn.execute("ROLLBACK")
                    open_tx = False
                    yield Unit(outcome, None)
                    return
                unit = Unit(outcome, conn, self)
                yield unit
                if unit.completed is None:
                    raise IncompleteTransaction(
                        f"the transaction on key {key!r} ended without complete(): rolled back"
                    )
                conn.execute("COMMIT")
                open_tx = False
            finally:
                if open_tx and not conn.closed:
                    conn.execute("ROLLBACK")

    # Admin ----------------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        rows = self._fetch(self._sql["get"], {"key": key})
        return _record(rows[0]) if rows else None

    def _scan_page(
        self,
        status: Status | None,
        stale_only: bool,
        prefix: str | None,
        limit: int,
        cursor: str | None,
        older_than: float,
        released_only: bool,
    ) -> Page:
        where = ["(expires_at IS NULL OR expires_at > now())"]
        if older_than:
            where.append("created_at <= now() - %(older)s * interval '1 second'")
        params: dict[str, Any] = {"limit": limit + 1, "older": older_than}
        if status is not None or stale_only or released_only:
            where.append("status = %(status)s")
            params["status"] = (status or Status.IN_PROGRESS).value
        if stale_only:
            where.append("owner IS NOT NULL AND lease_expires_at <= now()")
        if released_only:
            where.append("owner IS NULL")
        if prefix:
            where.append("left(key, %(plen)s) = %(prefix)s")
            params |= {"plen": len(prefix), "prefix": prefix}
        if cursor is not None:
            where.append("key > %(after)s")
            params["after"] = cursor
        rows = self._fetch(
            f"SELECT {COLUMNS} FROM {self.keys_table} WHERE {' AND '.join(where)} "
            "ORDER BY key LIMIT %(limit)s",
            params,
        )
        records = [_record(r) for r in rows[:limit]]
        return Page(records, records[-1].key if len(rows) > limit else None)

    def stats(self) -> Stats:
        rows = self._fetch(
            f"""SELECT status::text, count(*),
                       count(*) FILTER (WHERE status = 'in_progress'
                                          AND owner IS NOT NULL AND lease_expires_at <= now()),
                       min(created_at) FILTER (WHERE status = 'in_progress'),
                       (SELECT count(*) FROM {self.keys_table} WHERE expires_at <= now()),
                       count(*) FILTER (WHERE status = 'in_progress' AND owner IS NULL)
                FROM {self.keys_table} WHERE expires_at IS NULL OR expires_at > now()
                GROUP BY status"""
        )
        by_status = dict.fromkeys(Status, 0)
        stale, oldest, past, released = 0, None, 0, 0
        for status, count, stale_count, oldest_at, past_count, released_count in rows:
            by_status[Status(status)] = count
            stale += stale_count
            released += released_count
            oldest = _utc(oldest_at) or oldest
            past = past_count
        if not rows:
            past = self._fetch(f"SELECT count(*) FROM {self.keys_table} WHERE expires_at <= now()")[
                0
            ][0]
        return Stats(sum(by_status.values()), by_status, stale, oldest, past, released)

    @contextmanager
    def _locked(self, key: str) -> Iterator[tuple[psycopg.Connection[Any], Record, datetime]]:
        """The key's row, locked in a transaction; KeyNotFound when absent or past retention.

        Another admin command's lock on the row lasts milliseconds and is waited out; a
        handler's transaction (transactional mode) can hold it for a whole lease, so the
        wait ends after ADMIN_LOCK_WAIT with an error that says to try again."""
        try:
            with self._connection() as conn, conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {round(ADMIN_LOCK_WAIT * 1000)}")
                row = conn.execute(self._sql["lock"], {"key": key}).fetchone()
                now = _now(conn)
                if row is None or _record(row).retention_over(now):
                    raise KeyNotFound(key)
                yield conn, _record(row), now
        except _LockTimeout:
            raise StoreError(
                f"key {key!r} is locked by a transaction in progress (waited "
                f"{ADMIN_LOCK_WAIT:g}s); try again"
            ) from None

    def unlock(self, key: str, force: bool = False) -> Record:
        with self._locked(key) as (conn, record, now):
            freed = unlocked(record, now, force)
            if freed is not record:
                conn.execute(
                    f"UPDATE {self.keys_table} SET owner = NULL, lease_expires_at = %(now)s, "
                    "updated_at = %(now)s WHERE key = %(key)s",
                    {"key": key, "now": now},
                )
            return freed

    def unlock_stale(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> list[str]:
        t = self.keys_table
        stale = """status = 'in_progress' AND owner IS NOT NULL
                    AND lease_expires_at <= now() - %(older)s * interval '1 second'"""
        args = {"older": older_than, "batch": BATCH}
        if dry_run:
            return sorted(r[0] for r in self._fetch(f"SELECT key FROM {t} WHERE {stale}", args))
        freed: list[str] = []
        while True:  # a batch a transaction; a freed key has no owner, so none comes twice
            rows = self._fetch(
                f"""UPDATE {t} SET owner = NULL, lease_expires_at = now(), updated_at = now()
                    WHERE key IN (SELECT key FROM {t} WHERE {stale}
                                  LIMIT %(batch)s FOR UPDATE SKIP LOCKED)
                    RETURNING key""",
                args,
            )
            freed += (r[0] for r in rows)
            if rows and progress is not None:
                progress(len(rows))
            if len(rows) < BATCH:
                return sorted(freed)

    def forget(self, key: str, force: bool = False) -> Record:
        with self._locked(key) as (conn, record, _):
            check_forgettable(record, force)
            # A tombstone past retention, not a deletion: it keeps the fencing counter.
            conn.execute(
                f"UPDATE {self.keys_table} SET owner = NULL, lease_expires_at = NULL, "
                "updated_at = now(), expires_at = now(), result = NULL WHERE key = %(key)s",
                {"key": key},
            )
            return record

    def purge(
        self, older_than: float = 0.0, *, dry_run: bool = False, progress: Progress | None = None
    ) -> int:
        t = self.keys_table
        over = "expires_at <= now() - %(older)s * interval '1 second'"
        args = {"older": older_than, "batch": BATCH}
        if dry_run:
            return int(self._fetch(f"SELECT count(*) FROM {t} WHERE {over}", args)[0][0])
        return self.delete_in_batches(t, "key", over, args, progress)

    def delete_in_batches(
        self,
        table: str,
        column: str,
        where: str,
        params: dict[str, Any],
        progress: Progress | None = None,
        order: str = "",
    ) -> int:
        """Delete the rows of ``table`` that ``where`` picks, ``params["batch"]`` at a time,
        each batch its own statement and transaction (a long purge never holds many row
        locks), skipping rows others hold; ``column`` is the key. Returns how many went."""
        deleted_total = 0
        while True:
            with self._connection() as conn:
                deleted = conn.execute(
                    f"DELETE FROM {table} WHERE {column} IN (SELECT {column} FROM {table} "
                    f"WHERE {where} {order} LIMIT %(batch)s FOR UPDATE SKIP LOCKED)",
                    params,
                ).rowcount
            deleted_total += deleted
            if deleted and progress is not None:
                progress(deleted)
            if deleted < params["batch"]:
                return deleted_total

    # Provisioning and health ---------------------------------------------------------------------

    def schema_version(self) -> int:
        """The version of the provisioned schema; 0 when there is none."""
        table = f"{self.names['schema']}.{self.names['schema_version']}"
        try:
            rows = self._fetch(f"SELECT coalesce(max(version), 0) FROM {table}")
        except NotProvisioned:
            return 0
        return int(rows[0][0])

    def provision(self, dry_run: bool = False, upto: int | None = None) -> Provisioning:
        steps = migrations(self.names)
        target = max(steps) if upto is None else upto
        table = f"{self.names['schema']}.{self.names['schema_version']}"
        lock = (
            "SELECT pg_advisory_xact_lock(hashtextextended("
            + psycopg.sql.quote(f"idemctl provision {self.names['schema']}")
            + ", 0))"
        )
        current = self.schema_version()
        statements = []
        for version in sorted(v for v in steps if current < v <= target):
            statements += steps[version]
            statements.append(f"INSERT INTO {table} (version) VALUES ({version})")
        if not statements:
            return Provisioning(
                [], changed=False, dry_run=dry_run, notes=[f"schema version {current} is current"]
            )
        statements.insert(0, lock)
        if not dry_run:
            with self._connection() as conn, conn.transaction():
                conn.execute(statements[0])
                if self.schema_version_on(conn) > current:  # another process provisioned meanwhile
                    return Provisioning([], changed=False, notes=["provisioned concurrently"])
                for statement in statements[1:]:
                    conn.execute(statement)
        return Provisioning(statements, changed=not dry_run, dry_run=dry_run)

    def schema_version_on(self, conn: psycopg.Connection[Any]) -> int:
        table = f"{self.names['schema']}.{self.names['schema_version']}"
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if not exists or exists[0] is None:
            return 0
        row = conn.execute(f"SELECT coalesce(max(version), 0) FROM {table}").fetchone()
        return int(row[0]) if row else 0

    def check(self) -> list[Finding]:
        findings = []
        started = time.perf_counter()
        with self._connection() as conn:
            row = conn.execute("SELECT current_setting('server_version'), now()").fetchone()
            latency = (time.perf_counter() - started) * 1000
            version_on = self.schema_version_on(conn)
            latest = max(migrations(self.names))
            outbox = None
            if version_on == latest:  # the unpublished rows only: the partial index has them
                outbox = conn.execute(
                    "SELECT count(*), count(*) FILTER (WHERE attempts > 0), "
                    "extract(epoch FROM now() - min(created_at)) "
                    f"FROM {self.outbox_table} WHERE published_at IS NULL"
                ).fetchone()
        assert row is not None
        server_version, server_now = row
        skew = (server_now - datetime.now(UTC)).total_seconds()
        findings.append(
            Finding(
                "connection", True, f"PostgreSQL {server_version} at {self.url}, {latency:.1f} ms"
            )
        )
        findings.append(
            Finding(
                "schema", version_on == latest,
                f"schema {self.schema!r} at version {version_on} of {latest}",
                None if version_on == latest else "run 'idemctl init'",
            )
        )  # fmt: skip
        if outbox is not None:
            findings.append(_outbox_finding(*outbox))
        findings.append(server_clock_finding(skew))
        return findings

    def close(self) -> None:
        self._pool.close()


OUTBOX_LAG = 300.0
"""Seconds an outbox row may wait for the relay before doctor calls it a problem."""


def _outbox_finding(unpublished: int, failing: int, oldest: Any) -> Finding:
    if not unpublished:
        return Finding("outbox", True, "no outbox row waits to be published")
    from idemctl.durations import format_duration

    waiting = float(oldest or 0)
    detail = (
        f"{unpublished} outbox row(s) unpublished, the oldest for {format_duration(waiting)}; "
        f"{failing} with failed deliveries"
    )
    if failing:
        fix = "'idemctl outbox status' shows the errors: can the relay reach the brokers?"
        return Finding("outbox", False, detail, fix)
    if waiting > OUTBOX_LAG:
        return Finding("outbox", False, detail, "is a relay running? 'idemctl outbox relay'")
    return Finding("outbox", True, detail)


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0].astimezone(UTC)  # type: ignore[no-any-return]


def _prefixed(columns: str, alias: str) -> str:
    return ", ".join(alias + c.strip() for c in columns.split(","))


_SERVER_BUSY = (
    "starting up", "shutting down", "in recovery", "too many clients", "slots are reserved",
    "not yet accepting connections", "not accepting connections",
)  # fmt: skip
"""What a server that refuses a connection for now (not for good) says."""
_REFUSED = ("FATAL:", "fe_sendauth", "SSL was required", "does not support SSL", "certificate")
"""A server's refusal (FATAL: ...), or libpq's own when the URL cannot satisfy the server."""


def _connect_error(exc: psycopg.OperationalError, url: str) -> ConfigError | StoreUnavailable:
    """A failed connection attempt as idemctl's error, with the server's (or libpq's) reason.

    The server answered and refused (FATAL: wrong password, no such database or role, no
    pg_hba.conf entry; or libpq found it wants a password the URL lacks): ConfigError. No
    answer (refused, timed out, unknown host) or a server busy starting, stopping or full:
    StoreUnavailable."""
    line = _first_line(exc)
    found = re.search(r"port \d+ failed: (.*)$", line)
    reason = " ".join((found.group(1) if found else line).split())
    refused = any(mark in reason for mark in _REFUSED) and not any(
        busy in reason for busy in _SERVER_BUSY
    )
    if refused:
        if "no password supplied" in reason:
            reason += " (the server wants a password and the URL has none)"
        return ConfigError(f"PostgreSQL at {url} refused the connection: {reason}")
    return StoreUnavailable(f"PostgreSQL at {url} is unreachable: {reason}")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


__all__ = ["PostgresStore", "Unit"]
