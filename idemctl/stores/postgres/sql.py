"""The PostgreSQL store's SQL: the names of its tables and indexes (``names``), its schema
as migrations (schemas/postgres.sql) and the statements of the protocol.

Every identifier of a store's schema comes from ``names(schema, prefix)``: the store and
the outbox both take theirs from it."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any

from psycopg.sql import quote as quote_literal

from idemctl.errors import ConfigError
from idemctl.model import Entity, Record, Status
from idemctl.resources import read_resource

DEFAULT_SCHEMA = "idem"

COLUMNS = (
    "key, status::text, fingerprint, owner, fencing_token, attempts, lease_expires_at, "
    "created_at, updated_at, completed_at, expires_at, result, error, retriable"
)
"""A key's row as ``Record`` reads it."""

ENTITY_COLUMNS = (
    "entity, sequence, key, applied_at, holder, holder_token, lock_expires_at, updated_at, "
    "expires_at"
)
"""An entity's row (the sequence guard) as ``Entity`` reads it."""


def record_of(row: Sequence[Any]) -> Record:
    """A key's record from the columns of COLUMNS."""
    return Record(
        key=row[0],
        status=Status(row[1]),
        fingerprint=row[2],
        owner=row[3],
        fencing_token=row[4],
        attempts=row[5],
        lease_expires_at=maybe_utc(row[6]),
        created_at=row[7].astimezone(UTC),
        updated_at=row[8].astimezone(UTC),
        completed_at=maybe_utc(row[9]),
        expires_at=maybe_utc(row[10]),
        result=row[11],
        error=row[12],
        retriable=row[13],
    )


def entity_of(row: Sequence[Any]) -> Entity | None:
    """An entity from the columns of ENTITY_COLUMNS (None: an outer join found no row)."""
    if row[0] is None:
        return None
    return Entity(
        entity=row[0],
        sequence=row[1],
        key=row[2],
        applied_at=None if row[3] is None else utc(row[3]),
        holder=row[4],
        holder_token=row[5],
        lock_expires_at=None if row[6] is None else utc(row[6]),
        updated_at=utc(row[7]),
        expires_at=None if row[8] is None else utc(row[8]),
    )


def utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


def maybe_utc(value: datetime | None) -> datetime | None:
    return None if value is None else value.astimezone(UTC)


def quote_ident(name: str) -> str:
    """A SQL identifier, always quoted: any schema name or prefix is safe."""
    if not name or "\x00" in name:
        raise ConfigError(f"not a usable SQL identifier: {name!r}")
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Names:
    """Every identifier of one store's schema, quoted.

    The fields are the placeholders of schemas/postgres.sql (``{schema}``, ``{keys}``, ...);
    every table, type, constraint and index is named ``prefix`` + its field's name. The
    properties are the tables, schema-qualified, as statements name them."""

    schema: str
    schema_version: str
    status: str
    keys: str
    outbox: str
    keys_lease: str
    keys_expires: str
    keys_owner_in_progress: str
    outbox_unpublished: str
    outbox_created: str
    outbox_published: str
    outbox_notify: str
    entities: str
    entities_expires: str

    @property
    def version_table(self) -> str:
        return f"{self.schema}.{self.schema_version}"

    @property
    def keys_table(self) -> str:
        return f"{self.schema}.{self.keys}"

    @property
    def outbox_table(self) -> str:
        return f"{self.schema}.{self.outbox}"

    @property
    def entities_table(self) -> str:
        return f"{self.schema}.{self.entities}"

    def placeholders(self) -> dict[str, str]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


MAX_NAME = 62
"""Bytes in a name idemctl makes: PostgreSQL cuts identifiers at 63 bytes (cut names
collide: "type ... already exists"), and names a table's array type '_' + the table's."""


def names(schema: str = DEFAULT_SCHEMA, prefix: str = "") -> Names:
    """The names of the store at ``postgresql://...?schema=&prefix=``; ConfigError when the
    schema or prefix cannot make an identifier, or makes one PostgreSQL would cut."""
    longest = max((f.name for f in fields(Names) if f.name != "schema"), key=len)
    if len(schema.encode()) > MAX_NAME + 1:
        raise ConfigError(
            f"PostgreSQL schema {schema!r} is {len(schema.encode())} bytes: at most "
            f"{MAX_NAME + 1} (PostgreSQL cuts longer names)"
        )
    if len((prefix + longest).encode()) > MAX_NAME:
        raise ConfigError(
            f"PostgreSQL prefix {prefix!r} is {len(prefix.encode())} bytes: at most "
            f"{MAX_NAME - len(longest)}, so that every name it starts ({prefix + longest!r} "
            f"the longest) stays within {MAX_NAME} bytes and PostgreSQL cuts none"
        )
    return Names(
        quote_ident(schema),
        **{f.name: quote_ident(prefix + f.name) for f in fields(Names) if f.name != "schema"},
    )


def migrations(names: Names) -> dict[int, list[str]]:
    """The statements of each migration in schemas/postgres.sql, identifiers substituted."""
    text = read_resource("schemas", "postgres.sql")
    placeholders = names.placeholders()
    found: dict[int, list[str]] = {}
    for part in re.split(r"^-- migration (\d+)[^\n]*\n", text, flags=re.M)[1:]:
        if part.isdigit():
            version = int(part)
            continue
        body = "\n".join(line for line in part.splitlines() if not line.startswith("--"))
        body = re.sub(r"\{(\w+)\}", lambda m: placeholders[m.group(1)], body)
        found[version] = [s.strip() for s in body.split(";\n") if s.strip().rstrip(";")]
    return found


def provision_lock(names: Names) -> str:
    """The statement that makes provisioners of one schema wait for each other."""
    return (
        "SELECT pg_advisory_xact_lock(hashtextextended("
        + quote_literal(f"idemctl provision {names.schema}")
        + ", 0))"
    )


def lock_wait(seconds: float) -> str:
    """The statement that lets this transaction wait ``seconds`` for a row lock."""
    return f"SET LOCAL lock_timeout = {round(seconds * 1000)}"


def prefixed(columns: str, alias: str) -> str:
    return ", ".join(alias + c.strip() for c in columns.split(","))


def keys_channel(names: Names) -> str:
    """The channel complete, fail and release notify with the key (waiters LISTEN on it,
    ``wait=``): at most 45 bytes, within PostgreSQL's 63 whatever the names."""
    return "idemctl_keys_" + hashlib.md5(names.keys_table.encode()).hexdigest()  # noqa: S324 - a name, not a secret


def protocol_statements(names: Names) -> dict[str, str]:
    """The protocol's statements on the keys table (and the entities table's), by name.
    complete, fail and release tell the key's waiters from the same statement: a
    ``pg_notify`` per row they return, delivered when the transaction commits."""
    # complete, fail, extend and release match the owner, not the status: an owner is set
    # only while in progress (a CHECK constraint), and a status condition would let the
    # planner prefer the partial lease index, whose dead entries grow with every completion.
    t = names.keys_table
    live = "(k.expires_at IS NULL OR k.expires_at > now())"
    wake = f"pg_notify('{keys_channel(names)}', k.key)"
    complete_batch = f"""
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
    # A key with no row starts its fencing counter at the clock in microseconds (not now():
    # the transaction's start), above every token of a deleted earlier life of the key.
    first_fence = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    insert = f"""INSERT INTO {t} AS k (key, status, fingerprint, owner, fencing_token, attempts,
                          lease_expires_at, created_at, updated_at)"""
    upsert = """ON CONFLICT (key) DO UPDATE SET
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
                OR (k.status = 'failed' AND k.retriable)))"""

    def claim(req: str, old: str) -> str:
        """The claim of the keys ``req`` selects (key, fingerprint, owner), whose rows ``old``
        selects: a row per key, its claim's columns or NULLs, then its row as it was."""
        return f"""
WITH req AS ({req}), old AS ({old}), claimed AS (
    {insert}
    SELECT key, 'in_progress', fingerprint, owner, {first_fence}, 1,
           now() + %(lease)s * interval '1 second', now(), now()
    FROM req ORDER BY key
    {upsert}
    RETURNING k.key, k.fencing_token, k.attempts, k.lease_expires_at
)
SELECT req.key, c.fencing_token, c.attempts, c.lease_expires_at,
       coalesce(o.status = 'in_progress' AND (o.expires_at IS NULL OR o.expires_at > now()),
                false) AS takeover,
       o.key, o.status::text, o.fingerprint, o.owner, o.fencing_token, o.attempts,
       o.lease_expires_at, o.created_at, o.updated_at, o.completed_at, o.expires_at,
       o.result, o.error, o.retriable, now()
FROM req LEFT JOIN claimed c USING (key) LEFT JOIN old o USING (key)"""

    complete_one = f"""
UPDATE {t} k SET status = 'completed', owner = NULL, lease_expires_at = NULL,
    updated_at = now(), completed_at = now(),
    expires_at = now() + %(retention)s * interval '1 second',
    result = %(result)s::jsonb, error = NULL, retriable = false
WHERE k.key = %(key)s AND k.owner = %(owner)s AND k.fencing_token = %(token)s
RETURNING {prefixed(COLUMNS, "k.")}, {wake}"""
    return {
        # One key (the library's path): the same answer as "claim" gives, from scalar
        # parameters, so that its plan can be kept (``flows.Statement.prepare``).
        "claim_one": claim(
            req="SELECT %(key)s::text AS key, %(fp)s::text AS fingerprint, "
            "%(owner)s::text AS owner",
            old=f"SELECT k.* FROM {t} k WHERE k.key = %(key)s",
        ),
        "complete_one": complete_one,
        "claim": claim(
            req="SELECT * FROM unnest(%(keys)s::text[], %(fps)s::text[], %(owners)s::text[]) "
            "AS r(key, fingerprint, owner)",
            old=f"SELECT k.* FROM {t} k JOIN req USING (key)",
        ),
        "complete_keys": f"{complete_batch}\nRETURNING k.key, {wake}",
        "fail": f"""
UPDATE {t} k SET status = 'failed', owner = NULL, lease_expires_at = NULL, updated_at = now(),
    expires_at = now() + %(retention)s * interval '1 second', error = %(error)s,
    retriable = %(retriable)s
WHERE k.key = %(key)s AND k.owner = %(owner)s
  AND k.fencing_token = %(token)s
RETURNING {prefixed(COLUMNS, "k.")}, {wake}""",
        "extend": f"""
UPDATE {t} k SET lease_expires_at = now() + %(lease)s * interval '1 second', updated_at = now()
WHERE k.key = %(key)s AND k.owner = %(owner)s
  AND k.fencing_token = %(token)s
RETURNING {prefixed(COLUMNS, "k.")}""",
        "release": f"""
UPDATE {t} k SET owner = NULL, lease_expires_at = now(), updated_at = now(),
    attempts = greatest(k.attempts - %(unrun)s, 0)
WHERE k.key = %(key)s AND k.owner = %(owner)s
  AND k.fencing_token = %(token)s
RETURNING {prefixed(COLUMNS, "k.")}, {wake}""",
        "get": f"SELECT {prefixed(COLUMNS, 'k.')} FROM {t} k WHERE k.key = %(key)s AND {live}",
        "get_many": (
            f"SELECT {prefixed(COLUMNS, 'k.')} FROM {t} k WHERE k.key = ANY(%(keys)s) AND {live}"
        ),
        "get_any": f"SELECT {COLUMNS} FROM {t} WHERE key = %(key)s",
        "lock": f"SELECT {COLUMNS} FROM {t} WHERE key = %(key)s FOR UPDATE",
        "now": "SELECT now()",
        # Transactional mode: a transaction-level advisory lock on a name, if nobody holds it.
        "try_lock": "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
        "schema_version": f"SELECT coalesce(max(version), 0) FROM {names.version_table}",
        **entity_statements(names),
    }


def entity_statements(names: Names) -> dict[str, str]:
    """The sequence guard's statements on the entities table, by name: the rules of
    ``machine.decide_guard`` and ``machine.decide_settle``, on the server's clock."""
    t = names.entities_table
    over = "e.expires_at <= now()"  # past retention: as if never seen (NULL: never)
    return {
        # GO writes the hold; STALE and BUSY write nothing. The WHERE is decide_guard's GO,
        # judged on the row's latest version; the caller judges the rows it did not write
        # from the snapshot's version (the outer join) and asks again if they disagree.
        "guard": f"""
WITH req AS (
    SELECT * FROM unnest(%(entities)s::text[], %(sequences)s::bigint[], %(keys)s::text[],
                         %(tokens)s::bigint[]) AS r(entity, sequence, key, token)
), went AS (
    INSERT INTO {t} AS e (entity, sequence, key, applied_at, holder, holder_token,
                          lock_expires_at, updated_at, expires_at)
    SELECT entity, NULL, NULL, NULL, key, token, now() + %(lease)s * interval '1 second',
           now(), now() + (%(lease)s + %(retention)s) * interval '1 second'
    FROM req ORDER BY entity
    ON CONFLICT (entity) DO UPDATE SET
        sequence = CASE WHEN {over} THEN NULL ELSE e.sequence END,
        key = CASE WHEN {over} THEN NULL ELSE e.key END,
        applied_at = CASE WHEN {over} THEN NULL ELSE e.applied_at END,
        holder = excluded.holder,
        holder_token = excluded.holder_token,
        lock_expires_at = excluded.lock_expires_at,
        updated_at = now(),
        expires_at = excluded.expires_at
    WHERE coalesce({over}, false)
       OR NOT (coalesce((SELECT r.sequence FROM req r WHERE r.entity = e.entity) <= e.sequence,
                        false)
               OR (e.holder IS NOT NULL AND coalesce(e.lock_expires_at > now(), false)
                   AND (e.holder <> excluded.holder
                        OR coalesce(e.holder_token, 0) > excluded.holder_token)))
    RETURNING e.entity, e.sequence
)
SELECT req.entity, w.entity IS NOT NULL, w.sequence, {prefixed(ENTITY_COLUMNS, "o.")}, now()
FROM req LEFT JOIN went w USING (entity) LEFT JOIN {t} o ON o.entity = req.entity""",
        # Fenced like complete: the holder's key and token, also after its lock expired.
        "settle": f"""
WITH req AS (
    SELECT * FROM unnest(%(entities)s::text[], %(sequences)s::bigint[], %(keys)s::text[],
                         %(tokens)s::bigint[], %(applied)s::boolean[])
        AS r(entity, sequence, key, token, applied)
)
UPDATE {t} e SET
    sequence = CASE WHEN req.applied AND (e.sequence IS NULL OR req.sequence > e.sequence)
                    THEN req.sequence ELSE e.sequence END,
    key = CASE WHEN req.applied AND (e.sequence IS NULL OR req.sequence > e.sequence)
               THEN req.key ELSE e.key END,
    applied_at = CASE WHEN req.applied AND (e.sequence IS NULL OR req.sequence > e.sequence)
                      THEN now() ELSE e.applied_at END,
    holder = NULL, holder_token = NULL, lock_expires_at = NULL, updated_at = now(),
    expires_at = CASE WHEN req.applied THEN now() + %(retention)s * interval '1 second'
                      ELSE e.expires_at END
FROM req
WHERE e.entity = req.entity AND (e.expires_at IS NULL OR e.expires_at > now())
  AND e.holder = req.key AND e.holder_token = req.token
RETURNING e.entity""",
        "get_entity": f"SELECT {ENTITY_COLUMNS} FROM {t} e WHERE e.entity = %(entity)s "
        "AND (e.expires_at IS NULL OR e.expires_at > now())",
        "read_entity": f"SELECT {ENTITY_COLUMNS}, now() FROM {t} WHERE entity = %(entity)s",
        "lock_entity": f"SELECT {ENTITY_COLUMNS}, now() FROM {t} WHERE entity = %(entity)s "
        "FOR UPDATE",
        # Transactional mode: the entity's row, made if missing (a row past retention, so as
        # if never seen: it only commits once complete() advanced it), locked at once or not.
        "make_entity": f"INSERT INTO {t} (entity, updated_at, expires_at) "
        "VALUES (%(entity)s, now(), now()) ON CONFLICT (entity) DO NOTHING",
        "lock_entity_nowait": f"SELECT {ENTITY_COLUMNS}, now() FROM {t} "
        "WHERE entity = %(entity)s FOR UPDATE NOWAIT",
        "advance_entity": f"""
UPDATE {t} SET sequence = %(sequence)s, key = %(key)s, applied_at = now(), holder = NULL,
    holder_token = NULL, lock_expires_at = NULL, updated_at = now(),
    expires_at = now() + %(retention)s * interval '1 second'
WHERE entity = %(entity)s""",
    }
