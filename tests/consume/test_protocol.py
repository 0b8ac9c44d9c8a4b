"""The line protocol between ``consume --processes``' supervisor and its workers
(``idemctl.consume.protocol``, ``schemas/worker-line.schema.json``): what a worker writes
validates against the schema and reads back the same; the supervisor takes a worker's
counts and its error from it, and nothing from its log lines."""

from __future__ import annotations

import io
import json
import os
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema

from idemctl.consume import protocol
from idemctl.consume.supervisor import Supervisor
from idemctl.kafka.options import Summary
from idemctl.operate.documents.consume import fields

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "worker-line.schema.json").read_text()
)


def summary() -> Summary:
    return Summary(
        counts=Counter(executed=3, replayed=1),
        dead_letters=Counter({"invalid idempotency key": 1}),
        partitions=2,
        state="consuming",
        lag=5,
    )


def test_each_line_validates_and_reads_back_the_same() -> None:
    now = [0.0]
    out = io.StringIO()
    writer = protocol.Writer(out, fields, every=1.0, clock=lambda: now[0])
    writer.progress(summary())
    writer.progress(summary())  # within the second: not written
    now[0] = 1.5
    writer.progress(summary())
    writer.error("the store\nwent away")
    writer.summary(summary())
    lines = out.getvalue().splitlines()
    assert [json.loads(x)["type"] for x in lines] == ["progress", "progress", "error", "summary"]
    for text in lines:
        jsonschema.validate(json.loads(text), SCHEMA)
    progress, _, error, done = (protocol.decode(x) for x in lines)
    assert progress is not None and progress.counts == {"executed": 3, "replayed": 1}
    assert progress.fields["state"] == "consuming" and progress.fields["lag"] == 5
    assert error is not None and error.message == "the store went away"  # one line
    assert done is not None and done.dead_letters == {"invalid idempotency key": 1}


def test_lines_of_another_version_or_none_of_the_protocol_are_not_read() -> None:
    assert protocol.decode('{"idemctl_worker": 2, "type": "progress"}') is None
    assert protocol.decode('{"msg": "consume progress", "executed": 9}') is None
    assert protocol.decode("not json") is None
    assert protocol.decode('{"idemctl_worker": 1, "type": "chat"}') is None


WORKER = textwrap.dedent(
    """
    import json, os, pathlib, sys, time
    # A log line that looks like progress: the supervisor must not read it.
    print(json.dumps({"level": "info", "msg": "consume progress", "executed": 999}),
          file=sys.stderr, flush=True)
    print(json.dumps({"level": "error", "msg": "a log line, not the error"}), file=sys.stderr)
    line = {"idemctl_worker": 1, "type": "progress", "fields": {"state": "consuming"},
            "counts": {"executed": 1}}
    print(json.dumps(line), flush=True)
    done = pathlib.Path(os.environ["FIRST_DONE"])
    if sys.argv[-1] == "0":
        print(json.dumps({"idemctl_worker": 1, "type": "summary",
                          "counts": {"executed": 3}, "dead_letters": {}}), end="", flush=True)
        done.touch()
    else:
        # Fails only once the first has said all: the failure stops the others, and a
        # loaded machine may not yet have started the first.
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        print(json.dumps({"idemctl_worker": 1, "type": "error", "message": "bad config"}))
        sys.exit(2)
    """
)


def test_the_supervisor_reads_counts_and_errors_from_the_protocol_alone(tmp_path: Path) -> None:
    logged: list[Any] = []
    supervisor = Supervisor(
        [sys.executable, "-c", WORKER],
        2,
        env={**os.environ, "FIRST_DONE": str(tmp_path / "first-done")},
        on_line=lambda worker, line: logged.append(line),
    )
    ending = supervisor.run()
    first, second = supervisor.workers
    assert first.counts == {"executed": 3}  # its summary line (the last, unended)
    assert ending.code == 2 and second.last_error == "bad config"
    assert "bad config" in (ending.reason or "")
    assert any(isinstance(x, dict) and x.get("msg") == "consume progress" for x in logged)


def test_a_replacement_worker_is_told_it_replaces_one(tmp_path: Path) -> None:
    """The first process of a slot sees IDEMCTL_WORKER_RESTARTS=0; the one started in place
    of it after it died sees 1 (and waits for its group past --join-timeout)."""
    from idemctl.consume.supervisor import REPLACEMENT

    script = textwrap.dedent(f"""\
        import os, pathlib, sys
        seen = pathlib.Path({str(tmp_path)!r}) / "seen"
        with seen.open("a") as f:
            f.write(os.environ["{REPLACEMENT}"] + "\\n")
        sys.exit(0 if len(seen.read_text().split()) > 1 else 1)  # the first one dies
    """)
    supervisor = Supervisor([sys.executable, "-c", script], 1, env=dict(os.environ), backoff=0.01)
    ending = supervisor.run()
    assert ending.code == 0
    assert (tmp_path / "seen").read_text().split() == ["0", "1"]
    assert supervisor.workers[0].restarts == 1
