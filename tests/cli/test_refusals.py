"""Errors say what happened: a server that refuses the credentials or the database exits 2
as soon as it answers, with its reason; a port nobody listens on exits 3 at once.

Each store is a real server: a PostgreSQL cluster of this module's own that checks
passwords (the session's runs with trust auth), the session's trusting one for a missing
database, a redis-server with --requirepass, and a moto server with its IAM checks on (moto
otherwise accepts any credentials). Servers started here are stopped by PID.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import Result

from idemctl.cli.exitcodes import ExitCode
from tests.backends import unique_prefix, unique_schema, unique_table
from tests.cli.helpers import json_doc, messages, on
from tests.fixtures_redis import REDIS_PASSWORD
from tests.servers import (
    PG_OS_USER,
    PG_USER,
    MotoServer,
    PostgresServer,
    RedisServer,
    free_port,
)

PASSWORD = "Right-pw-4c1e"
WRONG = "Wr0ng-pw-9f3a"


def timed(url: str, *args: str) -> tuple[Result, float]:
    started = time.monotonic()
    result = on(url, *args)
    return result, time.monotonic() - started


def error_line(result: Result) -> str:
    lines = messages(result).strip().splitlines()
    assert lines and lines[-1].startswith("error: "), result.stdout + result.stderr
    return lines[-1]


# PostgreSQL --------------------------------------------------------------------------------


class PasswordPostgres(PostgresServer):
    """A PostgreSQL cluster that checks passwords (scram-sha-256) on TCP; its Unix socket
    trusts, to set the password."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.hba = self.home / "password_hba.conf"
        self.args = ("-c", f"hba_file={self.hba}")

    def _before_start(self) -> None:
        super()._before_start()
        self.hba.write_text("local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n")
        if self.as_root:
            shutil.chown(self.hba, PG_OS_USER, PG_OS_USER)

    def refusals(self) -> int:
        """How many password checks the server has refused so far (from its log)."""
        return self.log.read_text(errors="replace").count("password authentication failed")


@pytest.fixture(scope="module")
def password_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PasswordPostgres]:
    import psycopg

    server = PasswordPostgres(tmp_path_factory.mktemp("pg-password"))
    try:
        server.start()
        with psycopg.connect(
            host=str(server.home), port=server.port, user=PG_USER, dbname="postgres",
            autocommit=True,
        ) as conn:  # fmt: skip
            conn.execute(f"ALTER ROLE {PG_USER} PASSWORD '{PASSWORD}'")
        yield server
    finally:
        server.remove()


def test_postgres_refused_password_exits_2_at_once_with_the_servers_reason(
    password_postgres: PasswordPostgres,
) -> None:
    url = password_postgres.url(password=WRONG, schema=unique_schema())
    before = password_postgres.refusals()
    result, took = timed(url, "stats")
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert 'password authentication failed for user "test"' in line, line
    assert "postgresql://test:***@127.0.0.1:" in line
    assert WRONG not in result.stdout + result.stderr
    assert took < 3.0  # not the pool's 5 s connect timeout
    assert password_postgres.refusals() - before == 1  # tried once, not retried by the pool

    doctor = on(url, "doctor", "--json")
    assert doctor.exit_code == ExitCode.USAGE, doctor.stdout + doctor.stderr
    found = {f["name"]: f for f in json_doc(doctor, "doctor.schema.json")["findings"]}
    assert "password authentication failed" in found["credentials"]["detail"]
    assert "password" in found["credentials"]["fix"]

    no_password = password_postgres.url(schema=unique_schema())
    result = on(no_password, "list")
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    assert "the URL has none" in error_line(result)


def test_postgres_right_password_gets_in(password_postgres: PasswordPostgres) -> None:
    url = password_postgres.url(password=PASSWORD, schema=unique_schema())
    before = password_postgres.refusals()
    result = on(url, "stats")  # in, and finds no schema yet
    assert result.exit_code == ExitCode.NOT_PROVISIONED, result.stdout + result.stderr
    assert on(url, "init").exit_code == 0
    assert on(url, "stats").exit_code == 0
    assert password_postgres.refusals() == before


def test_postgres_missing_database_exits_2_naming_it(postgres_server: PostgresServer) -> None:
    url = postgres_server.url("no_such_db_7d2", schema=unique_schema())
    result, took = timed(url, "list")
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    assert 'database "no_such_db_7d2" does not exist' in error_line(result)
    assert took < 3.0


def test_postgres_refused_port_exits_3_at_once() -> None:
    url = f"postgresql://app:pw@127.0.0.1:{free_port()}/db"  # the default 5 s connect timeout
    result, took = timed(url, "list")
    assert result.exit_code == ExitCode.STORE_UNREACHABLE, result.stdout + result.stderr
    line = error_line(result)
    assert "unreachable" in line and "Connection refused" in line, line
    assert ":pw@" not in result.stderr
    assert took < 3.0


# Redis --------------------------------------------------------------------------------------


def test_redis_refused_password_exits_2_at_once(redis_with_password: RedisServer) -> None:
    server = redis_with_password
    port, query = server.port, f"prefix={unique_prefix()}"

    def connections() -> int:
        """Connections the server took so far (this question's own among them)."""
        stats = dict(
            line.split(":", 1) for line in server.cli("INFO", "stats").split() if ":" in line
        )
        return int(stats["total_connections_received"])

    wrong = f"redis://:{WRONG}@127.0.0.1:{port}/0?{query}"
    before = connections()
    result = on(wrong, "stats")
    assert connections() - before - 1 == 1  # one try, not retried: a wrong password stays wrong
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert "refused the credentials" in line and "invalid username-password pair" in line, line
    assert WRONG not in result.stdout + result.stderr

    before = connections()
    missing = on(f"redis://127.0.0.1:{port}/0?{query}", "list")
    assert connections() - before - 1 == 1
    assert missing.exit_code == ExitCode.USAGE, missing.stdout + missing.stderr
    assert "the URL has no password" in error_line(missing)

    right = on(f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0?{query}", "stats", "--json")
    assert right.exit_code == 0, right.stdout + right.stderr


def test_redis_refused_port_exits_3_at_once(redis_server: RedisServer) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    on(url, "list")  # the first run imports the driver: not timed
    for args in (["list"], ["stats"], ["unlock", "--stale", "--yes"]):
        result, took = timed(url, *args)
        assert result.exit_code == ExitCode.STORE_UNREACHABLE, result.stdout + result.stderr
        assert "Connection refused" in error_line(result)
        assert took < 3.0, args  # at once, not after the 5 s connect timeout


# DynamoDB -----------------------------------------------------------------------------------


class CheckingMoto(MotoServer):
    """moto with its IAM checks on: unknown credentials are refused, as AWS refuses them."""

    def _env(self) -> dict[str, str]:
        return {**super()._env(), "INITIAL_NO_AUTH_ACTION_COUNT": "0"}


@pytest.fixture(scope="module")
def checking_moto(
    tmp_path_factory: pytest.TempPathFactory, aws_credentials: None
) -> Iterator[CheckingMoto]:
    server = CheckingMoto(tmp_path_factory.mktemp("moto-iam"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def test_dynamodb_refused_credentials_exit_2_with_the_reason(checking_moto: CheckingMoto) -> None:
    url = checking_moto.url(unique_table())
    result = on(url, "stats")
    assert result.exit_code == ExitCode.USAGE, result.stdout + result.stderr
    line = error_line(result)
    assert "refused the request's credentials" in line, line
    assert "The security token included in the request is invalid" in line, line
    assert "<?xml" not in line
    doctor = on(url, "doctor", "--json")
    assert doctor.exit_code == ExitCode.USAGE, doctor.stdout + doctor.stderr
    found = {f["name"]: f for f in json_doc(doctor, "doctor.schema.json")["findings"]}
    assert "security token" in found["credentials"]["detail"]
    assert "AWS credentials" in found["credentials"]["fix"]


def test_dynamodb_refused_port_exits_3_at_once(aws_credentials: None) -> None:
    url = f"dynamodb://tbl?region=us-east-1&endpoint_url=http://127.0.0.1:{free_port()}"
    on(url, "list")  # the first run imports the driver: not timed
    result, took = timed(url, "list")
    assert result.exit_code == ExitCode.STORE_UNREACHABLE, result.stdout + result.stderr
    assert "unreachable" in error_line(result)
    # A bound that catches a hang through read timeouts, not speed: botocore's retries of a
    # refused connection took under 2 s with botocore 1.44 here, 3 s with 1.34 (the floor).
    assert took < 10.0
