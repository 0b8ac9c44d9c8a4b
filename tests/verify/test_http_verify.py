"""``idemctl verify --http URL`` run as users run it: a process against a real server. The
example app (idemctl's middleware, under uvicorn, on SQLite and on Redis) passes every
point; a payments API that charges every request and ignores its keys fails with the
points named (exit 1); an unreachable or malformed URL is one line and exit 2. The
verdicts' finer cases (a 5xx stored or left held, two callers' keys meeting) run the
library against a small API of the test's own, in-process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from idemctl.harness.httpcheck import TITLES, HttpTarget, check_api, masked
from idemctl.operate.documents import verify_http
from tests.cli.helpers import run, validate
from tests.http.conftest import Served, serve, store_url
from tests.servers import free_port

pytestmark = pytest.mark.timeout(240)

SECRET = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
CHARGE = '{"order": "o-{uuid}", "amount": 500}'
FLAKY = '{"order": "flaky-{uuid}", "amount": 500}'
"""The example app answers 500 the first time it sees an order whose id starts with flaky."""
CALLER = ["-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {SECRET}"]
SECOND = ["--second-caller-header", "Authorization: Bearer sk_live_other"]


def idemctl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def verdicts(document: dict[str, Any]) -> dict[str, str]:
    return {point["id"]: point["verdict"] for point in document["points"]}


def rows(table: str) -> dict[str, list[str]]:
    """A rich table's rows: the first cell -> the cells."""
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines()]
    return {row[0]: row for row in cells if row}


def ledger_lines(served: Served) -> list[str]:
    path = served.server.ledger
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(
    scope="module", params=[("sqlite", None), ("redis", "10")], ids=["sqlite", "redis-wait"]
)
def example(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The example app under uvicorn: on SQLite a duplicate in flight gets 409; on Redis,
    with ``IDEMCTL_WAIT``, it waits for the first one's response."""
    family, wait = request.param
    directory = tmp_path_factory.mktemp(f"verify-http-{family}")
    env = {"IDEMCTL_WAIT": wait} if wait else {}
    with serve("uvicorn", store_url(request, family, directory), directory, env=env) as app:
        yield app


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("verify-http-broken")
    url = f"sqlite:///{directory}/unused.db"
    with serve("uvicorn", url, directory, app="tests.verify.broken_http_app:app") as app:
        yield app


# The example app: every point passes --------------------------------------------------


def test_the_example_app_passes_every_point_and_charges_each_order_once(example: Served) -> None:
    before = len(ledger_lines(example))
    done = idemctl(
        "--json", "verify", "--http", f"{example.server.base_url}/charges", *CALLER, *SECOND,
        "--data", CHARGE, "--fault-data", FLAKY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    document = json.loads(done.stdout)
    validate("verify-http.schema.json", document)
    assert verdicts(document) == dict.fromkeys(TITLES, "pass"), document["points"]
    assert document["ok"] and document["passed"] == 7 and document["failed"] == 0
    assert document["marks_replays"] is True
    by_id = {point["id"]: point for point in document["points"]}
    assert by_id["missing-key"]["statuses"] == [400]
    assert by_id["replay"]["statuses"] == [201, 201]
    assert by_id["other-payload"]["statuses"] == [201, 422]
    assert by_id["server-error"]["statuses"] == [500, 201]
    assert by_id["invalid-key"]["statuses"] == [400, 400]
    concurrent = by_id["concurrent"]["statuses"]
    assert concurrent.count(201) >= 2 and set(concurrent) <= {201, 409}  # original, replays
    # What it charged: each order once, but the two callers' (one order, two callers).
    charged = Counter(ledger_lines(example)[before:])
    assert sorted(charged.values()) == [1, 1, 1, 1, 2], charged
    assert {"Authorization": "Bearer ***"}.items() <= {
        h["name"]: h["value"] for h in document["headers"]
    }.items()
    assert SECRET not in done.stdout + done.stderr


def test_the_human_output_is_a_table_of_verdicts_with_the_credentials_masked(
    example: Served,
) -> None:
    """The run docs/guides/verify.md shows."""
    done = idemctl(
        "verify", "--http", f"{example.server.base_url}/charges", *CALLER, *SECOND,
        "--data", CHARGE, "--fault-data", FLAKY,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    assert (
        done.stdout.splitlines()[0]
        == f"idemctl verify --http POST {example.server.base_url}/charges"
    )
    assert {title: row[1] for title, row in rows(done.stdout).items()} == dict.fromkeys(
        TITLES.values(), "pass"
    )
    assert (
        "headers: Content-Type: application/json, Authorization: Bearer ***; "
        "second caller: Authorization: Bearer ***"
    ) in done.stdout
    assert SECRET not in done.stdout + done.stderr and "sk_live_other" not in done.stdout
    assert done.stderr.strip().splitlines()[-1] == "ok: 7 passed"


def test_an_unvaried_body_and_a_fault_path_that_does_not_fail_are_reported(
    example: Served,
) -> None:
    """Without {uuid}, another payload is the JSON with a member more; a --fault-path that
    answers no 5xx is a warning, not a pass; keys sent bare pass as well; without a second
    caller, two callers is skipped."""
    done = idemctl(
        "--json", "verify", "--http", f"{example.server.base_url}/charges", *CALLER,
        "--data", json.dumps({"order": f"o-{uuid.uuid4().hex}", "amount": 1}),
        "--fault-path", "/charges", "--concurrency", "3", "--bare-key",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + done.stdout
    document = json.loads(done.stdout)
    validate("verify-http.schema.json", document)
    assert document["key_form"] == "bare"
    found = verdicts(document)
    assert found["other-payload"] == "pass" and found["server-error"] == "warn"
    skipped = next(p for p in document["points"] if p["id"] == "two-callers")
    assert skipped["verdict"] == "skip" and "--second-caller-header" in skipped["reason"]
    assert len(next(p for p in document["points"] if p["id"] == "concurrent")["statuses"]) == 4


# A payments API that is not idempotent: exit 1, the failed points named -------------------


def test_an_api_that_ignores_keys_fails_with_the_points_named(broken: Served) -> None:
    base = broken.server.base_url
    before = len(ledger_lines(broken))
    done = idemctl(
        "--json", "verify", "--http", f"{base}/charges", *CALLER, *SECOND, "--data", CHARGE,
        "--fault-path", "/fail",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr + done.stdout
    document = json.loads(done.stdout)
    validate("verify-http.schema.json", document)
    assert verdicts(document) == {
        "missing-key": "warn",  # ran without a key: keys are not required
        "replay": "fail",
        "other-payload": "fail",
        "concurrent": "fail",
        "server-error": "pass",  # its 500 is not stored: the retry runs again, as it should
        "two-callers": "warn",  # no replay at all: nothing to tell the callers apart by
        "invalid-key": "fail",
    }
    reasons = {point["id"]: point["reason"] for point in document["points"]}
    assert "ran again" in reasons["replay"]
    assert "ran more than once" in reasons["concurrent"]
    assert "accepted (201)" in reasons["invalid-key"]
    assert not document["ok"] and document["failed"] == 4
    # The 5 sent at once and the one after them charged 6 times: what verify found.
    assert max(Counter(ledger_lines(broken)[before:]).values()) == 6

    human = idemctl("verify", "--http", f"{base}/charges", *CALLER, "--data", CHARGE)
    assert human.returncode == 1
    shown = {title: row[1] for title, row in rows(human.stdout).items()}
    assert shown == {
        "missing key": "warn", "replay": "fail", "another payload": "fail",
        "concurrent duplicates": "fail", "a 5xx": "skip", "two callers": "skip",
        "malformed key": "fail",
    }  # fmt: skip
    assert "--fault-path" in rows(human.stdout)["a 5xx"][2]
    assert human.stderr.strip().splitlines()[-1] == (
        "FAILED: 4 failed (replay, another payload, concurrent duplicates, malformed key); "
        "1 warned, 2 skipped"
    )
    assert "Traceback" not in human.stderr


# Wrong URLs and options: one line, exit 2 ----------------------------------------------------


def test_an_unreachable_url_is_one_line_and_exit_2() -> None:
    port = free_port()
    done = idemctl("verify", "--http", f"http://127.0.0.1:{port}/charges", *CALLER)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip() == (
        f"error: http://127.0.0.1:{port}/charges: cannot connect: connection refused"
    )
    as_json = idemctl("--json", "verify", "--http", f"http://127.0.0.1:{port}/")
    assert as_json.returncode == 2 and as_json.stdout == "" and "Traceback" not in as_json.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--http", "ftp://example.com/x"], "--http: ftp://example.com/x: expected http://"),
        (["--http", "http://u:pw@127.0.0.1/x"], "u:***@127.0.0.1"),
        (["--http", "http://127.0.0.1:1/", "-H", "no colon"], "expected 'Name: value'"),
        (["--http", "http://127.0.0.1:1/", "-H", "Idempotency-Key: k"], "sends the keys"),
        (["--http", "http://127.0.0.1:1/", "--data", "x", "--data-file", "f"], "not both"),
        (["--http", "http://127.0.0.1:1/", "--fault-path", "fail"], "--fault-path"),
        (["--http", "http://127.0.0.1:1/", "--messages", "100"], "not with --http"),
        (["--header", "Authorization: x"], "--header: needs --http URL"),
    ],
    ids=["scheme", "userinfo", "header", "key-header", "data-twice", "fault-path", "kafka",
         "no-http"],
)  # fmt: skip
def test_a_bad_option_is_a_usage_error(args: list[str], says: str) -> None:
    done = run(["verify", *args])
    assert done.exit_code == 2, done.output
    assert says in done.output
    assert "pw" not in done.output.replace("u:***", "")


# The library against an API of the test's own -----------------------------------------------


@dataclass
class Behaviour:
    """How the stub API keeps keys: released after a 5xx (idemctl's default), stored
    (``store_5xx``, Stripe's), or left held (``stuck``); per caller or ``shared``."""

    store_5xx: bool = False
    stuck: bool = False
    shared: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    keys: dict[tuple[str, str], Any] = field(default_factory=dict)


class _Stub(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    behaviour: Behaviour

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def answer(self, status: int, body: bytes, *extra: tuple[str, str]) -> None:
        self.send_response(status)
        for name, value in (("Content-Type", "application/json"), *extra):
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        b = self.behaviour
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        key = self.headers.get("idempotency-key")
        if key is None or len(key) > 255 or "\t" in key:
            return self.answer(400, b'{"error": "key"}')
        scoped = ("" if b.shared else self.headers.get("authorization", ""), key)
        with b.lock:
            seen = b.keys.get(scoped)
            if seen == "running":
                return self.answer(409, b'{"error": "in progress"}', ("Retry-After", "1"))
            if seen is not None:
                if seen[0] != body:
                    return self.answer(422, b'{"error": "reused"}')
                return self.answer(seen[1], seen[2], ("Idempotent-Replayed", "true"))
            b.keys[scoped] = "running"
        if self.path == "/fail":
            status, out = 500, b'{"error": "boom"}'
        else:
            status, out = 201, json.dumps({"id": uuid.uuid4().hex}).encode()
        with b.lock:
            if status < 500 or b.store_5xx:
                b.keys[scoped] = (body, status, out)
            elif not b.stuck:
                del b.keys[scoped]
        return self.answer(status, out)


@pytest.fixture
def stub() -> Iterator[tuple[str, Behaviour]]:
    behaviour = Behaviour()
    handler = type("Stub", (_Stub,), {"behaviour": behaviour})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/charges", behaviour
    finally:
        server.shutdown()
        server.server_close()


def target(url: str, **given: Any) -> HttpTarget:
    return HttpTarget(
        url,
        body=b'{"order": "{uuid}"}',
        headers=(("Content-Type", "application/json"), ("Authorization", "Bearer one")),
        second_caller=(("Authorization", "Token two"),),
        fault_path="/fail",
        timeout=60,
        **given,
    )


def test_a_5xx_released_stored_or_left_held(stub: tuple[str, Behaviour]) -> None:
    url, behaviour = stub
    report = check_api(target(url))
    assert {p.id: p.verdict for p in report.points} == dict.fromkeys(TITLES, "pass")
    document = verify_http.document(report)
    validate("verify-http.schema.json", document)
    assert document["second_caller"] == [{"name": "Authorization", "value": "Token ***"}]

    behaviour.store_5xx = True
    stored = check_api(target(url)).points[4]
    assert (stored.id, stored.verdict) == ("server-error", "pass")
    assert stored.reason == "500 stored and replayed (as Stripe does)"

    behaviour.store_5xx, behaviour.stuck = False, True
    held = check_api(target(url)).points[4]
    assert (held.verdict, held.statuses) == ("fail", (500, 409))
    assert held.reason == "the retry after 500 got 409: the key stayed held"


def test_two_callers_whose_keys_meet_fail(stub: tuple[str, Behaviour]) -> None:
    url, behaviour = stub
    behaviour.shared = True
    point = {p.id: p for p in check_api(target(url)).points}["two-callers"]
    assert point.verdict == "fail"
    assert "the first caller's response" in point.reason


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("Authorization", "Bearer sk_live_x", "Bearer ***"),
        ("authorization", "sk_live_x", "***"),
        ("X-Api-Key", "abc", "***"),
        ("Cookie", "session=abc; theme=dark", "***"),
        ("Content-Type", "application/json", "application/json"),
    ],
)
def test_credentials_are_masked(name: str, value: str, shown: str) -> None:
    assert masked(name, value) == shown


def test_the_schema_names_every_point() -> None:
    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "schemas" / "verify-http.schema.json").read_text()
    )
    ids = schema["properties"]["points"]["items"]["properties"]["id"]["enum"]
    assert ids == list(TITLES)
