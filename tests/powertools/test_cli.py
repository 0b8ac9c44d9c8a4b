"""The ``idemctl`` CLI on Powertools tables (``--store URL?layout=powertools``), in-process
through typer's CliRunner (tests/cli/helpers.py), and once as the installed ``idemctl``
binary: the records are Powertools' own (tests/powertools/writers.py), and each repair is
checked against Powertools' next call of the payload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from idemctl.cli.exitcodes import ExitCode
from tests.backends import unique_table
from tests.cli.helpers import json_doc, json_lines, messages, next_cursor, on, run
from tests.powertools.conftest import LAYOUTS, PtTable, dynamodb_table, enable_ttl
from tests.powertools.states import ALL, STALE_MS, build
from tests.powertools.writers import call, function_name, key_of
from tests.servers import MotoServer

RECORD = "powertools-record.schema.json"
STATS = "powertools-stats.schema.json"
ACTION = "action.schema.json"
BINARY = Path(sys.executable).parent / "idemctl"


@pytest.fixture(params=["single", "redis"])
def cli_table(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PtTable]:
    """A Powertools table on DynamoDB (Powertools' defaults) and on Redis."""
    if request.param == "redis":
        yield request.getfixturevalue("redis_pt")
        return
    table = dynamodb_table(request.getfixturevalue("moto_server"), tmp_path, "single", {})
    try:
        yield table
    finally:
        table.close()


def keep_on_redis(table: PtTable, request: pytest.FixtureRequest) -> Any:
    """PERSIST for the expired record on Redis (else its TTL deletes it at expiration)."""
    if table.name != "redis":
        return None
    return request.getfixturevalue("redis_client").persist


def listed(url: str, *args: str) -> dict[str, str]:
    """``list --json --limit 0 ARGS``: {key: state}, each line checked against its schema."""
    result = on(url, "list", "--json", "--limit", "0", *args)
    assert result.exit_code == 0, result.stderr
    assert next_cursor(result) is None
    docs = json_lines(result, RECORD)
    keys = [d["key"] for d in docs]
    assert keys == sorted(keys)
    return {d["key"]: d["state"] for d in docs}


# Looking ---------------------------------------------------------------------------------------


def test_stats_list_inspect_and_purge(
    cli_table: PtTable, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    scenario = build(cli_table, tmp_path, kill=False, keep=keep_on_redis(cli_table, request))
    url, keys = cli_table.url, scenario.keys

    result = on(url, "stats", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, STATS)
    assert doc["by_state"] == {**dict.fromkeys(ALL, 1), "invalid": 0}
    assert doc["total"] == 5
    assert doc["layout"] == "powertools"
    text = on(url, "stats")
    assert text.exit_code == 0, text.stderr
    for state in ALL:
        assert any(line.split() == [state, "1"] for line in text.stdout.splitlines()), state

    live = {keys[s]: s for s in ALL if s != "expired"}
    assert listed(url) == live
    assert listed(url, "--stale") == {keys["stale"]: "stale"}
    assert listed(url, "--blocked") == {keys["blocked"]: "blocked"}
    assert listed(url, "--stale", "--blocked") == {
        keys["stale"]: "stale",
        keys["blocked"]: "blocked",
    }
    assert listed(url, "--status", "completed") == {keys["completed"]: "completed"}
    assert listed(url, "--status", "in_progress") == {
        keys[s]: s for s in ("in_progress", "stale", "blocked")
    }
    table = on(url, "list")
    assert table.exit_code == 0, table.stderr
    for key, state in live.items():
        assert any(key in line and state in line for line in table.stdout.splitlines()), key

    for state, key in keys.items():
        result = on(url, "inspect", key, "--json")
        assert result.exit_code == 0, result.stderr
        doc = json_doc(result, RECORD)
        assert (doc["key"], doc["state"]) == (key, state)
        assert doc["partition"] is None
        text = on(url, "inspect", key)
        assert text.exit_code == 0, text.stderr
        assert key in text.stdout
        assert any(line.split()[:2] == ["state", state] for line in text.stdout.splitlines())
    assert on(url, "inspect", key_of(cli_table.job({"order_id": "never"}))).exit_code == 5

    result = on(url, "purge", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert json_doc(result, ACTION)["count"] == 1
    assert cli_table.raw(keys["expired"]) is not None
    result = on(url, "purge", "--yes", "--json", "--rate", "1000")  # --rate applies here too
    assert result.exit_code == 0, result.stderr
    assert json_doc(result, ACTION)["count"] == 1
    assert cli_table.raw(keys["expired"]) is None
    assert all(cli_table.raw(k) is not None for s, k in keys.items() if s != "expired")


def test_list_pages(cli_table: PtTable) -> None:
    jobs = [cli_table.job({"n": i}) for i in range(5)]
    for job in jobs:
        assert call(job).kind == "ran"
    keys = sorted(key_of(j) for j in jobs)
    result = on(cli_table.url, "list", "--json", "--limit", "2")
    assert result.exit_code == 0, result.stderr
    assert [d["key"] for d in json_lines(result, RECORD)] == keys[:2]
    cursor = next_cursor(result)
    assert cursor is not None
    result = on(cli_table.url, "list", "--json", "--limit", "0", "--cursor", cursor)
    assert [d["key"] for d in json_lines(result, RECORD)] == keys[2:]
    assert next_cursor(result) is None

    prefixed = cli_table.job({"n": 0}, key_prefix="refunds")
    assert call(prefixed).kind == "ran"
    assert listed(cli_table.url, "--prefix", "refunds#") == {key_of(prefixed): "completed"}
    assert len(listed(cli_table.url)) == 6


def test_sort_key_table(moto_server: MotoServer, tmp_path: Path) -> None:
    table = dynamodb_table(moto_server, tmp_path, "sort", LAYOUTS["sort"])
    try:
        job = table.job({"order_id": "o-1"})
        assert call(job).kind == "ran"
        key = key_of(job)
        result = on(table.url, "inspect", key, "--json")
        assert result.exit_code == 0, result.stderr
        assert json_doc(result, RECORD)["partition"] == "idempotency#orders"

        every = moto_server.url(table.store.table, layout="powertools", sort_key_attr="sk")
        assert listed(every) == {key: "completed"}
        result = on(every, "stats", "--json")
        assert json_doc(result, STATS)["by_state"]["completed"] == 1
        for args in (["inspect", key], ["unlock", key, "--force"], ["forget", key]):
            result = on(every, *args)
            assert result.exit_code == ExitCode.USAGE, (args, result.stdout, result.stderr)
            assert "static_pk_value" in messages(result)
        assert table.raw(key) is not None
    finally:
        table.close()


# Repairing -------------------------------------------------------------------------------------


def test_unlock_stale(cli_table: PtTable, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """``unlock --stale`` asks first (two records), then deletes exactly the stale ones;
    Powertools' next call of each runs the function once and completes."""
    second = cli_table.job({"order_id": "second-stale"}, remaining_ms=STALE_MS)
    assert call(replace(second, mode="crash")).kind == "crashed"
    past_ms = int(time.time() * 1000) - 10_000
    cli_table.backdate(key_of(second), **{cli_table.attr("in_progress_expiry_attr"): past_ms})
    scenario = build(
        cli_table, tmp_path, ("completed", "in_progress", "stale", "blocked"), kill=False
    )
    stale = sorted([scenario.keys["stale"], key_of(second)])
    before = {k: cli_table.raw(k) for k in [*scenario.keys.values(), key_of(second)]}

    result = on(cli_table.url, "unlock", "--stale", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    assert sorted(json_doc(result, ACTION)["keys"]) == stale
    result = on(cli_table.url, "unlock", "--stale", "--older-than", "1h", "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    assert json_doc(result, ACTION)["count"] == 0
    result = on(cli_table.url, "unlock", "--stale", input="n\n")
    assert result.exit_code == ExitCode.REFUSED, result.stderr
    assert {k: cli_table.raw(k) for k in before} == before

    result = on(cli_table.url, "unlock", "--stale", "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, ACTION)
    assert (doc["action"], doc["dry_run"], sorted(doc["keys"]), doc["count"]) == (
        "unlock",
        False,
        stale,
        2,
    )
    for key, was in before.items():
        assert cli_table.raw(key) == (None if key in stale else was), key
    result = on(cli_table.url, "unlock", "--stale", "--yes", "--json")
    assert json_doc(result, ACTION)["count"] == 0

    for job in (scenario.jobs["stale"], second):
        runs = cli_table.runs(job.payload)
        assert call(job).kind == "ran"
        assert call(job).kind == "replayed"
        assert cli_table.runs(job.payload) == runs + 1
    assert listed(cli_table.url, "--status", "completed") == {
        k: "completed" for k in [scenario.keys["completed"], *stale]
    }


def test_unlock_blocked_needs_force(cli_table: PtTable, tmp_path: Path) -> None:
    scenario = build(cli_table, tmp_path, ("blocked",), kill=False)
    key, job = scenario.keys["blocked"], scenario.jobs["blocked"]
    before = cli_table.raw(key)

    result = on(cli_table.url, "unlock", key)
    assert result.exit_code == ExitCode.REFUSED, result.stdout
    assert "blocked" in messages(result)
    assert before is not None
    expiration = datetime.fromtimestamp(int(before[cli_table.attr("expiry_attr")]), UTC)
    for part in ("%Y-%m-%d", "%H:%M:%S"):  # blocked until its expiration
        assert expiration.strftime(part) in messages(result)
    assert cli_table.raw(key) == before
    assert on(cli_table.url, "unlock", "--stale", "--yes").exit_code == 0
    assert cli_table.raw(key) == before
    result = on(cli_table.url, "unlock", key, "--force", "--dry-run", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, ACTION)
    assert doc["dry_run"] is True and doc["record"]["state"] == "blocked"
    assert cli_table.raw(key) == before
    assert call(job).kind == "in_progress"

    runs = scenario.runs("blocked")
    result = on(cli_table.url, "unlock", key, "--force", "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, ACTION)
    assert (doc["keys"], doc["record"]["state"]) == ([key], "blocked")
    assert cli_table.raw(key) is None
    assert call(job).kind == "ran"
    assert scenario.runs("blocked") == runs + 1
    assert call(job).kind == "replayed"
    assert scenario.runs("blocked") == runs + 1
    done = cli_table.raw(key)
    assert done is not None and done[cli_table.attr("status_attr")] == "COMPLETED"


def test_unlock_live_needs_force(cli_table: PtTable, tmp_path: Path) -> None:
    scenario = build(cli_table, tmp_path, ("in_progress", "completed"), kill=False)
    key = scenario.keys["in_progress"]
    before = cli_table.raw(key)
    result = on(cli_table.url, "unlock", key)
    assert result.exit_code == ExitCode.REFUSED
    assert "live" in messages(result)
    assert cli_table.raw(key) == before
    assert on(cli_table.url, "unlock", key, "--dry-run").exit_code == ExitCode.REFUSED
    result = on(cli_table.url, "unlock", key, "--dry-run", "--force")
    assert result.exit_code == 0, result.stderr
    assert cli_table.raw(key) == before
    result = on(cli_table.url, "unlock", scenario.keys["completed"])
    assert result.exit_code == ExitCode.REFUSED
    assert "forget" in messages(result)
    assert on(cli_table.url, "unlock", key_of(cli_table.job({"x": 1}))).exit_code == 5

    result = on(cli_table.url, "unlock", key, "--force")
    assert result.exit_code == 0, result.stderr
    assert key in result.stdout
    assert cli_table.raw(key) is None
    assert cli_table.raw(scenario.keys["completed"]) is not None


def test_forget(cli_table: PtTable, tmp_path: Path) -> None:
    scenario = build(cli_table, tmp_path, ("completed", "in_progress"), kill=False)
    done, job = scenario.keys["completed"], scenario.jobs["completed"]
    held = scenario.keys["in_progress"]

    result = on(cli_table.url, "forget", held)
    assert result.exit_code == ExitCode.REFUSED
    assert cli_table.raw(held) is not None
    result = on(cli_table.url, "forget", done, "--dry-run")
    assert result.exit_code == 0, result.stderr
    assert cli_table.raw(done) is not None

    result = on(cli_table.url, "forget", done, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json_doc(result, ACTION)
    assert (doc["action"], doc["keys"], doc["record"]["state"]) == ("forget", [done], "completed")
    assert cli_table.raw(done) is None
    runs = scenario.runs("completed")
    assert call(job).kind == "ran"
    assert call(job).kind == "replayed"
    assert scenario.runs("completed") == runs + 1
    assert on(cli_table.url, "forget", key_of(cli_table.job({"x": 1}))).exit_code == 5

    assert on(cli_table.url, "forget", held, "--force").exit_code == 0
    assert cli_table.raw(held) is None


def test_the_installed_binary(single: PtTable, tmp_path: Path) -> None:
    """``idemctl`` as an operator runs it: a blocked record refused (exit 6), then freed
    with --force; Powertools then runs the function once."""
    scenario = build(single, tmp_path, ("blocked",))  # left by a SIGKILLed writer
    key, job = scenario.keys["blocked"], scenario.jobs["blocked"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}

    def idemctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BINARY), "--store", single.url, *args],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    refused = idemctl("unlock", key)
    assert refused.returncode == ExitCode.REFUSED, refused.stderr
    assert single.raw(key) is not None
    freed = idemctl("unlock", key, "--force")
    assert freed.returncode == 0, freed.stderr
    assert single.raw(key) is None
    runs = scenario.runs("blocked")
    assert call(job).kind == "ran"
    assert scenario.runs("blocked") == runs + 1


# doctor ----------------------------------------------------------------------------------------


def test_doctor(single: PtTable, moto_server: MotoServer, tmp_path: Path) -> None:
    enable_ttl(moto_server, single)
    assert call(single.job({"n": 1})).kind == "ran"
    result = on(single.url, "doctor", "--json")
    assert result.exit_code == 0, result.stdout
    doc = json.loads(result.stdout)
    assert doc["ok"] is True
    assert [f for f in doc["findings"] if f.get("level", "ok") != "ok"] == []

    unwatched = dynamodb_table(moto_server, tmp_path, "single", {})  # no TTL
    try:
        scenario = build(unwatched, tmp_path, ("completed", "blocked"), kill=False)
        result = on(unwatched.url, "doctor", "--json")
        assert result.exit_code == 0, result.stdout  # warnings do not fail doctor
        doc = json.loads(result.stdout)
        warned = [f for f in doc["findings"] if f.get("level") == "warn"]
        text = json.dumps(warned).lower()
        assert "ttl" in text
        assert "blocked" in text
        assert scenario.keys["blocked"] in json.dumps(warned)
        result = on(unwatched.url, "doctor")
        assert result.exit_code == 0
        assert "blocked" in result.stdout.lower()
    finally:
        unwatched.close()


def test_missing_table(moto_server: MotoServer) -> None:
    """idemctl never creates Powertools' tables: a missing one is exit 4 everywhere, and
    doctor does not send the operator to ``idemctl init`` (refused on this layout)."""
    url = moto_server.url(unique_table(), layout="powertools")
    for args in (["stats"], ["list"], ["unlock", "--stale", "--yes"], ["doctor"]):
        result = on(url, *args)
        assert result.exit_code == ExitCode.NOT_PROVISIONED, (args, result.stdout)
        assert "does not exist" in result.stdout + result.stderr
        assert "idemctl init" not in result.stdout + result.stderr, args
    assert on(url, "init").exit_code == ExitCode.USAGE


def test_doctor_on_redis(redis_pt: PtTable, tmp_path: Path) -> None:
    assert call(redis_pt.job({"n": 1})).kind == "ran"
    result = on(redis_pt.url, "doctor", "--json")
    assert result.exit_code == 0, result.stdout
    assert json.loads(result.stdout)["ok"] is True
    scenario = build(redis_pt, tmp_path, ("blocked",), kill=False)
    result = on(redis_pt.url, "doctor", "--json")
    assert result.exit_code == 0, result.stdout
    warned = [f for f in json.loads(result.stdout)["findings"] if f.get("level") == "warn"]
    assert scenario.keys["blocked"] in json.dumps(warned)


# Refusals --------------------------------------------------------------------------------------

CONSUME = ["consume", "--handler", "tests.powertools.writers:consumer_handler", "--topic", "t",
           "--group", "g", "--brokers", "127.0.0.1:9", "--join-timeout", "2s"]  # fmt: skip


OWN_PROTOCOL = {
    "init": ["init"],
    "consume": CONSUME,
    "outbox relay": ["outbox", "relay", "--brokers", "127.0.0.1:9"],
}
"""Commands of idemctl's own protocol; the brokers are unreachable: the store URL is
refused before Kafka is tried."""


@pytest.mark.parametrize("command", sorted(OWN_PROTOCOL))
def test_own_protocol_is_refused(cli_table: PtTable, command: str) -> None:
    result = on(cli_table.url, *OWN_PROTOCOL[command])
    assert result.exit_code == ExitCode.USAGE, (result.stdout, result.stderr)
    assert "powertools" in result.stderr.lower()


def test_verify_is_refused_before_kafka(single: PtTable) -> None:
    """verify would write scratch keys into the store: its URL is refused first (exit 2),
    not after the unreachable brokers' timeout (exit 7)."""
    result = on(single.url, "verify", "--brokers", "127.0.0.1:9", "--timeout", "5s")
    assert result.exit_code == ExitCode.USAGE, (result.stdout, result.stderr)
    assert "powertools" in result.stderr.lower()


@pytest.mark.parametrize(
    "args",
    [
        ["list", "--entities"],
        ["list", "--released"],
        ["list", "--older-than", "1m"],
        ["stats", "--exact"],
        ["inspect", "--entity", "e-1"],
        ["forget", "--entity", "e-1"],
    ],
    ids=" ".join,
)
def test_options_of_idemctls_own_layout_are_usage_errors(single: PtTable, args: list[str]) -> None:
    result = on(single.url, *args)
    assert result.exit_code == ExitCode.USAGE, (result.stdout, result.stderr)
    # operate names what the option means (older_than); the CLI spells it as its flag
    assert f"error: {args[1]}: does not apply" in result.stderr, result.stderr


def test_redis_lock_keys(redis_pt: PtTable, redis_client: Any) -> None:
    """Powertools' ``KEY:lock`` keys: never listed, counted or deleted by the CLI."""
    jobs = [redis_pt.job({"order_id": n}, remaining_ms=STALE_MS) for n in ("a", "b")]
    for job in jobs:
        assert call(replace(job, mode="crash")).kind == "crashed"
    lock = key_of(jobs[1]) + ":lock"
    assert redis_client.set(lock, "True", ex=10, nx=True)  # as Powertools' _acquire_lock
    # Powertools' expiry is the wall clock's: the crashed jobs' expiries are moved past it
    past_ms = int(time.time() * 1000) - 10_000
    for job in jobs:
        redis_pt.backdate(key_of(job), in_progress_expiration=past_ms)
    stale = {key_of(j): "stale" for j in jobs}
    assert listed(redis_pt.url, "--stale") == stale
    result = on(redis_pt.url, "stats", "--json")
    doc = json_doc(result, STATS)
    assert (doc["total"], doc["skipped"]) == (2, 0)
    result = on(redis_pt.url, "unlock", "--stale", "--yes", "--json")
    assert result.exit_code == 0, result.stderr
    assert sorted(json_doc(result, ACTION)["keys"]) == sorted(key_of(j) for j in jobs)
    assert on(redis_pt.url, "purge", "--yes").exit_code == 0
    for args in (["unlock", lock, "--force"], ["forget", lock, "--force"]):
        assert on(redis_pt.url, *args).exit_code != 0
    assert redis_client.keys("*") == [lock]


# idemctl powertools key --------------------------------------------------------------------


def test_powertools_key_command(redis_pt: PtTable, redis_client: Any, tmp_path: Path) -> None:
    payload = {"body": json.dumps({"order_id": "o-9"}), "id": 3}
    options = {"event_key_jmespath": "powertools_json(body).order_id", "hash_function": "sha256"}
    job = redis_pt.job(payload, **options)
    assert call(job).kind == "ran"
    [stored] = redis_client.keys("*")
    args = ["powertools", "key", "--function", function_name(job), "--hash-function", "sha256",
            "--event-key-jmespath", options["event_key_jmespath"]]  # fmt: skip

    result = run([*args, "--payload", json.dumps(payload)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == stored
    (tmp_path / "event.json").write_text(json.dumps(payload))
    result = run([*args, "--payload", f"@{tmp_path / 'event.json'}", "--json"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == {"key": stored}
    result = run([*args, "--payload", "-"], input=json.dumps(payload))
    assert result.stdout.strip() == stored

    prefixed = redis_pt.job({"n": 1}, key_prefix="orders")
    assert call(prefixed).kind == "ran"
    result = run(["powertools", "key", "--key-prefix", "orders", "--payload", '{"n": 1}'])
    assert result.stdout.strip() == key_of(prefixed)
    assert redis_client.exists(result.stdout.strip()) == 1

    assert run(["powertools", "key", "--payload", "{}"]).exit_code == ExitCode.USAGE
    bad = run(["powertools", "key", "--function", "a.b", "--payload", "{nope"])
    assert bad.exit_code == ExitCode.USAGE
