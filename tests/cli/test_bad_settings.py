"""Bad settings are refused before anything is written: one line ``error: ...``, exit 2, no
traceback, and the store untouched (no SQLite file, no Redis key, no PostgreSQL schema, no
DynamoDB table). Each case is one a user hit: accepted before, then a traceback after the
store was provisioned, a lease of 0 two workers both held, a table made under another name.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.servers import MotoServer, PostgresServer, RedisServer

CONSUME = ["consume", "--handler", "handlers:handle", "--topic", "t", "--group", "g",
           "--brokers", "127.0.0.1:9", "--join-timeout", "2s"]  # fmt: skip


@dataclass
class Place:
    """Where a case's store lives, and whether anything was written there."""

    url: Callable[[str], str]
    """The store URL, with ``query`` (``&``-joined options) or a path of the case's."""
    untouched: Callable[[], bool]


def sqlite_place(tmp_path: Path) -> Place:
    db = tmp_path / "keys.db"
    return Place(lambda q: f"sqlite:///{db}" + (f"?{q}" if q else ""), lambda: not db.exists())


def redis_place(server: RedisServer) -> Place:
    prefix = f"t{uuid.uuid4().hex[:8]}:"

    def untouched() -> bool:
        with server.client() as client:
            return not list(client.scan_iter(match=f"{prefix}*"))

    return Place(lambda q: server.url(query=f"prefix={prefix}" + (f"&{q}" if q else "")), untouched)


def postgres_place(server: PostgresServer) -> Place:
    schema = f"t_{uuid.uuid4().hex[:12]}"

    def untouched() -> bool:
        with server.connect() as conn:
            row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
            return row.fetchone()[0] == 0  # type: ignore[index]

    def url(q: str) -> str:
        return server.url(schema=schema) + (f"&{q}" if q else "")

    return Place(url, untouched)


def dynamodb_place(server: MotoServer) -> Place:
    table = f"t-{uuid.uuid4().hex[:12]}"

    def untouched() -> bool:
        import boto3

        client = boto3.client("dynamodb", region_name="us-east-1", endpoint_url=server.endpoint_url)
        return table not in client.list_tables()["TableNames"]

    return Place(lambda q: server.url(table) + (f"&{q}" if q else ""), untouched)


# (store, command with {url}, what the error line says)
CASES: list[tuple[str, list[str], str]] = [
    (
        "sqlite",
        ["--store", "{url:lease=0}", "init"],
        "lease 0ms is out of range: use from 1ms to 7d",
    ),
    ("sqlite", ["--store", "{url:retention=0}", "init"], "retention 0ms is out of range"),
    ("sqlite", ["--store", "{url:lease=1e300}", "init"], "longer than 3650d"),
    ("sqlite", ["--store", "{url:busy_timeout=30d}", "init"], "out of range"),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--lease", "0"], "--lease 0ms is out of range"),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--lease", "99999999999d"], "longer than 3650d"),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--batch-size", "1000000000"], "at most 1000000"),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--batch-size", "0"], "at least 1"),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--metrics-port", "70000"], "port from 1 to 65535"),
    ("sqlite", ["--store", "{url:}", "purge", "--rate", "0"], "a rate is 1-1000000"),
    ("redis", ["--store", "{url:lease=0}", "init"], "lease 0ms is out of range"),
    ("redis", ["--store", "{url:socket_timeout=0}", "init"], "socket_timeout 0ms is out of range"),
    ("redis", ["--store", "{db:99}", "init"], "has no such database"),
    ("redis", ["--store", "{db:abc}", "init"], "the path is the database number, not 'abc'"),
    ("postgres", ["--store", "{url:lease=0}", "init"], "lease 0ms is out of range"),
    (
        "postgres",
        ["--store", "{url:pool_min=9&pool_max=2}", "init"],
        "pool_min=9 exceeds pool_max=2",
    ),
    ("postgres", ["--store", "{url:prefix=" + "p" * 56 + "}", "init"], "PostgreSQL cuts none"),
    ("postgres", ["--store", "{url:prefix=" + "p" * 63 + "}", "init"], "PostgreSQL cuts none"),
    ("postgres", ["--store", "{url:lock_timeout=0}", "init"], "lock_timeout 0ms is out of range"),
    ("postgres", ["--store", "{url:}", "outbox", "relay", "--metrics-port", "70000"], "1 to 65535"),
    (
        "postgres",
        ["--store", "{url:}", "outbox", "relay", "--delivery-timeout", "0"],
        "--delivery-timeout 0: must be more than 0",
    ),
    (
        "postgres",
        ["--store", "{url:}", "outbox", "replay", "--since", "1h", "--delivery-timeout", "0s"],
        "--delivery-timeout 0s: must be more than 0",
    ),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--concurrency", "0"], "--concurrency: "),
    ("sqlite", ["--store", "{url:}", *CONSUME, "--kafka-config", "acks"], "is not KEY=VALUE"),
    ("sqlite", ["--store", "{url:}", "list", "--stale", "--released"], "either stale or released"),
    ("dynamodb", ["--store", "{url:lease=0}", "init"], "lease 0ms is out of range"),
    ("dynamodb", ["--store", "{path:/../../other}", "init"], "nothing may follow the table name"),
    ("dynamodb", ["--store", "{url:read_timeout=0}", "init"], "read_timeout 0ms is out of range"),
]


def place_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if kind == "sqlite":
        return sqlite_place(tmp_path)
    if kind == "redis":
        return redis_place(request.getfixturevalue("redis_server"))
    if kind == "postgres":
        return postgres_place(request.getfixturevalue("postgres_server"))
    request.getfixturevalue("aws_credentials")
    return dynamodb_place(request.getfixturevalue("moto_server"))


def filled(arg: str, place: Place) -> str:
    if arg.startswith("{url:"):
        return place.url(arg[len("{url:") : -1])
    if arg.startswith("{db:"):  # a Redis URL with the case's database in the path
        return place.url("").replace("/0?", f"/{arg[len('{db:') : -1]}?")
    if arg.startswith("{path:"):  # a DynamoDB URL with a path after the table
        url = place.url("")
        table, query = url.split("?", 1)
        return f"{table}{arg[len('{path:') : -1]}?{query}"
    return arg


@pytest.mark.parametrize(
    ("kind", "args", "says"), CASES, ids=[f"{k}:{' '.join(a[2:])}"[:60] for k, a, _ in CASES]
)
def test_a_bad_setting_is_one_line_exit_2_and_writes_nothing(
    kind: str, args: list[str], says: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    place = place_of(kind, request, tmp_path)
    (tmp_path / "handlers.py").write_text("def handle(event):\n    return None\n")
    argv = [filled(a, place) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
    done = subprocess.run(
        [sys.executable, "-m", "idemctl", *argv],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = done.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert all(line == errors[0] or line.startswith("store: ") for line in lines), done.stderr
    assert place.untouched(), f"{kind}: something was written"


def test_every_case_names_a_store_this_file_knows() -> None:
    assert {kind for kind, _, _ in CASES} == {"sqlite", "redis", "postgres", "dynamodb"}


def test_a_metrics_port_already_taken_is_one_line_exit_2(tmp_path: Path) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    (tmp_path / "handlers.py").write_text("def handle(event):\n    return None\n")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "idemctl", "--store", f"sqlite:///{tmp_path}/k.db", *CONSUME,
             "--metrics-host", "127.0.0.1", "--metrics-port", str(port)],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )  # fmt: skip
    finally:
        taken.close()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"error: metrics: cannot listen on 127.0.0.1:{port}: Address already in use" in (
        done.stderr
    )


def ranged_options() -> list[tuple[list[str], str, float | None, float | None]]:
    """Every option of every command that has a range: (command path, option, min, max)."""
    import typer.main

    from idemctl.cli import app
    from idemctl.cli.lazy import load_all

    load_all()
    found = []

    def walk(command: Any, path: list[str]) -> None:
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            walk(sub, [*path, name])
        for param in command.params:
            if getattr(param, "count", False):  # -v, -vv: a counter takes no value
                continue
            kind = getattr(param, "type", None)  # click's IntRange; typer 0.29+ keeps min/max
            low = getattr(param, "min", getattr(kind, "min", None))
            high = getattr(param, "max", getattr(kind, "max", None))
            if low is not None or high is not None:
                found.append((path, param.opts[0], low, high))

    walk(typer.main.get_command(app), [])
    return found


RANGED = ranged_options()


def test_the_ranged_options_are_found() -> None:
    named = {(" ".join(path), option) for path, option, _, _ in RANGED}
    assert {("consume", "--concurrency"), ("consume", "--max-attempts"), ("audit", "--last")} <= (
        named
    )


@pytest.mark.parametrize(
    ("path", "option", "low", "high"), RANGED, ids=[f"{' '.join(p)} {o}" for p, o, _, _ in RANGED]
)
def test_every_option_out_of_its_range_is_one_line_exit_2(
    path: list[str], option: str, low: float | None, high: float | None, tmp_path: Path
) -> None:
    from tests.cli.helpers import run

    db = tmp_path / "keys.db"
    step = 1 if all(isinstance(b, int) for b in (low, high) if b is not None) else 0.5
    bounds = (None if low is None else low - step, None if high is None else high + step)
    outside = [v for v in bounds if v is not None]
    assert outside
    for value in outside:
        # The bad option first: click checks options in the order given, so it is judged
        # before a required option the command also lacks.
        result = run([*path, option, str(value), "--store", f"sqlite:///{db}"])
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code == 2, result.stderr
        assert len(lines) == 1 and lines[0].startswith(f"error: {option}: "), result.stderr
        assert not db.exists()
