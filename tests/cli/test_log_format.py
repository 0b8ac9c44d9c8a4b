"""``--log-format json|logfmt|text`` (and IDEMCTL_LOG_FORMAT) on consume, outbox relay and
verify: run as processes against the real broker and stores, every line on stderr is one
JSON object (or logfmt line) carrying ts, level, logger, msg and the fields of what it is
about: key, topic, partition, offset, outcome."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import idemctl.outbox
from idemctl import open_store
from tests.backends import unique_schema
from tests.cli.helpers import run
from tests.consume.test_consume import kafka_flags, names, produce
from tests.servers import KafkaBroker, PostgresServer

REPO = Path(__file__).resolve().parents[2]
HANDLER = "def handle(event):\n    return {'seen': event.offset}\n"


def cli(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``idemctl ARGS`` as a process without a terminal, as a log collector runs it."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(cwd)]), **(env or {})}
    for name in ("IDEMCTL_STORE", "IDEMCTL_BROKERS", "IDEMCTL_CONFIG", "IDEMCTL_PROFILE"):
        environ.pop(name, None)
    if env is None or "IDEMCTL_LOG_FORMAT" not in env:
        environ.pop("IDEMCTL_LOG_FORMAT", None)
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        check=False, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=environ,
    )  # fmt: skip


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of ``stderr`` as a JSON object: a line that is not one fails the test."""
    lines = []
    for line in stderr.splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line on stderr: {line!r}\nall of stderr:\n{stderr}")
        assert isinstance(parsed, dict), line
        lines.append(parsed)
    return lines


def logfmt_lines(stderr: str) -> list[dict[str, str]]:
    """Every line of ``stderr`` as logfmt pairs."""
    lines = []
    for line in stderr.splitlines():
        pairs = shlex.split(line)
        assert pairs and all("=" in p for p in pairs), f"not logfmt: {line!r}\n{stderr}"
        lines.append(dict(p.split("=", 1) for p in pairs))
    return lines


def utc(ts: str) -> datetime:
    """An ISO 8601 UTC time to the millisecond: ``2026-01-02T03:04:05.678Z``."""
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ts), ts
    moment = datetime.fromisoformat(ts)
    assert moment.utcoffset() == timedelta(0)
    assert abs((datetime.now(UTC) - moment).total_seconds()) < 600
    return moment


# consume -----------------------------------------------------------------------------------


@pytest.fixture
def one_bad_one_good(kafka_broker: KafkaBroker, tmp_path: Path) -> str:
    """A topic of one partition: at offset 0 a message without an idempotency key (it is
    dead-lettered), at offset 1 a good one; the handler module beside the test."""
    topic, _ = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(
        kafka_broker,
        topic,
        [{"value": {"n": 0}, "idem": None}, {"value": {"n": 1}, "idem": "good-1"}],
    )
    (tmp_path / "h.py").write_text(HANDLER)
    return topic


def consume(
    broker: KafkaBroker, tmp_path: Path, topic: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    _, group = names()
    return cli(
        tmp_path, "--store", f"sqlite:///{tmp_path}/{group}.db", "consume", "--handler", "h:handle",
        "--brokers", broker.bootstrap, "--topic", topic, "--group", group,
        "--exit-when-idle", "3s", *kafka_flags(broker), *extra, env=env,
    )  # fmt: skip


def test_consume_log_format_json_is_one_object_a_line_with_the_message_fields(
    kafka_broker: KafkaBroker, tmp_path: Path, one_bad_one_good: str
) -> None:
    topic = one_bad_one_good
    done = consume(kafka_broker, tmp_path, topic, "--log-format", "json")
    assert done.returncode == 0, done.stderr
    lines = json_lines(done.stderr)
    for line in lines:
        assert list(line)[:4] in (["ts", "level", "logger", "msg"], ["ts", "level", "msg"]), line
        utc(line["ts"])
    dead = [line for line in lines if line.get("outcome") == "dead_lettered"]
    assert len(dead) == 1, done.stderr
    assert dead[0] | {"ts": None} == {
        "ts": None,
        "level": "warning",
        "logger": "idemctl.consume",
        "msg": f"dead-lettered {topic}[0]@0 to {topic}.dlq: no idempotency key: "
        "no 'idempotency-key' header",  # the human message as it always was
        "topic": topic,
        "partition": 0,
        "offset": 0,
        "outcome": "dead_lettered",
        "reason": "no idempotency key",
        "dlq_topic": f"{topic}.dlq",
    }  # no "key": the message has none
    # The command's own lines are JSON too: the store it uses, and the summary.
    assert lines[0]["msg"].startswith("store: sqlite:///") and lines[0]["store_source"] == "--store"
    summary = lines[-1]
    assert summary["msg"] == "consumed 2 message(s): dead lettered 1, executed 1"
    assert summary["level"] == "info" and summary["executed"] == 1
    assert summary["dead_lettered"] == 1 and summary["finished"] == 2
    assert done.stdout == ""


def test_consume_log_format_logfmt_has_the_same_fields_as_pairs(
    kafka_broker: KafkaBroker, tmp_path: Path, one_bad_one_good: str
) -> None:
    topic = one_bad_one_good
    done = consume(kafka_broker, tmp_path, topic, "--json", env={"IDEMCTL_LOG_FORMAT": "logfmt"})
    assert done.returncode == 0, done.stderr
    lines = logfmt_lines(done.stderr)
    dead = [line for line in lines if line.get("outcome") == "dead_lettered"]
    assert len(dead) == 1, done.stderr
    assert list(dead[0])[:4] == ["ts", "level", "msg", "logger"]
    utc(dead[0]["ts"])
    assert dead[0]["level"] == "warning" and dead[0]["logger"] == "idemctl.consume"
    assert dead[0]["msg"].startswith(f"dead-lettered {topic}[0]@0 to {topic}.dlq")
    assert (dead[0]["topic"], dead[0]["partition"], dead[0]["offset"]) == (topic, "0", "0")
    assert dead[0]["reason"] == "no idempotency key"
    assert lines[0]["msg"].startswith("store: sqlite:///")
    assert json.loads(done.stdout)["counts"] == {"dead_lettered": 1, "executed": 1}


def test_consume_default_without_a_terminal_stays_logfmt_warnings_and_plain_notes(
    kafka_broker: KafkaBroker, tmp_path: Path, one_bad_one_good: str
) -> None:
    done = consume(kafka_broker, tmp_path, one_bad_one_good)
    assert done.returncode == 0, done.stderr
    first, *rest = done.stderr.splitlines()
    assert first.startswith("store: sqlite:///") and first.endswith("(from --store)")
    assert rest[-1] == "consumed 2 message(s): dead lettered 1, executed 1"
    [dead] = [line for line in rest if "outcome=dead_lettered" in line]
    assert dead.startswith("ts=") and " level=warning " in dead and " partition=0 " in dead


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--log-format", "xml"], {}), ([], {"IDEMCTL_LOG_FORMAT": "xml"})],
    ids=["flag", "environment"],
)
def test_a_log_format_not_offered_is_a_usage_error_naming_the_choices(
    args: list[str], env: dict[str, str | None]
) -> None:
    done = run(["consume", "--handler", "h:handle", "--topic", "t", "--group", "g", *args], env=env)
    assert done.exit_code == 2, done.output
    assert "--log-format" in done.stderr
    for choice in ("auto", "json", "logfmt", "text"):
        assert f"'{choice}'" in done.stderr, done.stderr
    for command in (["outbox", "relay"], ["verify"]):
        refused = run([*command, "--log-format", "xml"])
        assert refused.exit_code == 2 and "'logfmt'" in refused.stderr, refused.stderr


def test_consume_help_names_the_option_and_its_environment_variable() -> None:
    done = run(["consume", "--help"], env={"COLUMNS": "200"})
    assert done.exit_code == 0
    assert "--log-format" in done.stdout and "IDEMCTL_LOG_FORMAT" in done.stdout


# outbox relay ------------------------------------------------------------------------------


def test_relay_json_logs_each_published_event_with_where_it_went(
    postgres_server: PostgresServer, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    with open_store(url) as store:
        store.provision()
    tag = uuid.uuid4().hex[:12]
    kafka_broker.create_topic(f"t-{tag}-order", partitions=1)
    with postgres_server.connect() as conn, conn.transaction():
        ids = [
            str(
                idemctl.outbox.add(
                    conn, "order", f"order-{n}", "OrderPlaced", {"n": n}, schema=schema
                )
            )
            for n in range(2)
        ]
    secret = postgres_server.url(schema=schema, password="pw-s3cret")  # trust: not asked for
    done = cli(
        tmp_path, "--store", secret, "outbox", "relay", "--json", "-vv",
        "--brokers", kafka_broker.bootstrap, "--topic-template", f"t-{tag}-{{aggregatetype}}",
        "--exit-when-idle", "2s", "--poll-interval", "0.2s",
        env={"IDEMCTL_LOG_FORMAT": "json"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["published"] == 2
    lines = json_lines(done.stderr)  # -vv: every library's debug lines too, each an object
    assert {line["level"] for line in lines} >= {"info", "debug"}
    published = sorted(
        (line for line in lines if line.get("outcome") == "published"), key=lambda x: x["offset"]
    )
    assert [(p["key"], p["event_id"], p["offset"]) for p in published] == [
        ("order-0", ids[0], 0),
        ("order-1", ids[1], 1),
    ], done.stderr
    for p in published:
        assert p["topic"] == f"t-{tag}-order" and p["partition"] == 0
        assert p["logger"] == "idemctl.outbox" and p["level"] == "debug"
        utc(p["ts"])
    assert "pw-s3cret" not in done.stderr + done.stdout
    # The store line, after any debug line a driver logs as it loads (psycopg 3.1 does).
    (store,) = [line for line in lines if line["msg"].startswith("store: ")]
    assert store["msg"].startswith("store: postgresql://test:***@")


# verify --------------------------------------------------------------------------------------


def test_verify_json_steps_progress_and_verdict_are_objects(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from tests.verify.test_verify import FAST_GROUPS

    done = cli(
        tmp_path, "--store", f"sqlite:///{tmp_path}/keys.db", "verify",
        "--brokers", kafka_broker.bootstrap, *FAST_GROUPS, "--messages", "20",
        "--consumers", "1", "--kill-every", "0", "--partitions", "1", "--log-format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lost keys" in done.stdout  # the report's table, on stdout as always
    lines = json_lines(done.stderr)
    assert {line["logger"] for line in lines} == {"idemctl.cli"}
    messages = [line["msg"] for line in lines]
    assert messages[0].startswith("store: sqlite:///") and lines[0]["store_source"] == "--store"
    assert "removed the scratch topics and store" in messages
    assert messages[-1].startswith("ok: ") and messages[-1].endswith("nothing lost")
    for progress in (line for line in lines if line["msg"] == "verify progress"):  # every 5 s
        assert isinstance(progress["rate"], float) and isinstance(progress["elapsed"], float)
        assert isinstance(progress["handled"], int) and progress["brokers"]


# The handler itself: redaction, fields, forms ---------------------------------------------


def _record(msg: str, level: int = logging.WARNING, **fields: Any) -> logging.LogRecord:
    record = logging.LogRecord("idemctl.consume", level, __file__, 1, msg, (), None)
    record.idemctl = fields
    return record


@pytest.mark.parametrize("form", ["json", "logfmt", "text", "auto"])
def test_secrets_are_hidden_in_every_form_and_field(form: str) -> None:
    from rich.console import Console

    from idemctl.cli.logs import ConsoleHandler

    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=250, no_color=True)
    handler = ConsoleHandler(console, ["s3cret"], lambda: form)
    handler.emit(_record("store redis://:s3cret@h/0 down", key="k-s3cret", offset=7, topic=None))
    line = out.getvalue().rstrip("\n")
    assert "s3cret" not in line and "***" in line
    if form == "json":
        parsed = json.loads(line)
        assert parsed["key"] == "k-***" and parsed["offset"] == 7 and "topic" not in parsed
        assert parsed["msg"] == "store redis://:***@h/0 down"
    elif form in ("logfmt", "auto"):  # auto without a terminal: logfmt
        assert line.startswith("ts=") and " key=k-*** offset=7" in line
    else:
        assert line == "warning store redis://:***@h/0 down"


def test_no_field_takes_the_place_of_the_line_s_own() -> None:
    from idemctl.cli.logs import log_line

    line = json.loads(log_line("json", "info", "hello", {"msg": "x", "level": "y", "n": 1}))
    assert (line["msg"], line["level"], line["n"]) == ("hello", "info", 1)
    assert line["ts"].endswith("Z") and "logger" not in line
