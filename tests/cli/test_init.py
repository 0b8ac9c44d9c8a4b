"""`idemctl init` as a user runs it: a real subprocess, on the real stores."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg


def idemctl(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=cwd,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def schema_exists(server: Any, schema: str) -> bool:
    with psycopg.connect(server.dsn()) as conn:
        row = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone()
    return row is not None


def test_init_postgres_dry_run_then_twice(postgres_server: Any) -> None:
    schema = f"cli_{uuid.uuid4().hex[:8]}"
    url = postgres_server.url(schema=schema)

    dry = idemctl("--store", url, "init", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f'CREATE SCHEMA IF NOT EXISTS "{schema}";' in dry.stdout
    assert f'CREATE TABLE "{schema}"."keys"' in dry.stdout
    assert f'CREATE TABLE "{schema}"."outbox"' in dry.stdout
    assert "would run" in dry.stderr
    assert not schema_exists(postgres_server, schema)  # the dry run touched nothing

    first = idemctl("init", env={"IDEMCTL_STORE": url})
    assert first.returncode == 0, first.stderr
    assert "provisioned" in first.stderr
    assert schema_exists(postgres_server, schema)

    second = idemctl("--store", url, "init")
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stderr and "nothing changed" in second.stderr
    again = idemctl("--store", url, "init", "--dry-run")
    assert again.returncode == 0
    assert again.stdout.strip() == ""  # nothing left to run


def test_init_sqlite_default_store(tmp_path: Path) -> None:
    dry = idemctl("init", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "CREATE TABLE IF NOT EXISTS idem_keys" in dry.stdout
    assert list(tmp_path.iterdir()) == []  # no database file was created

    assert idemctl("init", cwd=tmp_path).returncode == 0
    assert (tmp_path / "idemctl.db").exists()
    second = idemctl("init", cwd=tmp_path)
    assert second.returncode == 0
    assert "nothing changed" in second.stderr


def test_init_unreachable_store_is_exit_3_without_the_password(tmp_path: Path) -> None:
    from tests.servers import free_port

    url = f"postgresql://app:s3cret-pw@127.0.0.1:{free_port()}/db?connect_timeout=1s"
    result = idemctl("--store", url, "init")
    assert result.returncode == 3
    assert "unreachable" in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert "app:***@127.0.0.1" in result.stderr.replace("\n", "")


def test_init_unknown_scheme_is_exit_2() -> None:
    result = idemctl("--store", "mongodb://localhost/x", "init")
    assert result.returncode == 2
    assert "unknown store scheme" in result.stderr
