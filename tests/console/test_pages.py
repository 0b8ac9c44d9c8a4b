"""The console over HTTP, against real ``idemctl console`` processes: every page and its
``/api/`` document (the ``--json`` document of the same command, checked against its
schema), the entities, the outbox on PostgreSQL with a replay to a real broker, an audit
of a real group, a Powertools table through the same pages, and what a security review
tries: forged and cross-site forms, a planted session, paths out of ``/static``, a user
header from an address that is no proxy, a read-only console, the store's password."""

from __future__ import annotations

import http.client
import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from idemctl import open_store
from idemctl.model import ClaimRequest, Guard
from tests.backends import expire_lease
from tests.cli.helpers import validate
from tests.console.conftest import PASSWORDS, ConsoleProcess
from tests.servers import HOST, KafkaBroker, RedisServer


def valid(name: str, document: dict[str, Any]) -> None:
    """``document`` follows ``schemas/<name>.schema.json`` (the console's own
    ``result_masked`` and what an action's dry run asks to send back aside)."""
    mine = ("result_masked", "confirm", "preview", "fields", "selection", "bound", "before")
    validate(f"{name}.schema.json", {k: v for k, v in document.items() if k not in mine})


def log_in(base: str, name: str, password: str) -> httpx.Client:
    """A client with ``name``'s session, logged in through the login form."""
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=60)
    form = client.get("/login")
    token = csrf_of(form.text)
    answer = client.post("/login", data={"csrf": token, "name": name, "password": password})
    assert answer.status_code == 303, answer.text
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found is not None, html
    return found.group(1)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest("pay-stuck-1"), ClaimRequest("pay-ok-2")], lease=3600)
        expire_lease(store, "pay-stuck-1", ago=600)
        done = store.claim("pay-done-3", lease=3600)
        store.complete("pay-done-3", done.owner, done.fencing_token, {"charge": "ch_1"})
        held = store.claim("acct-event-1", lease=3600)
        store.guard_many([Guard("acct:<b>7</b>", 4, "acct-event-1", held.fencing_token)])
    return url


@pytest.fixture
def console(sqlite_url: str, tmp_path: Path) -> Any:
    process = ConsoleProcess(sqlite_url, tmp_path, "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


def test_every_page_renders_and_its_api_document_is_the_json_one(console: ConsoleProcess) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    for path in ("/", "/keys", "/keys?stale=1", "/entities", "/audit", "/log", "/keys/pay-ok-2"):
        page = ana.get(path)
        assert page.status_code == 200, (path, page.text)
        assert page.headers["content-type"].startswith("text/html")
    overview = ana.get("/api/").json()
    valid("stats", overview["stats"])
    valid("doctor", overview["doctor"])
    assert overview["stats"]["total"] == 4 and overview["stats"]["stale"] == 1
    assert overview["doctor"]["ok"] is True
    listed = ana.get("/api/keys", params={"prefix": "pay-"}).json()
    assert [r["key"] for r in listed["items"]] == ["pay-done-3", "pay-ok-2", "pay-stuck-1"]
    for item in listed["items"]:
        valid("record", item)
    done = next(r for r in listed["items"] if r["key"] == "pay-done-3")
    assert done["result"] is None and done["result_masked"] is True
    entities = ana.get("/api/entities").json()
    (entity,) = entities["items"]
    valid("entity", entity)
    assert entity["entity"] == "acct:<b>7</b>" and entity["holder"] == "acct-event-1"
    page = ana.get("/entities").text
    assert "acct:&lt;b&gt;7&lt;/b&gt;" in page and "<b>7</b>" not in page
    assert ana.get("/api/entities/acct:<b>7</b>").json() == entity


def test_the_tasks_page_counts_task_keys_by_queue_and_task(tmp_path: Path) -> None:
    """``/tasks`` and ``/api/tasks``: ``tasks --json``'s lines, each task linked to its keys
    (a name that is markup shown as text)."""
    url = f"sqlite:///{tmp_path}/tasks.db"
    with open_store(url) as store:
        store.provision()
        done = store.claim("task:celery:shop.charge#o-1", lease=3600)
        store.complete(done.key, done.owner, done.fencing_token, 1)
        store.claim("task:celery:shop.charge#o-2", lease=3600)
        expire_lease(store, "task:celery:shop.charge#o-2")
        store.claim("task:rq:<b>x</b>#o-1", lease=3600)
        store.claim("pay-1", lease=3600)  # no task's
    process = ConsoleProcess(url, tmp_path)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        rows = ana.get("/api/tasks").json()["items"]
        for row in rows:
            valid("task", row)
        assert [(r["queue"], r["task"]) for r in rows] == [
            ("celery", "shop.charge"),
            ("rq", "<b>x</b>"),
        ]
        assert (rows[0]["completed"], rows[0]["in_progress"], rows[0]["stale"]) == (1, 1, 1)
        assert [
            r["task"] for r in ana.get("/api/tasks", params={"queue": "rq"}).json()["items"]
        ] == ["<b>x</b>"]
        page = ana.get("/tasks").text
        assert f'href="/keys?prefix={quote("task:celery:shop.charge#", safe="")}"' in page
        assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
        listed = ana.get("/api/keys", params={"prefix": rows[0]["prefix"]}).json()["items"]
        assert sorted(r["key"] for r in listed) == [
            "task:celery:shop.charge#o-1",
            "task:celery:shop.charge#o-2",
        ]
    finally:
        process.stop()


def test_paging_goes_on_by_the_cursor_until_the_last_page(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/many.db"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest(f"k-{i:03d}") for i in range(120)], lease=3600)
    process = ConsoleProcess(url, tmp_path)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page = ana.get("/api/keys", params={"cursor": cursor} if cursor else {}).json()
            seen += [r["key"] for r in page["items"]]
            cursor = page["cursor"]
            if cursor is None:
                break
        assert seen == [f"k-{i:03d}" for i in range(120)]
        html = ana.get("/keys").text
        assert 'id="next"' in html and html.count('class="key"') == 50
    finally:
        process.stop()


def test_a_redis_page_reads_a_part_of_the_store_and_says_so(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """On Redis a page reads at most WALK_KEYS keys (a million keys answer as fast as a
    hundred): a prefix few keys have comes back short, even empty, saying so, and the next
    page goes on. The console's limits are set small here (its ``sitecustomize``): 20 keys a
    page, 10 a SCAN call."""
    (tmp_path / "sitecustomize.py").write_text(
        "import idemctl.stores.redis as package\npackage.SCAN_COUNT, package.WALK_KEYS = 10, 20\n"
    )
    url = redis_server.url(query=f"prefix=walk-{uuid.uuid4().hex[:8]}:")
    rare = ["rare-1", "rare-2"]
    with open_store(url) as store:
        store.claim_many([ClaimRequest(k) for k in [*rare, *(f"common-{i}" for i in range(60))]])
    process = ConsoleProcess(url, tmp_path, path=tmp_path)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        seen: list[str] = []
        pages: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            params = {"prefix": "rare-", **({"cursor": cursor} if cursor else {})}
            page = ana.get("/api/keys", params=params).json()
            pages.append(page)
            seen += [r["key"] for r in page["items"]]
            cursor = page["cursor"]
            if cursor is None:
                break
            assert len(pages) < 1000
        # SCAN returns a key at least once; a rehash may return it twice.
        assert sorted(set(seen)) == rare and len(pages) > 3  # 62 keys and more, 20 a page
        # The HTML pages, each judged by what it shows itself: SCAN may answer one cursor
        # differently twice while Redis rehashes (CI: a rare key on a page asked again).
        htmls: list[str] = []
        cursor = None
        while True:
            params = {"prefix": "rare-", **({"cursor": cursor} if cursor else {})}
            htmls.append(html := ana.get("/keys", params=params).text)
            found = re.search(r'id="next" href="/keys\?[^"]*cursor=([^"&]*)"', html)
            cursor = unquote(found.group(1)) if found else None
            if cursor is None:
                break
            assert len(htmls) < 1000
        empty = [h for h in htmls[:-1] if 'class="key"' not in h]
        assert empty and all('id="partial"' in h and 'id="next"' in h for h in empty)
        assert all("no key matches in this part of the store" in h for h in empty)
        assert 'id="next"' not in htmls[-1] and 'id="partial"' not in htmls[-1]
    finally:
        process.stop()


def test_forget_and_purge_preview_then_act_only_on_the_typed_confirmation(
    console: ConsoleProcess,
) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    token = csrf_of(ana.get("/").text)
    preview = ana.get("/api/actions/forget", params={"key": "pay-done-3"}).json()
    valid("action", {**preview, "record": None})  # its record masked: checked below
    assert (preview["dry_run"], preview["count"], preview["confirm"]) == (True, 1, "pay-done-3")
    assert preview["record"]["result"] is None  # masked in the preview too
    bound = {"csrf": token, "key": "pay-done-3", "preview": preview["preview"]}
    wrong = ana.post("/api/actions/forget", data={**bound, "confirm": "x"})
    assert wrong.status_code == 400
    with open_store(console.url) as store:
        assert store.get("pay-done-3") is not None
    done = ana.post("/api/actions/forget", data={**bound, "confirm": "pay-done-3"}).json()
    assert done["dry_run"] is False and done["count"] == 1
    assert done["logged"]["user"] == "ana" and done["logged"]["action"] == "forget"
    with open_store(console.url) as store:
        assert store.get("pay-done-3") is None
    # The entity, by its name.
    entity = "acct:<b>7</b>"
    refused = ana.get("/api/actions/forget", params={"entity": entity})
    # Held by a running attempt: refused as the CLI refuses it without --force, which the
    # console does not offer.
    assert refused.status_code == 400 and "acct-event-1" in refused.json()["error"], refused.text
    # purge: nothing is past retention, so nothing to confirm
    # purge: what forget left past retention, asked again when its count is mistyped
    page = ana.get("/actions/purge", params={"older_than": "0s"})
    assert page.status_code == 200 and 'id="expected">purge 1<' in page.text
    shown = re.search(r'name="preview" value="([^"]*)"', page.text)
    assert shown is not None, page.text
    data = {"csrf": token, "older_than": "0s", "preview": shown.group(1)}
    again = ana.post("/actions/purge", data={**data, "confirm": "purge 2"})
    assert again.status_code == 400 and 'id="mistyped"' in again.text
    purged = ana.post("/api/actions/purge", data={**data, "confirm": "purge 1"}).json()
    assert (purged["count"], purged["dry_run"]) == (1, False)
    assert 'id="nothing"' in ana.get("/actions/purge", params={"older_than": "0s"}).text
    log = [e for e in ana.get("/api/log").json()["entries"]
           if e["action"] in ("forget", "purge") and e["result"] != "started"]  # fmt: skip
    assert [(e["user"], e["action"], e["target"], e["result"]) for e in log] == [
        ("ana", "purge", "older than 0s", "1 done"),
        ("ana", "forget", "pay-done-3", "1 done"),
    ]


def test_a_read_only_console_refuses_every_action(sqlite_url: str, tmp_path: Path) -> None:
    process = ConsoleProcess(sqlite_url, tmp_path)  # no --allow-repair
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        token = csrf_of(ana.get("/").text)
        assert 'id="unlock-stale"' not in ana.get("/").text
        assert "unlock…" not in ana.get("/keys/pay-stuck-1").text
        for name in ("unlock", "forget", "unlock-stale", "purge", "replay"):
            assert ana.get(f"/actions/{name}", params={"key": "pay-stuck-1"}).status_code == 403
            posted = ana.post(f"/api/actions/{name}", data={"csrf": token, "key": "pay-stuck-1",
                                                            "confirm": "pay-stuck-1"})  # fmt: skip
            assert posted.status_code == 403, name
            assert "read-only" in posted.json()["error"]
        with open_store(sqlite_url) as store:
            record = store.get("pay-stuck-1")
            assert record is not None and record.owner is not None
    finally:
        process.stop()


# The security review's list ---------------------------------------------------------------


def test_a_form_without_this_session_s_token_is_refused(console: ConsoleProcess) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    for data in ({}, {"csrf": ""}, {"csrf": "guessed"}, {"csrf": csrf_of(ana.get("/login").text)}):
        answer = ana.post(
            "/actions/unlock", data={**data, "key": "pay-stuck-1", "confirm": "pay-stuck-1"}
        )
        assert answer.status_code == 403, data
    # Another session's token is no good either.
    other = log_in(console.base, "ana", PASSWORDS["ana"])
    theirs = csrf_of(other.get("/").text)
    answer = ana.post(
        "/actions/unlock", data={"csrf": theirs, "key": "pay-stuck-1", "confirm": "pay-stuck-1"}
    )
    assert answer.status_code == 403
    # Nothing done; the logins and the refusals are logged (issue 59).
    log = ana.get("/api/log").json()["entries"]
    assert {e["action"] for e in log} == {"login", "refused"}
    assert [e["result"][:4] for e in log if e["action"] == "refused"] == ["403:"] * 5


def test_a_session_id_planted_before_login_is_worth_nothing(console: ConsoleProcess) -> None:
    planted = "attacker-chosen-id"
    client = httpx.Client(base_url=console.base, cookies={"idemctl_session": planted})
    form = client.get("/login")
    answer = client.post("/login", data={"csrf": csrf_of(form.text), "name": "ana",
                                         "password": PASSWORDS["ana"]})  # fmt: skip
    assert answer.status_code == 303
    issued = answer.cookies["idemctl_session"]
    assert issued != planted and len(issued) >= 40
    victim = httpx.get(f"{console.base}/api/", cookies={"idemctl_session": planted})
    assert victim.status_code == 401
    cookie = answer.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "secure" not in cookie


def test_paths_out_of_static_find_nothing(console: ConsoleProcess) -> None:
    for path in (
        "/static/../app.py",
        "/static/%2e%2e/app.py",
        "/static/..%2fapp.py",
        "/static/%2e%2e%2f%2e%2e%2fauth.py",
        "/static//etc/passwd",
        "/static/....//app.py",
    ):
        conn = http.client.HTTPConnection(HOST, console.port, timeout=30)
        conn.request("GET", path)  # as written: no client normalizes it first
        answer = conn.getresponse()
        body = answer.read()
        conn.close()
        assert answer.status in (303, 404), (path, answer.status)
        assert b"def " not in body and b"root:" not in body, path
    assert httpx.get(f"{console.base}/static/console.css").status_code == 200


def test_a_user_header_from_an_address_that_is_no_proxy_is_ignored(
    sqlite_url: str, tmp_path: Path
) -> None:
    far = ConsoleProcess(sqlite_url, tmp_path, "--trust-proxy", "10.9.9.9")
    try:
        forged = httpx.get(f"{far.base}/api/", headers={"X-Forwarded-User": "ana"})
        assert forged.status_code == 401
        page = httpx.get(f"{far.base}/keys", headers={"X-Forwarded-User": "ana"})
        assert page.status_code == 303 and page.headers["location"].startswith("/login")
    finally:
        far.stop()
    near = ConsoleProcess(sqlite_url, tmp_path, "--trust-proxy", "127.0.0.1", "--allow-repair")
    try:
        vouched = httpx.get(f"{near.base}/", headers={"X-Forwarded-User": "bo"})
        assert vouched.status_code == 200 and "bo (viewer)" in vouched.text
        stranger = httpx.get(f"{near.base}/", headers={"X-Forwarded-User": "eve"})
        assert "eve (viewer)" in stranger.text  # unknown to the users file: a viewer
        acted = httpx.get(
            f"{near.base}/actions/unlock", params={"key": "pay-stuck-1"},
            headers={"X-Forwarded-User": "eve"},
        )  # fmt: skip
        assert acted.status_code == 403
        # A form posted from another site is refused for the proxy's users (no session).
        cross = httpx.post(
            f"{near.base}/actions/unlock",
            data={"key": "pay-stuck-1", "confirm": "pay-stuck-1"},
            headers={"X-Forwarded-User": "ana", "Sec-Fetch-Site": "cross-site"},
        )
        assert cross.status_code == 403
    finally:
        near.stop()


def test_every_answer_carries_the_security_headers_and_login_goes_only_home(
    console: ConsoleProcess,
) -> None:
    for path in ("/login", "/healthz", "/static/console.css", "/keys"):
        answer = httpx.get(f"{console.base}{path}")
        csp = answer.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["x-content-type-options"] == "nosniff"
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil.example"):
        client = httpx.Client(base_url=console.base)
        form = client.get("/login", params={"next": target})
        data = {"csrf": csrf_of(form.text), "name": "ana", "password": PASSWORDS["ana"]}
        answer = client.post("/login", data={**data, "next": target})
        assert answer.headers["location"] == "/", target


def test_the_store_password_is_never_shown(
    redis_with_password: RedisServer, tmp_path: Path
) -> None:
    from tests.backends import unique_prefix
    from tests.fixtures_redis import REDIS_PASSWORD

    url = redis_with_password.url("/0", f"prefix={unique_prefix()}")
    assert REDIS_PASSWORD in url
    with open_store(url) as store:
        store.provision()
        store.claim("k-1", lease=3600)
    process = ConsoleProcess(url, tmp_path)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        for path in ("/", "/api/", "/keys", "/api/keys", "/keys/k-1", "/nowhere"):
            assert REDIS_PASSWORD not in ana.get(path).text, path
        assert REDIS_PASSWORD not in process.stderr.read_text()
    finally:
        process.stop()


def test_no_auth_is_refused_off_loopback(sqlite_url: str, tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="--no-auth only on a loopback address"):
        ConsoleProcess(sqlite_url, tmp_path, "--no-auth", bind="0.0.0.0")


# Outbox, audit, Powertools -----------------------------------------------------------------


def test_the_outbox_page_shows_lag_and_replays_a_row_by_id(
    postgres_server: Any, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from idemctl.outbox import add
    from tests.outbox.test_outbox import drop_schema, unique_schema

    schema_name = unique_schema()
    url = postgres_server.url(schema=schema_name)
    kind = f"order{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(f"outbox.event.{kind}", partitions=1)  # the default template
    try:
        with open_store(url) as store:
            store.provision()
            with store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                row = add(conn, kind, "o-1", "OrderPlaced", {"n": 1}, schema=schema_name)
        process = ConsoleProcess(url, tmp_path, "--allow-repair", "--brokers",
                                 kafka_broker.bootstrap)  # fmt: skip
        try:
            ana = log_in(process.base, "ana", PASSWORDS["ana"])
            status = ana.get("/api/outbox").json()
            valid("outbox-status", status)
            assert status["total"]["unpublished"] == 1
            assert kind in ana.get("/outbox").text
            token = csrf_of(ana.get("/").text)
            preview = ana.get("/api/actions/replay", params={"id": str(row)}).json()
            assert preview["count"] == 1 and preview["confirm"] == str(row)
            done = ana.post(
                "/api/actions/replay",
                data={"csrf": token, "id": str(row), "confirm": str(row),
                      "preview": preview["preview"]},
            ).json()  # fmt: skip
            assert done["count"] == 1 and done["marked_published"] == 1, done
            assert ana.get("/api/outbox").json()["total"]["unpublished"] == 0
        finally:
            process.stop()
    finally:
        drop_schema(postgres_server, schema_name)


def test_an_audit_names_the_messages_a_group_lost(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    from tests.audit.test_audit import commit, keyed, produce
    from tests.consume.test_consume import names

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, keyed(5))
    commit(kafka_broker, topic, group, {0: 5})  # the group moved past all five
    url = f"sqlite:///{tmp_path}/audit.db"
    with open_store(url) as store:
        store.provision()
        for key in ("k-0", "k-1"):
            attempt = store.claim(key, lease=60)
            store.complete(key, attempt.owner, attempt.fencing_token, None)
    process = ConsoleProcess(url, tmp_path, "--brokers", kafka_broker.bootstrap)
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        found = ana.get("/api/audit", params={"group": group, "topic": topic}).json()
        valid("audit", found)
        assert (found["audited"], found["done"], found["lost"]) == (5, 2, 3)
        assert [k["key"] for k in found["lost_keys"]] == ["k-2", "k-3", "k-4"]
        page = ana.get("/audit", params={"group": group, "topic": topic}).text
        assert "not ok: 5 messages audited, 3 lost" in page and "k-4" in page
    finally:
        process.stop()


def test_a_powertools_table_shows_through_the_same_pages(
    redis_pt: Any, redis_client: Any, tmp_path: Path
) -> None:
    """Records written by Powertools itself (its Redis layer), read through the console."""
    from tests.powertools.states import build

    scenario = build(redis_pt, tmp_path, ("completed", "stale"))
    process = ConsoleProcess(redis_pt.url, tmp_path, "--allow-repair")
    try:
        ana = log_in(process.base, "ana", PASSWORDS["ana"])
        stats = ana.get("/api/").json()["stats"]
        valid("powertools-stats", stats)
        assert (stats["by_state"]["completed"], stats["by_state"]["stale"]) == (1, 1)
        listed = ana.get("/api/keys", params={"stale": "1"}).json()
        assert [r["key"] for r in listed["items"]] == [scenario.keys["stale"]]
        done = ana.get(f"/api/keys/{quote(scenario.keys['completed'], safe='')}").json()
        assert done["data"] is None and done["result_masked"] is True
        page = ana.get("/keys").text
        assert (
            scenario.keys["completed"] in page and 'id="sort-state">state</a>' in page
        )  # sortable
        preview = ana.get("/api/actions/unlock-stale").json()
        assert (
            preview["keys"] == [scenario.keys["stale"]] and preview["confirm"] == "unlock-stale 1"
        )
        assert ana.get("/entities").status_code == 400  # no entities in Powertools' layout
    finally:
        process.stop()
