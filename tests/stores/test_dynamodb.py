"""The DynamoDB store on a real HTTP endpoint, moto's server (tests/servers.py): what only
DynamoDB has, beyond the contract suite (which runs on "dynamodb" too, the 8-process race
included).

Tests share the session server ``moto_server`` through tables of their own; a test that
freezes a server starts its own and stops it by PID. Requests are counted on the wire with
botocore's ``before-send`` event, which fires once per HTTP request, retries included.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest

from idemctl import (
    Acquired,
    Busy,
    ClaimRequest,
    Completed,
    Completion,
    LeaseLost,
    Status,
    fingerprint,
)
from idemctl.errors import ConfigError, NotProvisioned, StoreUnavailable
from idemctl.model import Guard, Settle, Verdict
from idemctl.runner import Outcome, run
from idemctl.stores import open_store
from idemctl.stores.dynamodb import DynamoDBStore
from idemctl.stores.dynamodb.items import ENTITY_PREFIX
from tests.backends import expire_hold, expire_lease, expire_retention, unique_table
from tests.servers import HOST, MotoServer, free_port, http_answers, pid_alive

T = TypeVar("T")
HANG = 30.0
"""No single store call may take longer than this: a bound that catches hangs, not speed."""
LONG = 60.0


def bounded(fn: Callable[[], T], timeout: float = HANG) -> T:
    """fn() in a thread: its result or its exception, or a failure if it hangs."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout)
    except FutureTimeout:
        pytest.fail(f"store call still running after {timeout}s: it hangs")
    finally:
        pool.shutdown(wait=False)


def open_ddb(url: str) -> DynamoDBStore:
    store = open_store(url)
    assert isinstance(store, DynamoDBStore)
    return store


@pytest.fixture
def table() -> str:
    return unique_table()


@pytest.fixture
def url(moto_server: MotoServer, table: str) -> str:
    return moto_server.url(table)


@pytest.fixture
def store(url: str) -> Iterator[DynamoDBStore]:
    s = open_ddb(url)
    s.provision()
    yield s
    s.close()


@pytest.fixture
def raw(moto_server: MotoServer) -> Iterator[Any]:
    """A plain boto3 client, to look at what the store wrote."""
    client = moto_server.client()
    yield client
    client.close()


def acquire(store: DynamoDBStore, key: str, lease: float = LONG, fp: str | None = None) -> Acquired:
    outcome = store.claim(key, fp, lease)
    assert isinstance(outcome, Acquired), outcome
    return outcome


def item(raw: Any, table: str, key: str) -> dict[str, Any] | None:
    """The item as DynamoDB holds it, whatever the store makes of it."""
    got: dict[str, Any] | None = raw.get_item(
        TableName=table, Key={"key": {"S": key}}, ConsistentRead=True
    ).get("Item")
    return got


def number(it: dict[str, Any], name: str) -> int:
    return int(it[name]["N"])


def _operation(request: Any) -> str:
    target = request.headers.get("X-Amz-Target", b"")
    target = target.decode() if isinstance(target, bytes) else str(target)
    return target.rsplit(".", 1)[-1]


@contextlib.contextmanager
def requests_sent(store: DynamoDBStore) -> Iterator[list[str]]:
    """The operation of every HTTP request the store sends meanwhile (retries included)."""
    sent: list[str] = []

    def count(request: Any, **_: Any) -> None:
        sent.append(_operation(request))

    store.client.meta.events.register("before-send.dynamodb", count)
    try:
        yield sent
    finally:
        store.client.meta.events.unregister("before-send.dynamodb", count)


@contextlib.contextmanager
def first_response_lost(store: DynamoDBStore, operation: str) -> Iterator[list[int]]:
    """The next ``operation`` request reaches the server and is carried out, but its answer
    never comes back (a read timeout on the client): botocore retries it, as it would after
    a network blip. Yields the statuses the server gave the lost requests."""
    from botocore.exceptions import ReadTimeoutError

    delivered: list[int] = []

    def lose(request: Any, **_: Any) -> None:
        if delivered or _operation(request) != operation:
            return
        parts = urlsplit(request.url)
        conn = http.client.HTTPConnection(parts.hostname or HOST, parts.port, timeout=10)
        try:
            headers = {
                k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()
            }
            conn.request(request.method, parts.path or "/", body=request.body, headers=headers)
            response = conn.getresponse()
            response.read()
            delivered.append(response.status)
        finally:
            conn.close()
        raise ReadTimeoutError(endpoint_url=request.url)

    store.client.meta.events.register("before-send.dynamodb", lose)
    try:
        yield delivered
    finally:
        store.client.meta.events.unregister("before-send.dynamodb", lose)
    assert delivered == [200], f"the lost {operation} was not carried out: {delivered}"


def listening_addresses(port: int) -> set[str]:
    """Local IPv4 addresses with a socket listening on ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state = fields[1], fields[3]
        address, port_hex = local.split(":")
        if state == "0A" and int(port_hex, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


# The server helper itself --------------------------------------------------------------------


def test_server_helper_listens_on_loopback_resets_restarts_and_leaves_no_process(
    tmp_path: Path,
) -> None:
    server = MotoServer(tmp_path)
    try:
        server.start()
        first = server.pid
        assert first is not None and pid_alive(first)
        assert listening_addresses(server.port) == {"127.0.0.1"}
        client = server.client()
        client.create_table(
            TableName="kept",
            AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        assert client.list_tables()["TableNames"] == ["kept"]
        server.reset()
        assert client.list_tables()["TableNames"] == []

        server.restart()  # SIGTERM by PID, same port
        assert not pid_alive(first)
        assert server.pid != first and http_answers(server.port)

        killed = server.pid
        server.kill()
        assert killed is not None and not pid_alive(killed)
        assert not http_answers(server.port)
        server.restart()  # after a crash, on the same port
        assert client.list_tables()["TableNames"] == []
        client.close()
    finally:
        last = server.pid
        server.stop()
    assert last is not None and not pid_alive(last)
    assert not http_answers(server.port)


def test_url_names_the_table_region_endpoint_and_options(moto_server: MotoServer) -> None:
    url = moto_server.url("t-abc", lease="2s", read_timeout=1)
    assert url == (
        f"dynamodb://t-abc?region=us-east-1&endpoint_url=http://127.0.0.1:{moto_server.port}"
        "&lease=2s&read_timeout=1"
    )
    store = open_ddb(url)
    try:
        assert store.table == "t-abc" and store.default_lease == 2.0
    finally:
        store.close()


# Requests per message ------------------------------------------------------------------------


def test_requests_per_message(store: DynamoDBStore, url: str) -> None:
    """A new key costs a claim and a complete, a duplicate only the claim, a busy key only
    the claim: one conditional UpdateItem each, nothing read first."""
    runs: list[str] = []

    def handler(ctx: Any) -> dict[str, str]:
        runs.append(ctx.key)
        return {"charged": ctx.key}

    fp = fingerprint({"amount": 10})
    with requests_sent(store) as sent:
        first = run(store, "order-1", handler, fingerprint=fp)
    assert first.outcome is Outcome.EXECUTED
    assert sent == ["UpdateItem", "UpdateItem"]

    with requests_sent(store) as sent:
        again = run(store, "order-1", handler, fingerprint=fp)
    assert again.outcome is Outcome.REPLAYED and again.result == {"charged": "order-1"}
    assert sent == ["UpdateItem"]

    other = open_ddb(url)
    try:
        acquire(other, "order-2")  # another worker holds it
        with requests_sent(store) as sent:
            busy = run(store, "order-2", handler, fingerprint=fp)
        assert busy.outcome is Outcome.BUSY
        assert sent == ["UpdateItem"]
    finally:
        other.close()
    assert runs == ["order-1"]


def test_a_batch_sends_its_requests_side_by_side(moto_server: MotoServer, table: str) -> None:
    """claim_many and complete_many have up to ``concurrency`` requests in flight at once, a
    key's later items after its first, and give the single forms' answers in order."""
    store = open_ddb(moto_server.url(table, concurrency=8))
    in_flight, most = [0], [0]
    lock = threading.Lock()

    def sending(**_: Any) -> None:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])

    def answered(**_: Any) -> None:
        with lock:
            in_flight[0] -= 1

    store.client.meta.events.register("before-send.dynamodb", sending)
    store.client.meta.events.register("after-call.dynamodb", answered)
    store.client.meta.events.register("after-call-error.dynamodb", answered)
    try:
        store.provision()
        done = acquire(store, "k-done")
        store.complete("k-done", done.owner, done.fencing_token, "old")
        most[0] = 0
        keys = [f"k-{i}" for i in range(60)]
        outcomes = store.claim_many([ClaimRequest(k) for k in [*keys, "k-done", "k-0"]], lease=LONG)
        assert all(isinstance(o, Acquired) for o in outcomes[:60])
        assert isinstance(outcomes[60], Completed)
        assert isinstance(outcomes[61], Busy)  # the same key again, after its first claim
        assert 1 < most[0] <= 8
        acquired = [o for o in outcomes[:60] if isinstance(o, Acquired)]
        lost = Completion("k-1", "not-the-owner", 99, None)
        done_flags = store.complete_many(
            [*(Completion(a.key, a.owner, a.fencing_token, a.key) for a in acquired), lost]
        )
        assert done_flags == [True] * 60 + [False]
        for key in keys:
            record = store.get(key)
            assert record is not None and record.status is Status.COMPLETED
            assert record.result == key
    finally:
        store.close()


def test_a_failed_request_in_a_batch_fails_the_batch_after_the_others_finish(
    store: DynamoDBStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    claim = store._claim_one  # what claim_many sends, one request per key

    def claim_or_fail(key: str, *args: Any) -> Any:
        if key == "k-bad":
            raise StoreUnavailable("this one request failed")
        return claim(key, *args)

    monkeypatch.setattr(store, "_claim_one", claim_or_fail)
    keys = ["k-a", "k-bad", "k-b", "k-c"]
    with pytest.raises(StoreUnavailable, match="this one request failed"):
        store.claim_many([ClaimRequest(k) for k in keys], lease=LONG)
    # Every other request was answered before the error was raised: none is still in flight.
    monkeypatch.setattr(store, "_claim_one", claim)
    assert all(store.get(k) is not None for k in ("k-a", "k-b", "k-c"))


def test_concurrency_must_be_a_whole_number_of_one_or_more(moto_server: MotoServer) -> None:
    for bad in ("0", "many", "-2"):
        with pytest.raises(ConfigError, match="concurrency"):
            open_store(moto_server.url("t", concurrency=bad))


# Provisioning ----------------------------------------------------------------------------------


def test_dry_run_shows_the_table_and_creates_nothing(url: str, table: str, raw: Any) -> None:
    store = open_ddb(url)
    try:
        plan = store.provision(dry_run=True)
        assert plan.dry_run is True and plan.changed is False
        text = "\n".join(plan.statements)
        for words in ("CreateTable", table, "PAY_PER_REQUEST", "UpdateTimeToLive", '"ttl"'):
            assert words in text
        assert table not in raw.list_tables()["TableNames"]
        with pytest.raises(NotProvisioned):
            store.claim("k")
        assert table not in raw.list_tables()["TableNames"]
    finally:
        store.close()


def test_provision_makes_an_on_demand_table_with_ttl_and_twice_changes_nothing(
    url: str, table: str, raw: Any
) -> None:
    store = open_ddb(url)
    try:
        first = store.provision()
        assert first.changed is True and first.dry_run is False and first.statements
        described = raw.describe_table(TableName=table)["Table"]
        assert described["TableStatus"] == "ACTIVE"
        assert described["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert described["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
        assert sorted(described["AttributeDefinitions"], key=str) == sorted(
            [
                {"AttributeName": "key", "AttributeType": "S"},
                {"AttributeName": "ip_shard", "AttributeType": "S"},
                {"AttributeName": "lease_expires_at", "AttributeType": "N"},
            ],
            key=str,
        )
        (index,) = described["GlobalSecondaryIndexes"]  # the sparse index of keys in progress
        assert index["IndexName"] == "in_progress"
        assert index["KeySchema"] == [
            {"AttributeName": "ip_shard", "KeyType": "HASH"},
            {"AttributeName": "lease_expires_at", "KeyType": "RANGE"},
        ]
        assert index["Projection"] == {"ProjectionType": "ALL"}
        ttl = raw.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
        assert ttl["TimeToLiveStatus"] == "ENABLED" and ttl["AttributeName"] == "ttl"

        second = store.provision()
        assert second.changed is False and second.statements == []
        assert store.provision(dry_run=True).statements == []
        assert raw.list_tables()["TableNames"].count(table) == 1
        assert isinstance(store.claim("k"), Acquired)
    finally:
        store.close()


def test_provision_turns_on_ttl_for_a_table_made_without_it(url: str, table: str, raw: Any) -> None:
    """A table made by hand (or by Terraform, or by an idemctl before the index) without TTL:
    provision adds the TTL and the index of keys in progress, and nothing more."""
    raw.create_table(
        TableName=table,
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    store = open_ddb(url)
    try:
        plan = store.provision(dry_run=True)
        assert len(plan.statements) == 4 and "UpdateTimeToLive" in plan.statements[0]
        # Mark the keys in progress first, then add the index and wait for it.
        assert plan.statements[1].startswith("Scan for keys in progress")
        assert "UpdateTable" in plan.statements[2] and "in_progress" in plan.statements[2]
        assert plan.statements[3].startswith("wait until index in_progress is ACTIVE")
        done = store.provision()
        assert done.changed is True
        assert done.statements == [*plan.statements, "marked 0 key(s) in progress"]
        assert store.index_status() == "ACTIVE"
        ttl = raw.describe_time_to_live(TableName=table)["TimeToLiveDescription"]
        assert ttl["TimeToLiveStatus"] == "ENABLED" and ttl["AttributeName"] == "ttl"
        assert store.provision().changed is False
    finally:
        store.close()


# Expiry and TTL ---------------------------------------------------------------------------------


@pytest.mark.clock
def test_an_item_past_expires_at_is_absent_though_still_in_the_table(
    store: DynamoDBStore, table: str, raw: Any
) -> None:
    a = acquire(store, "order-1", fp=fingerprint({"v": 1}))
    store.complete("order-1", a.owner, a.fencing_token, "first life", retention=LONG)
    assert isinstance(store.claim("order-1", fingerprint({"v": 1})), Completed)
    expire_retention(store, "order-1")

    assert store.get("order-1") is None
    kept = item(raw, table, "order-1")  # DynamoDB's TTL deletes late; moto's never does
    assert kept is not None and kept["status"]["S"] == "completed"
    assert number(kept, "expires_at") < time.time() * 1000

    # As if never seen: another payload is welcome, attempts start again, the counter goes on.
    again = acquire(store, "order-1", fp=fingerprint({"v": 2}))
    assert again.attempt == 1 and again.takeover is False
    assert again.fencing_token == a.fencing_token + 1
    with pytest.raises(LeaseLost):
        store.complete("order-1", a.owner, a.fencing_token, "zombie of the first life")
    store.complete("order-1", again.owner, again.fencing_token, "second life")
    record = store.get("order-1")
    assert record is not None and record.result == "second life"
    assert record.fingerprint == fingerprint({"v": 2})


def test_an_item_deleted_by_ttl_comes_back_above_its_old_tokens(
    store: DynamoDBStore, table: str, raw: Any
) -> None:
    first = acquire(store, "order-1")
    store.release("order-1", first.owner, first.fencing_token)
    held = acquire(store, "order-1")
    store.complete("order-1", held.owner, held.fencing_token, "first life", retention=0.05)
    # What DynamoDB's TTL does, hours after retention ended; moto's never does.
    raw.delete_item(TableName=table, Key={"key": {"S": "order-1"}})

    # A key with no item starts its fencing counter at the clock, in µs: above any old token.
    before = time.time_ns() // 1000
    again = acquire(store, "order-1")
    assert again.attempt == 1 and again.takeover is False
    assert held.fencing_token < before <= again.fencing_token <= time.time_ns() // 1000
    kept = item(raw, table, "order-1")
    assert kept is not None and number(kept, "fencing_token") == again.fencing_token
    with pytest.raises(LeaseLost):
        store.complete("order-1", held.owner, held.fencing_token, "zombie of the first life")


def test_forget_leaves_a_tombstone_that_keeps_the_counter(
    store: DynamoDBStore, table: str, raw: Any
) -> None:
    a = acquire(store, "order-1")
    store.complete("order-1", a.owner, a.fencing_token, {"charged": 10})
    store.forget("order-1")
    tomb = item(raw, table, "order-1")
    assert tomb is not None and number(tomb, "fencing_token") == a.fencing_token
    assert number(tomb, "expires_at") <= time.time() * 1000  # as if never seen
    # Neither owner nor done_by: a retried complete of the old owner cannot bring it back.
    assert {"owner", "done_by", "lease_expires_at", "result"}.isdisjoint(tomb)
    # The TTL deletes it a retention later; until then it keeps the counter.
    assert number(tomb, "ttl") >= time.time() + store.default_retention - 5
    with pytest.raises(LeaseLost):
        store.complete("order-1", a.owner, a.fencing_token, {"charged": 10})
    assert store.get("order-1") is None
    assert acquire(store, "order-1").fencing_token == a.fencing_token + 1


def test_the_ttl_attribute_follows_the_record(store: DynamoDBStore, table: str, raw: Any) -> None:
    a = acquire(store, "order-1", lease=LONG)
    held = item(raw, table, "order-1")
    assert held is not None
    lease_ms = number(held, "lease_expires_at")
    # In progress: DynamoDB must not delete the key while a worker may still hold it, nor
    # soon after (an abandoned key keeps its fencing counter as long as a finished one).
    assert number(held, "ttl") * 1000 > lease_ms
    assert number(held, "ttl") >= (lease_ms / 1000) + store.default_retention - 1

    longer = store.extend("order-1", a.owner, a.fencing_token, 3600)
    extended = item(raw, table, "order-1")
    assert extended is not None
    assert number(extended, "ttl") >= longer.timestamp() + store.default_retention - 1

    record = store.complete("order-1", a.owner, a.fencing_token, {"ok": True}, retention=3600)
    done = item(raw, table, "order-1")
    assert done is not None and record.expires_at is not None
    assert abs(number(done, "ttl") - number(done, "expires_at") / 1000) < 1
    assert abs(number(done, "ttl") - record.expires_at.timestamp()) < 1


# Requests that are retried ------------------------------------------------------------------------


def test_a_complete_retried_after_its_answer_was_lost_succeeds(
    store: DynamoDBStore, table: str, raw: Any
) -> None:
    """The first try stored the result; the retry must not report the lease lost (the
    caller would discard a result that is in fact stored)."""
    a = acquire(store, "order-1")
    with first_response_lost(store, "UpdateItem"):
        record = store.complete("order-1", a.owner, a.fencing_token, {"charged": 10})
    assert record.status is Status.COMPLETED and record.result == {"charged": 10}
    stored = store.get("order-1")
    assert stored is not None and stored.result == {"charged": 10}
    assert stored.fencing_token == a.fencing_token and stored.attempts == 1


def test_a_claim_retried_after_its_answer_was_lost_acquires(store: DynamoDBStore) -> None:
    with first_response_lost(store, "UpdateItem"):
        outcome = store.claim("order-1", None, LONG)
    assert isinstance(outcome, Acquired), outcome
    stored = store.get("order-1")
    assert stored is not None and stored.fencing_token == outcome.fencing_token
    assert outcome.attempt == 1 and stored.attempts == 1
    store.complete("order-1", outcome.owner, outcome.fencing_token, "done")
    assert isinstance(store.claim("order-1"), Completed)


def test_a_release_retried_after_its_answer_was_lost_succeeds(store: DynamoDBStore) -> None:
    a = acquire(store, "order-1")
    with first_response_lost(store, "UpdateItem"):
        record = store.release("order-1", a.owner, a.fencing_token)
    assert record.owner is None
    again = acquire(store, "order-1")
    assert again.fencing_token == a.fencing_token + 1


# Errors ------------------------------------------------------------------------------------------


def test_a_missing_table_is_not_provisioned(url: str, table: str, raw: Any) -> None:
    store = open_ddb(url)
    try:
        for call in (
            lambda: store.claim("k"),
            lambda: store.get("k"),
            lambda: store.complete("k", "owner", 1, None),
            store.scan,
            store.stats,
        ):
            with pytest.raises(NotProvisioned, match=table):
                bounded(call)
        assert table not in raw.list_tables()["TableNames"]  # asking created nothing
    finally:
        store.close()


@pytest.mark.usefixtures("aws_credentials")
def test_nothing_listening_is_store_unavailable_naming_the_endpoint() -> None:
    port = free_port()
    url = f"dynamodb://t-nobody?region=us-east-1&endpoint_url=http://{HOST}:{port}"

    def attempt() -> None:
        s = open_ddb(url)
        try:
            s.claim("k")
        finally:
            s.close()

    with pytest.raises(StoreUnavailable) as info:
        bounded(attempt)  # the defaults: connect_timeout 2s, a few attempts
    assert f"{HOST}:{port}" in str(info.value)


@pytest.mark.usefixtures("aws_credentials")
def test_a_frozen_server_is_store_unavailable_and_the_store_recovers(tmp_path: Path) -> None:
    server = MotoServer(tmp_path)
    try:
        server.start()
        store = open_ddb(server.url(unique_table(), read_timeout="1s", max_attempts=2))
        store.provision()
        kept = acquire(store, "kept")
        store.complete("kept", kept.owner, kept.fencing_token, {"n": 1})
        server.pause()  # connections are accepted, nothing is answered
        try:
            with pytest.raises(StoreUnavailable):
                bounded(lambda: store.claim("during"))
        finally:
            server.resume()
        replay = bounded(lambda: store.claim("kept"))
        assert isinstance(replay, Completed) and replay.record.result == {"n": 1}
        assert isinstance(bounded(lambda: store.claim("after")), Acquired)
        store.close()
    finally:
        server.stop()


@pytest.fixture
def hang_up_port() -> Iterator[int]:
    """A port on which something accepts connections and closes them without answering
    (a crashing endpoint, a load balancer resetting connections)."""
    listener = socket.create_server((HOST, 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(1)
                with contextlib.suppress(OSError):
                    conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@pytest.mark.usefixtures("aws_credentials")
def test_an_endpoint_that_hangs_up_is_store_unavailable(hang_up_port: int) -> None:
    store = open_ddb(f"dynamodb://t-x?region=us-east-1&endpoint_url=http://{HOST}:{hang_up_port}")
    try:
        with pytest.raises(StoreUnavailable):
            bounded(lambda: store.claim("k"))
    finally:
        store.close()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("lease_time", "30s"),  # a typo
        ("lease", "soon"),
        ("retention", "forever"),
        ("connect_timeout", "x"),
        ("read_timeout", "-"),
        ("max_attempts", "0"),
        ("max_attempts", "many"),
    ],
)
def test_a_bad_url_option_is_a_config_error(
    moto_server: MotoServer, option: str, value: str
) -> None:
    with pytest.raises(ConfigError, match=option):
        open_store(moto_server.url(unique_table(), **{option: value}))


@pytest.mark.parametrize("table", ["", "t", "ab", "no spaces", "x" * 256])
def test_a_url_without_a_table_dynamodb_allows_is_a_config_error(
    moto_server: MotoServer, table: str
) -> None:
    with pytest.raises(ConfigError, match="names no table DynamoDB allows"):
        open_store(f"dynamodb://{table}?region=us-east-1&endpoint_url={moto_server.endpoint_url}")


# Admin --------------------------------------------------------------------------------------------


def test_scan_returns_at_most_limit_records_and_pages_through_all(store: DynamoDBStore) -> None:
    for i in range(6):
        a = acquire(store, f"k{i}")
        store.complete(f"k{i}", a.owner, a.fencing_token, i)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        page = store.scan(limit=2, cursor=cursor)
        assert len(page.records) <= 2
        seen += [r.key for r in page.records]
        cursor = page.cursor
        if cursor is None:
            break
    assert sorted(seen) == [f"k{i}" for i in range(6)]


# The sequence guard ------------------------------------------------------------------------------


def entity_item(raw: Any, table: str, entity: str) -> dict[str, Any] | None:
    return item(raw, table, ENTITY_PREFIX + entity)


@pytest.mark.clock
def test_entities_are_items_of_the_table_that_keys_never_see(
    store: DynamoDBStore, table: str, raw: Any
) -> None:
    """An entity lives in the same table under a partition key no key can have, with the
    same TTL attribute; scan, stats, unlock_stale and purge of keys never see it."""
    a = acquire(store, "order-1")
    (reply,) = store.guard_many([Guard("order-1", 5, "order-1", a.fencing_token)], LONG)
    assert reply.verdict is Verdict.GO
    assert store.settle_many([Settle("order-1", 5, "order-1", a.fencing_token)], 3600) == [True]
    held = acquire(store, "order-2")  # holds an entity past its lock, unsettled
    (busy,) = store.guard_many([Guard("acct:9", 1, "order-2", held.fencing_token)], LONG)
    assert busy.verdict is Verdict.GO
    expire_lease(store, "order-2")
    expire_hold(store, "acct:9")
    kept = entity_item(raw, table, "order-1")
    assert kept is not None and kept["entity"]["S"] == "order-1"
    assert number(kept, "sequence") == 5 and kept["applied_key"]["S"] == "order-1"
    assert abs(number(kept, "ttl") - number(kept, "expires_at") / 1000) < 1
    assert number(kept, "ttl") >= time.time() + 3600 - 5

    assert sorted(r.key for r in store.scan().records) == ["order-1", "order-2"]
    assert [r.key for r in store.scan(stale_only=True).records] == ["order-2"]
    assert store.stats(exact=True).total == 2
    assert store.get(ENTITY_PREFIX + "order-1") is None  # not a key, whatever is asked
    assert store.unlock_stale() == ["order-2"]
    assert store.purge() == 0  # nothing past retention: neither keys nor entities
    assert store.count_entities() == 2
    assert entity_item(raw, table, "order-1") is not None


def test_purge_deletes_entities_past_retention_and_counts_them(
    store: DynamoDBStore, table: str, raw: Any
) -> None:
    a, b = acquire(store, "a"), acquire(store, "b")
    for name, sequence, holder in (("old", 1, a), ("kept", 2, b)):
        (reply,) = store.guard_many([Guard(name, sequence, holder.key, holder.fencing_token)])
        assert reply.verdict is Verdict.GO
        settled = store.settle_many(
            [Settle(name, sequence, holder.key, holder.fencing_token)], LONG
        )
        assert settled == [True]
    store.complete("a", a.owner, a.fencing_token, None, retention=LONG)
    expire_retention(store, "old", entity=True)
    expire_retention(store, "a")
    assert store.get_entity("old") is None  # past retention, still in the table
    assert entity_item(raw, table, "old") is not None
    assert store.count_entities() == 1
    assert store.purge(dry_run=True) == 2  # key "a" and entity "old"
    handled: list[int] = []
    assert store.purge(progress=handled.append) == 2 and sum(handled) == 2
    assert entity_item(raw, table, "old") is None and item(raw, table, "a") is None
    assert entity_item(raw, table, "kept") is not None
    assert store.purge() == 0


def test_an_entity_past_retention_starts_anew(store: DynamoDBStore, table: str, raw: Any) -> None:
    a, b = acquire(store, "a"), acquire(store, "b")
    store.guard_many([Guard("acct:1", 9, "a", a.fencing_token)])
    assert store.settle_many([Settle("acct:1", 9, "a", a.fencing_token)], LONG) == [True]
    expire_retention(store, "acct:1", entity=True)
    (reply,) = store.guard_many([Guard("acct:1", 2, "b", b.fencing_token)], LONG)
    assert (reply.verdict, reply.last) == (Verdict.GO, None)
    fresh = entity_item(raw, table, "acct:1")
    assert fresh is not None and fresh["holder"]["S"] == "b"
    assert {"sequence", "applied_key", "applied_at", "settled_by"}.isdisjoint(fresh)
    entity = store.get_entity("acct:1")
    assert entity is not None and entity.sequence is None and entity.key is None


def test_guard_and_settle_cost_one_request_each(store: DynamoDBStore) -> None:
    a, b = acquire(store, "a"), acquire(store, "b")
    with requests_sent(store) as sent:
        store.guard_many([Guard("acct:1", 1, "a", a.fencing_token)])
        store.guard_many([Guard("acct:1", 2, "b", b.fencing_token)])  # busy
        store.settle_many([Settle("acct:1", 1, "a", a.fencing_token)])
        store.guard_many([Guard("acct:1", 1, "b", b.fencing_token)])  # stale
    assert sent == ["UpdateItem"] * 4


def test_a_settle_retried_after_its_answer_was_lost_succeeds(store: DynamoDBStore) -> None:
    """The first try advanced the entity; the retry must not report the hold lost. A second
    settle of its own is refused all the same."""
    a = acquire(store, "a")
    store.guard_many([Guard("acct:1", 4, "a", a.fencing_token)])
    with first_response_lost(store, "UpdateItem"):
        assert store.settle_many([Settle("acct:1", 4, "a", a.fencing_token)]) == [True]
    entity = store.get_entity("acct:1")
    assert entity is not None and (entity.sequence, entity.holder) == (4, None)
    assert store.settle_many([Settle("acct:1", 4, "a", a.fencing_token)]) == [False]


def test_a_guard_retried_after_its_answer_was_lost_goes(store: DynamoDBStore) -> None:
    a = acquire(store, "a")
    with first_response_lost(store, "UpdateItem"):
        (reply,) = store.guard_many([Guard("acct:1", 4, "a", a.fencing_token)])
    assert (reply.verdict, reply.last) == (Verdict.GO, None)
    assert store.settle_many([Settle("acct:1", 4, "a", a.fencing_token)]) == [True]


def test_a_settle_that_does_not_advance_lets_go(store: DynamoDBStore) -> None:
    """Settling a sequence at or below the entity's (the condition refuses to advance) lets
    go of the entity without moving it back, as ``decide_settle`` does."""
    a, b = acquire(store, "a"), acquire(store, "b")
    store.guard_many([Guard("acct:1", 7, "a", a.fencing_token)])
    assert store.settle_many([Settle("acct:1", 7, "a", a.fencing_token)]) == [True]
    store.guard_many([Guard("acct:1", 8, "b", b.fencing_token)])
    assert store.settle_many([Settle("acct:1", 3, "b", b.fencing_token)]) == [True]
    entity = store.get_entity("acct:1")
    assert entity is not None and (entity.sequence, entity.key, entity.holder) == (7, "a", None)


def test_provisioning_says_the_guard_needs_nothing_more(url: str) -> None:
    store = open_ddb(url)
    try:
        for plan in (store.provision(dry_run=True), store.provision(), store.provision()):
            assert any("sequence guard" in note for note in plan.notes), plan.notes
    finally:
        store.close()
