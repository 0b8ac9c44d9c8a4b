"""The PostgreSQL store on a real server (tests/servers.py): what only PostgreSQL has, beyond
the contract suite (which runs on "postgres" too, the 8-process race included).

Tests share the session server ``postgres_server`` through schemas of their own; a test
that kills or restarts a server starts its own and stops it by PID. The handlers' own
effects go to tables of the test's own in the same database, so that "exactly once" is
counted in rows the handler wrote, never from return values.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import random
import re
import signal
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, TypeVar

import pytest
from psycopg import sql

from idemctl import (
    Acquired,
    Busy,
    ClaimRequest,
    Completed,
    LeaseLost,
    Status,
    fingerprint,
)
from idemctl.errors import ConfigError, NotProvisioned, StoreError, StoreUnavailable
from idemctl.model import Guard, Order, Settle, Stale, Verdict
from idemctl.resources import read_resource
from idemctl.runner import Context, Outcome, run
from idemctl.stores import open_store
from idemctl.stores.base import Store
from idemctl.stores.postgres import PostgresStore
from idemctl.stores.postgres.sql import provision_lock
from tests.backends import Backend, expire_retention, unique_schema
from tests.contract.race import race
from tests.killing import claims_across_a_kill
from tests.polling import wait_until
from tests.servers import PostgresServer, _children_of, free_port, pid_alive

T = TypeVar("T")
HANG = 30.0
"""No single store call may take longer than this: a bound that catches hangs, not speed."""
LONG = 60.0
WORKERS = 8
KEYS = [f"payment-{i:03d}" for i in range(200)]

LATEST = max(
    int(n)
    for n in re.findall(r"^-- migration (\d+)", read_resource("schemas", "postgres.sql"), re.M)
)
"""The schema version provision() brings a database to."""


def bounded(fn: Callable[[], T], timeout: float = HANG) -> T:
    """fn() in a thread: its result or its exception, or a failure if it hangs."""
    pool = ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout)
    except FutureTimeout:
        pytest.fail(f"store call still running after {timeout}s: it hangs")
    finally:
        pool.shutdown(wait=False)


@pytest.fixture
def schema() -> str:
    return unique_schema()


@pytest.fixture
def url(postgres_server: PostgresServer, schema: str) -> str:
    return postgres_server.url(schema=schema)


def open_pg(url: str) -> PostgresStore:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    return store


@pytest.fixture
def store(url: str) -> Iterator[PostgresStore]:
    s = open_pg(url)
    s.provision()
    yield s
    s.close()


@pytest.fixture
def db(postgres_server: PostgresServer) -> Iterator[Any]:
    """A plain autocommit connection, to look at what the store wrote."""
    conn = postgres_server.connect()
    yield conn
    conn.close()


@pytest.fixture
def effects_table(db: Any) -> Iterator[str]:
    """A table of the test's own (in ``public``), where handlers record their side effects."""
    name = f"effects_{uuid.uuid4().hex}"
    table = sql.Identifier("public", name)
    db.execute(sql.SQL("CREATE TABLE {} (key text NOT NULL, worker int NOT NULL)").format(table))
    yield name
    db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))


@pytest.fixture
def effects(effects_table: str) -> sql.Identifier:
    return sql.Identifier("public", effects_table)


def record_effect(conn: Any, table: sql.Identifier, key: str, worker: int = 0) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {} (key, worker) VALUES (%s, %s)").format(table), (key, worker)
    )


def effect_counts(db: Any, table: sql.Identifier) -> dict[str, int]:
    rows = db.execute(sql.SQL("SELECT key, count(*) FROM {} GROUP BY key").format(table))
    return {key: n for key, n in rows.fetchall()}


def schema_exists(db: Any, name: str) -> bool:
    row = db.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (name,)).fetchone()
    return bool(row[0])


def table_exists(db: Any, schema: str, table: str) -> bool:
    row = db.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = %s", (schema, table)
    ).fetchone()
    return bool(row[0])


def schema_version(db: Any, schema: str, prefix: str = "") -> int:
    table = sql.Identifier(schema, f"{prefix}schema_version")
    row = db.execute(sql.SQL("SELECT max(version) FROM {}").format(table)).fetchone()
    return int(row[0])


def acquire(store: PostgresStore, key: str, lease: float = LONG, fp: str | None = None) -> Acquired:
    outcome = store.claim(key, fp, lease)
    assert isinstance(outcome, Acquired), outcome
    return outcome


def run_until_settled(
    store: PostgresStore, key: str, handler: Callable[[Context], Any], **kw: Any
) -> Any:
    """run() again while the key is busy (a crashed holder's session may take a moment to
    end on the server), within the hang bound."""

    def settled() -> Any:
        result = bounded(lambda: run(store, key, handler, **kw))
        return result if result.outcome is not Outcome.BUSY else None

    return wait_until(settled, f"key {key!r} no longer busy", timeout=HANG)


def until_available(fn: Callable[[], T], timeout: float = HANG) -> T:
    """fn() retried while it raises StoreUnavailable (what a consumer's back-off does), each
    call bounded; fails if the store has not recovered within ``timeout``."""
    last: list[StoreUnavailable] = []

    def available() -> tuple[T] | None:
        try:
            return (bounded(fn),)
        except StoreUnavailable as exc:
            last[:] = [exc]
            return None

    (answer,) = wait_until(
        available, "the store available again", timeout, 0.1, detail=lambda: repr(last)
    )
    return answer


# The server helper itself --------------------------------------------------------------------


def test_server_helper_listens_on_loopback_restarts_and_leaves_no_process(tmp_path: Path) -> None:
    server = PostgresServer(tmp_path)
    try:
        server.start()
        first = server.pid
        assert first is not None and pid_alive(first)
        with server.connect() as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
            assert conn.execute("SHOW fsync").fetchone() == ("off",)
            conn.execute("CREATE TABLE kept (n int)")
            conn.execute("INSERT INTO kept VALUES (1)")
        backends = _children_of(first)
        assert backends

        server.restart()  # fast shutdown by PID, same port and data dir
        assert not pid_alive(first) and not any(pid_alive(p) for p in backends)
        assert server.pid != first and server.ready()

        killed, backends = server.pid, _children_of(server.pid or 0)
        server.kill()  # a crash: the postmaster and every backend are gone when kill returns
        assert killed is not None and not pid_alive(killed)
        assert not any(pid_alive(p) for p in backends)
        assert not server.ready()
        server.restart()  # crash recovery on the same port: committed rows are still there
        with server.connect() as conn:
            assert conn.execute("SELECT n FROM kept").fetchall() == [(1,)]
    finally:
        last = server.pid
        server.remove()
    assert last is not None and not pid_alive(last)
    assert not server.ready()
    assert not server.data.exists() or not server.as_root


# URLs ------------------------------------------------------------------------------------------


def test_both_schemes_open_the_postgres_store(postgres_server: PostgresServer) -> None:
    schema = unique_schema()
    for scheme in ("postgresql", "postgres"):
        store = open_pg(postgres_server.url(scheme=scheme, schema=schema))
        try:
            assert isinstance(store, PostgresStore)
            store.provision()
            assert isinstance(store.claim(f"via-{scheme}"), Acquired)
        finally:
            store.close()


def test_unknown_url_option_is_a_config_error(postgres_server: PostgresServer) -> None:
    with pytest.raises(ConfigError, match="prefx"):
        open_pg(postgres_server.url(schema=unique_schema(), prefx="a_"))
    with pytest.raises(ConfigError):
        open_pg(postgres_server.url(schema=unique_schema(), lock_timeout="soon"))


# Provisioning ----------------------------------------------------------------------------------


def test_provision_twice_changes_nothing_the_second_time(url: str, db: Any, schema: str) -> None:
    store = open_pg(url)
    try:
        first = store.provision()
        assert first.changed is True and first.dry_run is False and first.statements
        assert schema_version(db, schema) == LATEST
        second = store.provision()
        assert second.changed is False
        assert second.statements == []
        assert store.provision(dry_run=True).statements == []
    finally:
        store.close()


def test_dry_run_lists_the_sql_and_creates_nothing(url: str, db: Any, schema: str) -> None:
    store = open_pg(url)
    try:
        plan = store.provision(dry_run=True)
        assert plan.dry_run is True and plan.changed is False
        text = "\n".join(plan.statements)
        assert "CREATE" in text.upper()
        assert schema in text
        for table in ("keys", "outbox", "schema_version", "entities"):
            assert table in text
        assert not schema_exists(db, schema)  # nothing was created, not even the schema
        with pytest.raises(NotProvisioned):
            store.claim("k")

        done = store.provision()
        assert done.changed is True
        assert done.statements == plan.statements  # the dry run showed exactly what ran
    finally:
        store.close()


def test_dry_run_sql_run_by_hand_provisions_the_store(url: str, db: Any, schema: str) -> None:
    """What an operator gets from a dry run is complete: a DBA can run it instead."""
    store = open_pg(url)
    try:
        plan = store.provision(dry_run=True)
        with db.transaction():
            for statement in plan.statements:
                db.execute(statement)
        assert schema_version(db, schema) == LATEST
        assert store.provision().changed is False
        a = acquire(store, "k")
        store.complete("k", a.owner, a.fencing_token, {"ok": True})
        replay = store.claim("k")
        assert isinstance(replay, Completed) and replay.record.result == {"ok": True}
    finally:
        store.close()


def test_an_older_schema_is_upgraded(url: str, db: Any, schema: str) -> None:
    store = open_pg(url)
    try:
        old = store.provision(upto=1)
        assert old.changed is True
        assert schema_version(db, schema) == 1
        assert table_exists(db, schema, "keys")
        assert not table_exists(db, schema, "outbox")

        plan = store.provision(dry_run=True)
        assert plan.statements and "outbox" in "\n".join(plan.statements)
        assert not table_exists(db, schema, "outbox")
        upgrade = store.provision()
        assert upgrade.changed is True
        assert upgrade.statements == plan.statements
        assert schema_version(db, schema) == LATEST
        assert table_exists(db, schema, "outbox")
        assert store.provision().changed is False

        a = acquire(store, "after-upgrade")
        store.complete("after-upgrade", a.owner, a.fencing_token, 1)
        assert isinstance(store.claim("after-upgrade"), Completed)
    finally:
        store.close()


def test_provision_from_several_workers_at_once(url: str, db: Any, schema: str) -> None:
    """Workers that all run provision on start-up must not trip over each other."""
    stores = [open_pg(url) for _ in range(4)]
    barrier = threading.Barrier(len(stores))

    def provision(s: Store) -> Any:
        barrier.wait()
        return s.provision()

    try:
        with ThreadPoolExecutor(len(stores)) as pool:
            futures = [pool.submit(provision, s) for s in stores]
            done = [f.result(timeout=HANG) for f in futures]
        assert any(p.changed for p in done)
        assert schema_version(db, schema) == LATEST
        assert all(isinstance(s.claim(f"k-{i}"), Acquired) for i, s in enumerate(stores))
    finally:
        for s in stores:
            s.close()


def test_provision_waits_out_another_provisioner(
    url: str, db: Any, postgres_server: PostgresServer
) -> None:
    """A provisioner that holds the schema's lock longer than the claims' lock_timeout
    (0.1 s; seen under load with four workers starting at once) is waited for."""
    store = open_pg(url)
    look = postgres_server.connect()  # outside db's transaction, which pins what it sees
    try:
        with ThreadPoolExecutor(1) as pool:
            with db.transaction():
                db.execute(provision_lock(store.names))
                holder = db.execute("SELECT pg_backend_pid()").fetchone()[0]

                def waited_long() -> bool:
                    # The provisioner's backend, by the server's clock, has waited for the
                    # lock five times the claims' lock_timeout.
                    (n,) = look.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                        " AND %s = ANY(pg_blocking_pids(pid))"
                        " AND clock_timestamp() - query_start > interval '0.5 s'",
                        (holder,),
                    ).fetchone()
                    return n > 0 or later.done()

                later = pool.submit(store.provision)
                wait_until(waited_long, "the provisioner waiting for the lock for 0.5 s")
                assert not later.done()  # waiting, not failed with LockTimeout
            assert later.result(timeout=HANG).changed
        assert isinstance(store.claim("k"), Acquired)
    finally:
        look.close()
        store.close()


@pytest.mark.parametrize(
    ("schema_name", "prefix"),
    [("Idem Test", "my-app_"), ("idem-Ünïcode", "Ω.")],
)
def test_schema_names_and_prefixes_that_need_quoting(
    postgres_server: PostgresServer, db: Any, schema_name: str, prefix: str
) -> None:
    schema_name = f"{schema_name} {uuid.uuid4().hex[:12]}"
    store = open_pg(postgres_server.url(schema=schema_name, prefix=prefix))
    plain = open_pg(postgres_server.url(schema=schema_name))  # same schema, no prefix
    try:
        store.provision()
        plain.provision()
        assert schema_exists(db, schema_name)
        for table in ("keys", "outbox", "schema_version", "entities"):
            assert table_exists(db, schema_name, prefix + table), table
            assert table_exists(db, schema_name, table), table
        assert schema_version(db, schema_name, prefix) == LATEST

        a = acquire(store, "order-1", fp=fingerprint({"n": 1}))
        store.complete("order-1", a.owner, a.fencing_token, {"by": "prefixed"})
        acquire(plain, "order-2")
        # The two prefixes are two stores: neither sees the other's keys.
        assert plain.get("order-1") is None and store.get("order-2") is None
        assert [r.key for r in store.scan().records] == ["order-1"]
        assert store.stats().total == 1
        replay = store.claim("order-1", fingerprint({"n": 1}))
        assert isinstance(replay, Completed) and replay.record.result == {"by": "prefixed"}
        with store.transaction("order-3") as unit:
            assert isinstance(unit.outcome, Acquired)
            unit.complete("in a transaction")
        record = store.get("order-3")
        assert record is not None and record.result == "in a transaction"
    finally:
        store.close()
        plain.close()


def test_an_unprovisioned_schema_raises_not_provisioned(url: str, db: Any, schema: str) -> None:
    store = open_pg(url)
    try:
        for call in (
            lambda: store.claim("k"),
            lambda: store.get("k"),
            lambda: store.complete("k", "owner", 1, None),
            store.scan,
            store.stats,
        ):
            with pytest.raises(NotProvisioned):
                bounded(call)

        def open_a_transaction() -> None:
            with store.transaction("k"):
                pass

        with pytest.raises(NotProvisioned):
            bounded(open_a_transaction)
        with pytest.raises(NotProvisioned):
            run(store, "k", lambda ctx: None, transactional=True)
        assert not schema_exists(db, schema)  # asking did not create anything
    finally:
        store.close()


# Transactional mode ------------------------------------------------------------------------------


def test_transaction_commits_effects_and_completion_together(
    store: PostgresStore, db: Any, effects: sql.Identifier
) -> None:
    with store.transaction("order-1", fingerprint({"n": 1})) as unit:
        assert isinstance(unit.outcome, Acquired)
        record_effect(unit.connection, effects, "order-1")
        # Not visible outside the transaction yet: neither the effect nor the claim's result.
        assert effect_counts(db, effects) == {}
        unit.complete({"charged": 10})
    assert effect_counts(db, effects) == {"order-1": 1}
    record = store.get("order-1")
    assert record is not None and record.status is Status.COMPLETED
    assert record.result == {"charged": 10}

    with store.transaction("order-1", fingerprint({"n": 1})) as again:
        assert isinstance(again.outcome, Completed)
        assert again.outcome.record.result == {"charged": 10}
    assert effect_counts(db, effects) == {"order-1": 1}


def test_transactional_claims_never_turn_the_fencing_counter_back(
    store: PostgresStore, db: Any
) -> None:
    first = acquire(store, "order-1")
    store.release("order-1", first.owner, first.fencing_token)
    held = acquire(store, "order-1")
    store.forget("order-1", force=True)
    with store.transaction("order-1", lease=LONG) as unit:
        assert isinstance(unit.outcome, Acquired)
        assert unit.outcome.takeover is False
        assert unit.outcome.fencing_token == held.fencing_token + 1  # the tombstone kept it
        done = unit.complete("second life", retention=LONG)
    expire_retention(store, "order-1")
    assert store.purge() == 1
    # No row left: the counter starts again at the server's clock in µs, above every token.
    (now_us,) = db.execute(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    ).fetchone()
    with store.transaction("order-1", lease=LONG) as unit:
        assert isinstance(unit.outcome, Acquired)
        assert done.fencing_token < now_us <= unit.outcome.fencing_token
        unit.complete("third life")


def test_an_exception_in_the_block_rolls_back_everything_the_claim_included(
    store: PostgresStore, db: Any, effects: sql.Identifier
) -> None:
    def crash_in_the_block() -> None:
        with store.transaction("order-1", lease=LONG) as unit:
            assert isinstance(unit.outcome, Acquired)
            record_effect(unit.connection, effects, "order-1")
            raise RuntimeError("handler blew up")

    with pytest.raises(RuntimeError, match="handler blew up"):
        crash_in_the_block()
    assert effect_counts(db, effects) == {}
    assert store.get("order-1") is None
    # The key is free at once: no lease to wait out, and no attempt left behind.
    again = acquire(store, "order-1")
    assert (again.attempt, again.takeover) == (1, False)


def test_a_concurrent_duplicate_is_busy_at_once(store: PostgresStore) -> None:
    holding = threading.Event()
    release = threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with store.transaction("order-1", lease=LONG) as unit:
                assert isinstance(unit.outcome, Acquired)
                holding.set()
                assert release.wait(HANG)
                unit.complete({"by": "holder"})
        except BaseException as exc:
            errors.append(exc)
            holding.set()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert holding.wait(HANG) and not errors, errors

        def second_transaction() -> Any:
            with store.transaction("order-1", lease=LONG) as unit:
                assert unit.connection is None or not isinstance(unit.outcome, Acquired)
                return unit.outcome

        # A bound that catches blocking (the holder waits up to HANG), not a speed test.
        assert isinstance(bounded(second_transaction, 5.0), Busy)
        assert isinstance(bounded(lambda: store.claim("order-1", None, LONG), 5.0), Busy)
        duplicate = bounded(
            lambda: run(store, "order-1", lambda ctx: "dup", transactional=True),
            5.0,
        )
        assert duplicate.outcome is Outcome.BUSY
    finally:
        release.set()
        thread.join(HANG)
    assert not thread.is_alive() and errors == []
    replay = store.claim("order-1")
    assert isinstance(replay, Completed) and replay.record.result == {"by": "holder"}


def test_unlock_and_forget_wait_out_a_brief_lock_and_give_up_on_a_long_one(
    store: PostgresStore, db: Any
) -> None:
    from idemctl.stores.postgres import ADMIN_LOCK_WAIT

    for key in ("brief", "long"):
        claimed = store.claim(key, None, LONG)
        assert isinstance(claimed, Acquired)
    table = sql.SQL(store.keys_table)

    def hold(key: str, locked: threading.Event, release: threading.Event, most: float) -> None:
        with db.transaction():
            db.execute(sql.SQL("SELECT 1 FROM {} WHERE key = %s FOR UPDATE").format(table), (key,))
            locked.set()
            release.wait(most)

    # Two operators on one key, or an admin command's own transaction: waited out.
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=("brief", locked, release, 0.5))
    holder.start()
    assert locked.wait(HANG)
    record = bounded(lambda: store.unlock("brief", force=True))
    holder.join(HANG)
    assert record.owner is None
    # A handler's transaction that outlasts the wait: a clear error, and nothing changed.
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold, args=("long", locked, release, HANG))
    holder.start()
    try:
        assert locked.wait(HANG)
        for call in (lambda: store.unlock("long", force=True), lambda: store.forget("long", True)):
            with pytest.raises(StoreError, match=rf"in progress \(waited {ADMIN_LOCK_WAIT:g}s\)"):
                bounded(call)
    finally:
        release.set()
        holder.join(HANG)
    after = store.get("long")
    assert after is not None and after.owner is not None


def test_a_batch_with_one_key_held_by_a_transaction_is_busy_only_there(
    store: PostgresStore,
) -> None:
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:
        with store.transaction("held", lease=LONG) as unit:
            holding.set()
            release.wait(HANG)
            unit.complete("by the holder")

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert holding.wait(HANG)
        requests = [ClaimRequest("before"), ClaimRequest("held"), ClaimRequest("after")]
        outcomes = bounded(lambda: store.claim_many(requests, lease=LONG), 5.0)
        assert [type(o) for o in outcomes] == [Acquired, Busy, Acquired]
    finally:
        release.set()
        thread.join(HANG)
    assert isinstance(store.claim("held"), Completed)


def test_an_older_schema_gets_the_entities_table(url: str, db: Any, schema: str) -> None:
    store = open_pg(url)
    try:
        store.provision(upto=3)
        assert not table_exists(db, schema, "entities")
        schema_finding = {f.name: f for f in store.check()}["schema"]
        assert not schema_finding.ok and schema_finding.fix == "run 'idemctl init'"
        a = acquire(store, "k")
        with pytest.raises(NotProvisioned, match="upgrade"):
            store.guard_many([Guard("acct:1", 1, "k", a.fencing_token)])
        assert store.purge() == 0  # an older schema still purges its keys
        plan = store.provision(dry_run=True)
        assert any("entities" in statement for statement in plan.statements)
        store.provision()
        assert table_exists(db, schema, "entities")
        assert {f.name: f for f in store.check()}["schema"].ok
        (reply,) = store.guard_many([Guard("acct:1", 1, "k", a.fencing_token)])
        assert reply.verdict is Verdict.GO
    finally:
        store.close()


def test_purge_deletes_entities_past_retention(store: PostgresStore) -> None:
    a = acquire(store, "k")
    store.guard_many([Guard("acct:1", 1, "k", a.fencing_token)])
    assert store.settle_many([Settle("acct:1", 1, "k", a.fencing_token)], retention=LONG)
    store.complete("k", a.owner, a.fencing_token, retention=LONG)
    expire_retention(store, "acct:1", entity=True)
    expire_retention(store, "k")
    assert store.purge(dry_run=True) == 2
    assert store.purge() == 2  # the key and the entity
    assert store.count_entities() == 0 and store.purge() == 0


def test_transactional_order_runs_only_newer_events_and_advances_with_the_handler(
    store: PostgresStore, db: Any, effects: sql.Identifier
) -> None:
    acct = "acct:1"

    def crash(key: str, sequence: int) -> None:
        with store.transaction(key, lease=LONG, order=Order(acct, sequence)) as unit:
            assert isinstance(unit.outcome, Acquired)
            record_effect(unit.connection, effects, key)
            unit.complete("applied")
            raise RuntimeError("handler blew up after complete")

    # An exception in the block: the handler's SQL, the key and the entity's advance all
    # roll back together.
    with pytest.raises(RuntimeError, match="blew up"):
        crash("event-5", 5)
    assert effect_counts(db, effects) == {}
    assert store.get("event-5") is None and store.get_entity(acct) is None

    with store.transaction("event-5", lease=LONG, order=Order(acct, 5)) as unit:
        assert isinstance(unit.outcome, Acquired)
        record_effect(unit.connection, effects, "event-5")
        unit.complete("applied 5")
        # Not visible outside the transaction yet.
        assert store.get_entity(acct) is None
    entity = store.get_entity(acct)
    assert entity is not None
    assert (entity.sequence, entity.key, entity.holder) == (5, "event-5", None)
    assert entity.applied_at is not None and entity.expires_at is not None

    # Older and equal events are stale: not run, their keys completed with a null result.
    for key, sequence in (("event-4", 4), ("event-5-again", 5)):
        with store.transaction(key, lease=LONG, order=Order(acct, sequence)) as stale:
            assert stale.outcome == Stale(acct, sequence, 5)
            assert stale.connection is None
        replay = store.claim(key)
        assert isinstance(replay, Completed) and replay.record.result is None
    assert effect_counts(db, effects) == {"event-5": 1}

    with store.transaction("event-6", lease=LONG, order=Order(acct, 6)) as unit:
        assert isinstance(unit.outcome, Acquired)
        record_effect(unit.connection, effects, "event-6")
        unit.complete("applied 6")
    entity = store.get_entity(acct)
    assert entity is not None and (entity.sequence, entity.key) == (6, "event-6")
    assert effect_counts(db, effects) == {"event-5": 1, "event-6": 1}
    # The non-transactional guard agrees with what the transactions wrote.
    late = acquire(store, "late-5")
    (reply,) = store.guard_many([Guard(acct, 5, "late-5", late.fencing_token)])
    assert (reply.verdict, reply.last) == (Verdict.STALE, 6)


def test_two_transactions_on_one_entity(
    store: PostgresStore, db: Any, effects: sql.Identifier
) -> None:
    acct = "acct:1"
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with store.transaction("event-7", lease=LONG, order=Order(acct, 7)) as unit:
                assert isinstance(unit.outcome, Acquired)
                record_effect(unit.connection, effects, "event-7")
                holding.set()
                assert release.wait(HANG)
                unit.complete("applied 7")
        except BaseException as exc:
            errors.append(exc)
            holding.set()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert holding.wait(HANG) and not errors, errors

        def second(key: str, sequence: int) -> Any:
            with store.transaction(key, lease=LONG, order=Order(acct, sequence)) as unit:
                assert unit.connection is None
                return unit.outcome

        # Another transaction on the entity (another key): busy at once, its claim undone.
        assert bounded(lambda: second("event-8", 8), 5.0) == Busy(None)
        assert store.get("event-8") is None
        # A guard outside transactions waits lock_timeout at most, then says busy.
        other = acquire(store, "outside-9")
        (reply,) = bounded(
            lambda: store.guard_many([Guard(acct, 9, "outside-9", other.fencing_token)]), 5.0
        )
        assert reply.verdict is Verdict.BUSY
        store.release("outside-9", other.owner, other.fencing_token)
    finally:
        release.set()
        thread.join(HANG)
    assert not thread.is_alive() and errors == []
    entity = store.get_entity(acct)
    assert entity is not None and (entity.sequence, entity.key) == (7, "event-7")

    # After the commit: the older event is stale and never runs, the newer one runs.
    ran: list[str] = []
    for key, sequence in (("event-6", 6), ("event-8", 8)):
        with store.transaction(key, lease=LONG, order=Order(acct, sequence)) as unit:
            if isinstance(unit.outcome, Acquired):
                ran.append(key)
                record_effect(unit.connection, effects, key)
                unit.complete(f"applied {sequence}")
            else:
                assert unit.outcome == Stale(acct, 6, 7)
    assert ran == ["event-8"]
    assert effect_counts(db, effects) == {"event-7": 1, "event-8": 1}
    entity = store.get_entity(acct)
    assert entity is not None and (entity.sequence, entity.key) == (8, "event-8")


def test_a_live_hold_from_the_guard_makes_a_transaction_busy(store: PostgresStore) -> None:
    acct = "acct:1"
    held = acquire(store, "outside")
    (reply,) = store.guard_many([Guard(acct, 3, "outside", held.fencing_token)], LONG)
    assert reply.verdict is Verdict.GO
    with store.transaction("inside", lease=LONG, order=Order(acct, 4)) as unit:
        assert unit.outcome == Busy(None) and unit.connection is None
    assert store.get("inside") is None  # rolled back: free for its next delivery
    # Stale first, whoever holds the entity: an event at or below the last applied one.
    assert store.settle_many([Settle(acct, 3, "outside", held.fencing_token)]) == [True]
    again = acquire(store, "outside-2")
    store.guard_many([Guard(acct, 10, "outside-2", again.fencing_token)], LONG)
    with store.transaction("inside-old", lease=LONG, order=Order(acct, 2)) as unit:
        assert unit.outcome == Stale(acct, 2, 3)
    # Once the hold is let go, the transaction runs and clears it as it advances.
    assert store.settle_many([Settle(acct, 10, "outside-2", again.fencing_token, False)])
    with store.transaction("inside", lease=LONG, order=Order(acct, 4)) as unit:
        assert isinstance(unit.outcome, Acquired)
        unit.complete("applied 4")
    entity = store.get_entity(acct)
    assert entity is not None and (entity.sequence, entity.holder) == (4, None)


def test_a_block_that_never_completes_is_rolled_back(
    store: PostgresStore, db: Any, effects: sql.Identifier
) -> None:
    def forgetful() -> None:
        with store.transaction("order-1", lease=LONG) as unit:
            assert isinstance(unit.outcome, Acquired)
            record_effect(unit.connection, effects, "order-1")

    with pytest.raises(StoreError, match="complete"):
        forgetful()
    assert effect_counts(db, effects) == {}
    assert store.get("order-1") is None


def test_a_transaction_whose_connection_dies_fails_closed(store: PostgresStore, db: Any) -> None:
    """The server ends the session (a restart, a failover, an admin): complete() inside the
    block and the block itself raise StoreUnavailable, and nothing is recorded."""
    inside: list[BaseException] = []

    def block() -> None:
        with store.transaction("order-1", lease=LONG) as unit:
            assert isinstance(unit.outcome, Acquired) and unit.connection is not None
            db.execute("SELECT pg_terminate_backend(%s)", (unit.connection.info.backend_pid,))
            try:
                unit.complete("never stored")
            except Exception as exc:
                inside.append(exc)
                raise

    with pytest.raises(StoreUnavailable):
        bounded(block)
    assert len(inside) == 1 and isinstance(inside[0], StoreUnavailable), inside
    assert store.get("order-1") is None
    assert isinstance(store.claim("order-1"), Acquired)  # the store carries on


def test_pool_max_caps_the_connections_a_store_opens(
    postgres_server: PostgresServer, db: Any, schema: str
) -> None:
    app = f"t_{uuid.uuid4().hex[:12]}"  # to find this store's sessions on the server
    store = open_pg(
        postgres_server.url(schema=schema, pool_max=2, connect_timeout="1s", application_name=app)
    )
    store.provision()
    holding, release = threading.Barrier(3), threading.Event()

    def holder(key: str) -> None:
        with store.transaction(key, lease=LONG) as unit:
            holding.wait(HANG)
            release.wait(HANG)
            unit.complete(key)

    def sessions() -> int:
        query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        return int(db.execute(query, (app,)).fetchone()[0])

    threads = [threading.Thread(target=holder, args=(f"held-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        holding.wait(HANG)  # both pooled connections are in open transactions now
        peak = sessions()
        for key in ("more-0", "more-1", "more-2"):  # a third worker keeps trying meanwhile
            with contextlib.suppress(StoreUnavailable):
                bounded(functools.partial(store.claim, key))
            peak = max(peak, sessions())
    finally:
        release.set()
        for t in threads:
            t.join(HANG)
        store.close()
    assert peak <= 2, f"a store with pool_max=2 had {peak} sessions open on the server"


# A worker killed inside its transaction ---------------------------------------------------------


def _crash_child(url: str, table: str, key: str, claimed: Any, go: Any) -> None:
    """Runs in a spawned process: the handler writes its effect, then the process dies."""
    store = open_pg(url)

    def handler(ctx: Context) -> None:
        record_effect(ctx.connection, sql.Identifier("public", table), ctx.key, os.getpid())
        claimed.set()
        go.wait(HANG)
        os.kill(os.getpid(), signal.SIGKILL)  # before returning: nothing is committed

    run(store, key, handler, lease=LONG, transactional=True)


def test_a_worker_killed_mid_transaction_leaves_no_trace(
    store: PostgresStore, url: str, db: Any, effects_table: str, effects: sql.Identifier
) -> None:
    ctx = multiprocessing.get_context("spawn")
    claimed, go = ctx.Event(), ctx.Event()
    child = ctx.Process(target=_crash_child, args=(url, effects_table, "order-1", claimed, go))
    child.start()
    try:
        assert claimed.wait(HANG), f"the child never ran its handler (exit {child.exitcode})"
        # While its transaction is open the key is held, with no lease to wait out later.
        assert isinstance(bounded(lambda: store.claim("order-1", None, LONG), 5.0), Busy)
        go.set()
        child.join(HANG)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
            child.join()

    assert effect_counts(db, effects) == {}
    record = store.get("order-1")
    assert record is None or record.status is not Status.COMPLETED

    runs: list[int] = []

    def handler(c: Context) -> str:
        runs.append(c.attempt)
        record_effect(c.connection, effects, c.key)
        return "charged once"

    retry = run_until_settled(store, "order-1", handler, transactional=True)
    assert retry.outcome is Outcome.EXECUTED and retry.result == "charged once"
    assert run_until_settled(store, "order-1", handler, transactional=True).outcome is (
        Outcome.REPLAYED
    )
    assert len(runs) == 1
    assert effect_counts(db, effects) == {"order-1": 1}
    record = store.get("order-1")
    assert record is not None and record.status is Status.COMPLETED
    # The crash left nothing behind: the retry's claim was the key's first.
    assert record.fencing_token == retry.fencing_token and record.attempts == 1


# 8 processes race in transactional mode --------------------------------------------------------


def _race_worker(
    store: Store, keys: list[Any], table: str, worker: int, barrier: Any
) -> dict[str, Any]:
    """One worker of the race (tests.contract.race): every key through
    run(transactional=True), Busy retried; effects go to ``table``."""
    effects = sql.Identifier("public", table)

    def handler(ctx: Context) -> dict[str, int]:
        record_effect(ctx.connection, effects, ctx.key, worker)
        time.sleep(0.001)  # widen the window in which another worker could slip in
        return {"worker": worker}

    counts = {"executed": 0, "replayed": 0, "busy": 0, "other": 0}
    pending = random.Random(worker).sample(keys, len(keys))
    barrier.wait()

    def one_pass() -> bool:
        """Every pending key run once more; whether none is left busy."""
        nonlocal pending
        busy: list[Any] = []
        for key in pending:
            result = run(
                store, key, handler, fingerprint=fingerprint(key), lease=30, transactional=True
            )
            if result.outcome is Outcome.BUSY:
                busy.append(key)
                counts["busy"] += 1
            elif result.outcome in (Outcome.EXECUTED, Outcome.REPLAYED):
                counts[result.outcome.value] += 1
            else:
                counts["other"] += 1
        pending = busy
        return not pending

    wait_until(one_pass, f"worker {worker}: every key run to an end", timeout=120, interval=0.005)
    return counts


@pytest.mark.slow
def test_race_in_transactional_mode_runs_every_effect_once(
    store: PostgresStore, url: str, db: Any, effects_table: str
) -> None:
    backend = Backend("postgres", url, lambda: open_pg(url))
    results = race(backend, _race_worker, [KEYS] * WORKERS, effects_table)

    table = sql.Identifier("public", effects_table)
    rows = db.execute(sql.SQL("SELECT key, worker FROM {}").format(table)).fetchall()
    runs = Counter(key for key, _ in rows)
    assert set(runs) == set(KEYS)
    assert [k for k, n in runs.items() if n != 1] == []
    assert sum(c["executed"] for c in results.values()) == len(KEYS)
    for counts in results.values():
        assert counts["other"] == 0
        assert counts["executed"] + counts["replayed"] == len(KEYS)
    ran_by = dict(rows)
    for key in KEYS:
        record = store.get(key)
        assert record is not None and record.status is Status.COMPLETED
        assert record.result == {"worker": ran_by[key]}  # the run whose effect committed
        assert record.attempts == 1  # one claim committed: nobody took it over


# A server that dies ---------------------------------------------------------------------------


def test_killed_server_gives_store_unavailable_and_the_same_store_recovers(
    tmp_path: Path,
) -> None:
    server = PostgresServer(tmp_path)
    try:
        server.start()
        store = open_pg(server.url(schema=unique_schema(), connect_timeout="1s"))
        store.provision()
        kept = acquire(store, "kept")
        store.complete("kept", kept.owner, kept.fencing_token, {"n": 1})

        killed = threading.Event()

        def kill() -> None:
            server.kill()
            killed.set()

        # A transaction is open when the server dies: its block must fail closed.
        holding = threading.Event()
        block_error: list[BaseException] = []

        def in_flight() -> None:
            try:
                with store.transaction("in-flight", lease=LONG) as unit:
                    assert isinstance(unit.outcome, Acquired)
                    holding.set()
                    assert killed.wait(HANG * 2)
                    unit.complete("never stored")
            except BaseException as exc:
                block_error.append(exc)
            finally:
                holding.set()

        holder = threading.Thread(target=in_flight, daemon=True)
        holder.start()
        assert holding.wait(HANG) and not block_error, block_error
        claims_across_a_kill(store, kill, warmup=50, after=3, hang=HANG, lease=LONG)

        holder.join(HANG)
        assert not holder.is_alive(), "a transaction block hangs after the kill"
        assert len(block_error) == 1 and isinstance(block_error[0], StoreUnavailable), block_error
        for call in (lambda: store.get("kept"), store.stats, store.provision):
            with pytest.raises(StoreUnavailable):
                bounded(call)

        server.restart()  # same port and data dir, after crash recovery
        # The pool reconnects in the background: until it has, calls still fail closed.
        replay = until_available(lambda: store.claim("kept"))
        assert isinstance(replay, Completed) and replay.record.result == {"n": 1}
        assert bounded(lambda: store.get("in-flight")) is None  # rolled back by the crash
        outcome = bounded(lambda: store.claim("after-restart"))
        assert isinstance(outcome, Acquired)
        store.complete("after-restart", outcome.owner, outcome.fencing_token, "ok")
        with store.transaction("tx-after-restart") as unit2:
            assert isinstance(unit2.outcome, Acquired)
            unit2.complete("ok")
        record = store.get("tx-after-restart")
        assert record is not None and record.result == "ok"
        store.close()
    finally:
        server.remove()


@pytest.mark.slow
def test_the_store_works_soon_after_a_longer_outage_ends(tmp_path: Path) -> None:
    """A pool that backs off exponentially while the server is down would keep failing
    for about as long again after it is back (1, 2, 4, 8 s... between attempts)."""
    server = PostgresServer(tmp_path)
    try:
        server.start()
        store = open_pg(server.url(schema=unique_schema(), connect_timeout="1s"))
        store.provision()
        acquire(store, "before")
        server.kill()
        down = time.monotonic()
        # Down for 8 s at least, a worker failing closed and retrying meanwhile: the outage's
        # length, in real time, is what the test is about (the pool's back-off runs on it).
        while time.monotonic() - down < 8.0:
            with pytest.raises(StoreUnavailable):
                bounded(lambda: store.claim("during"))
            time.sleep(0.5)
        server.restart()
        assert server.ready()
        # The server answers now: a retrying caller is back at work within a couple of its
        # own timeouts (connect_timeout=1s), not after a back-off that grew with the outage.
        outcome = until_available(lambda: store.claim("after"), timeout=2.0)
        assert isinstance(outcome, Acquired)
        store.close()
    finally:
        server.remove()


def test_nothing_listening_is_store_unavailable_naming_the_host() -> None:
    port = free_port()
    url = f"postgresql://test:s3cret@127.0.0.1:{port}/postgres?connect_timeout=1s"

    def attempt() -> None:
        s = open_pg(url)
        try:
            s.claim("k")
        finally:
            s.close()

    with pytest.raises(StoreUnavailable) as info:
        bounded(attempt)
    message = str(info.value)
    assert "127.0.0.1" in message and str(port) in message
    shown = "".join(traceback.format_exception(info.value))
    assert "s3cret" not in shown


# Passwords ---------------------------------------------------------------------------------------


def test_a_password_in_the_url_is_never_shown(postgres_server: PostgresServer, db: Any) -> None:
    schema = unique_schema()
    url = postgres_server.url(password="s3cret", schema=schema)  # trust auth accepts any
    store = open_pg(url)
    try:
        assert "s3cret" not in store.url and "s3cret" not in repr(store)
        assert "***" in store.url
        shown: list[str] = []
        with pytest.raises(NotProvisioned) as info:
            store.claim("k")
        shown.append("".join(traceback.format_exception(info.value)))
        plan = store.provision(dry_run=True)
        shown += plan.statements + plan.notes
        store.provision()
        a = acquire(store, "k")
        store.complete("k", a.owner, a.fencing_token, "ok")
        shown += [f"{f.name} {f.detail} {f.fix}" for f in store.check()]
        with pytest.raises(LeaseLost) as lost:
            store.complete("k", a.owner, a.fencing_token, "again")
        shown.append("".join(traceback.format_exception(lost.value)))
        assert all("s3cret" not in text for text in shown)
    finally:
        store.close()
