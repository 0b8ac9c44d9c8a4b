"""Provisioning PostgreSQL: the schema's migrations under a lock, its version, and doctor's
checks. A part of PostgresStore."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import psycopg

from idemctl.model import (
    Finding,
    Provisioning,
)
from idemctl.stores.postgres.core import PROVISION_LOCK_WAIT, _exists
from idemctl.stores.postgres.sql import (
    lock_wait,
    migrations,
    provision_lock,
)
from idemctl.stores.postgres.steps import PostgresSteps
from idemctl.stores.queries import server_clock_finding


class PostgresProvisioning(PostgresSteps):
    def provision(self, dry_run: bool = False, upto: int | None = None) -> Provisioning:
        steps = migrations(self.names)
        target = max(steps) if upto is None else upto
        table = self.names.version_table
        lock = provision_lock(self.names)
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
            with self.connection() as conn, conn.transaction():
                conn.execute(lock_wait(PROVISION_LOCK_WAIT))
                conn.execute(statements[0])
                if self.schema_version_on(conn) > current:  # another process provisioned meanwhile
                    return Provisioning([], changed=False, notes=["provisioned concurrently"])
                for statement in statements[1:]:
                    conn.execute(statement)
        return Provisioning(statements, changed=not dry_run, dry_run=dry_run)

    def schema_version_on(self, conn: psycopg.Connection[Any]) -> int:
        table = self.names.version_table
        if not _exists(conn, table):
            return 0
        row = conn.execute(self._sql["schema_version"]).fetchone()
        return int(row[0]) if row else 0

    def check(self) -> list[Finding]:
        started = time.perf_counter()
        with self.connection() as conn:
            row = conn.execute("SELECT current_setting('server_version'), now()").fetchone()
            latency = (time.perf_counter() - started) * 1000
            version_on = self.schema_version_on(conn)
        latest = max(migrations(self.names))
        assert row is not None
        server_version, server_now = row
        skew = (server_now - datetime.now(UTC)).total_seconds()
        return [
            Finding(
                "connection", True, f"PostgreSQL {server_version} at {self.url}, {latency:.1f} ms"
            ),
            Finding(
                "schema",
                version_on == latest,
                f"schema {self.schema!r} at version {version_on} of {latest}",
                None if version_on == latest else "run 'idemctl init'",
            ),
            server_clock_finding(skew),
        ]
