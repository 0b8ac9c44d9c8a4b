"""An on-call operator's incident in a real browser (headless chromium), against a real
``idemctl console`` process (SQLite and Redis): a stale key found from the overview (its
last hour charted), understood from its page (stale for how long, whose lease, what unlock
does), unlocked after its dry run, the result shown on the page the operator lands on, and
the key's page saying what happens next; the failed keys' errors, sorted by a click; keys
with invisible characters told apart; keys picked for a bulk action; a sweep's older-than;
the outbox's failing rows replayed from a row (PostgreSQL); an audit's known groups, its
error beside the form, and a lost key's page (a real broker).

The screenshots of the docs' incident section (docs/images/console/incident-*.png) are
the SQLite run's."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from idemctl import open_store
from idemctl.model import ClaimRequest
from tests.backends import expire_lease, unique_prefix, unique_schema
from tests.console.conftest import PASSWORDS, ConsoleProcess
from tests.console.test_browser import click, log_in
from tests.polling import wait_until
from tests.servers import KafkaBroker

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"
BUSY = [f"order-{i:03d}" for i in range(40)]
"""Keys the fixture completes (and fails) a few at a time, a sample apart: the overview's
last hour has something to show."""
SAMPLED = (
    "try:\n    import idemctl.console.sampler as sampler\n    sampler.INTERVAL = 0.5\n"
    "except ImportError:\n    pass\n"
)


def shot(console: ConsoleProcess, driver: Any, name: str, height: int = 700) -> None:
    """The docs' screenshot ``name`` (the SQLite run's), the window cut to ``height``."""
    if console.shots:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.set_window_size(1200, height)
        driver.save_screenshot(str(SHOTS / f"{name}.png"))


def samples(console: ConsoleProcess, client: httpx.Client) -> int | None:
    """How many samples the console holds; None for a console that samples nothing."""
    overview = client.get(f"{console.base}/api/").json()
    if "history" not in overview:
        return None
    return len((overview["history"] or {}).get("samples", []))


def after_a_sample(console: ConsoleProcess, client: httpx.Client) -> None:
    """Return once the console has taken another sample (polled, with a deadline); at once
    where it samples nothing (the overview's test says so)."""
    seen = samples(console, client)
    if seen is None:
        return
    wait_until(
        lambda: (samples(console, client) or 0) > seen,
        "the console takes another sample",
        timeout=30,
        interval=0.1,
    )


def http_login(console: ConsoleProcess) -> httpx.Client:
    from tests.console.test_pages import log_in as http_log_in

    return http_log_in(console.base, "ana", PASSWORDS["ana"])


@pytest.fixture(params=["sqlite", "redis"])
def console(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConsoleProcess]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/keys.db"
    else:
        server = request.getfixturevalue("redis_server")
        url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest(k) for k in ("pay-stuck-1", "pay-ok-2", *BUSY)], lease=3600)
        expire_lease(store, "pay-stuck-1", ago=720)
        for key, error, retriable in (
            ("pay-failed-3", "card declined: gateway timeout", True),
            ("pay-final-4", "invalid card number", False),
        ):
            attempt = store.claim(key, lease=3600)
            store.fail(key, attempt.owner, attempt.fencing_token, error, retriable=retriable)
        store.claim_many([ClaimRequest("inv\u200bkey"), ClaimRequest("invkey")], lease=3600)
    (tmp_path / "sitecustomize.py").write_text(SAMPLED)
    process = ConsoleProcess(url, tmp_path, "--allow-repair", path=tmp_path)
    process.shots = request.param == "sqlite"
    try:
        client = http_login(process)
        with open_store(url) as store:  # a few minutes' work, a sample apart
            for n, chunk in enumerate((BUSY[:6], BUSY[6:9], BUSY[9:19], BUSY[19:23], BUSY[23:31])):
                after_a_sample(process, client)
                for key in chunk:
                    held = store.get(key)
                    if n == 2 and key == chunk[0]:
                        store.fail(key, held.owner, held.fencing_token, "timeout", retriable=True)
                    else:
                        store.complete(key, held.owner, held.fencing_token, {"ok": True})
            after_a_sample(process, client)
        yield process
    finally:
        process.stop()


def test_an_operator_finds_a_stale_key_understands_it_unlocks_it_and_sees_the_result(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    # The overview: one stale lease, and the last hour's work charted.
    assert browser.find_element(By.CSS_SELECTOR, "#stale a").text == "1"
    bars = browser.find_elements(By.CSS_SELECTOR, "#chart-completed rect.bar")
    assert sum(int(b.get_attribute("data-value")) for b in bars) == 30
    assert browser.find_elements(By.CSS_SELECTOR, "#chart-failed rect.bar")
    shot(console, browser, "incident-overview", height=820)
    click(browser, By.CSS_SELECTOR, "#stale a")
    found = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert found == ["pay-stuck-1"]
    click(browser, By.LINK_TEXT, "pay-stuck-1")
    # Its page: stale for how long, whose lease, what the next delivery and unlock do.
    assert browser.find_element(By.ID, "state").text == "stale"
    meaning = browser.find_element(By.ID, "meaning").text
    assert re.search(r"Stale for 1[23] min, since [\d: -]+ UTC", meaning), meaning
    with open_store(console.url) as store:
        record = store.get("pay-stuck-1")
    assert record is not None and record.owner is not None
    assert browser.find_element(By.ID, "meaning-owner").text == record.owner
    assert "takes it over and runs the handler again, as attempt 2" in meaning
    assert "Unlock frees it now" in browser.find_element(By.ID, "todo").text
    stale_for = browser.find_element(By.CSS_SELECTOR, "#stale-for time")
    assert stale_for.get_attribute("title").endswith(" UTC")  # the absolute time
    shot(console, browser, "incident-key-stale")
    click(browser, By.ID, "unlock")
    browser.find_element(By.ID, "confirm").send_keys(browser.find_element(By.ID, "expected").text)
    shot(console, browser, "incident-confirm")
    click(browser, By.ID, "do")
    # The result, on the page the operator lands on.
    flash = browser.find_element(By.ID, "flash")
    assert "unlock pay-stuck-1: 1 done" in flash.text, flash.text
    assert "ana unlock pay-stuck-1" in browser.find_element(By.ID, "log").text
    shot(console, browser, "incident-done", height=450)
    click(browser, By.ID, "flash-link")
    assert browser.find_element(By.ID, "state").text == "released"
    assert "claims it at once and runs the handler" in browser.find_element(By.ID, "meaning").text
    shot(console, browser, "incident-key-released")
    with open_store(console.url) as store:
        record = store.get("pay-stuck-1")
        assert record is not None and record.owner is None  # released: the next claim runs


def test_the_failed_keys_show_their_errors_and_sort_by_a_click(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    browser.get(f"{console.base}/keys?status=failed&prefix=pay-")
    rows = {
        r.find_element(By.CSS_SELECTOR, "a.key").text: r.text
        for r in browser.find_elements(By.CSS_SELECTOR, "#keys tr")
        if r.find_elements(By.CSS_SELECTOR, "a.key")
    }
    assert "card declined: gateway timeout" in rows["pay-failed-3"]
    assert " yes " in f" {rows['pay-failed-3']} " and " no " in f" {rows['pay-final-4']} "
    click(browser, By.ID, "sort-error")
    ordered = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert ordered == ["pay-failed-3", "pay-final-4"]
    click(browser, By.ID, "sort-error")  # again: descending
    ordered = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert ordered == ["pay-final-4", "pay-failed-3"]
    assert "sort=-error" in browser.current_url
    shot(console, browser, "incident-failed-keys", height=450)
    click(browser, By.LINK_TEXT, "pay-final-4")
    assert browser.find_element(By.ID, "state").text == "failed for good"
    assert browser.find_element(By.ID, "meaning-error").text == "invalid card number"
    assert "It will not be retried" in browser.find_element(By.ID, "meaning").text


def test_keys_with_invisible_characters_are_told_apart(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "bo", PASSWORDS["bo"])
    browser.get(f"{console.base}/keys?prefix=inv")
    shown = sorted(a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key"))
    assert shown == ["inv\\u200bkey", "invkey"]
    marked = browser.find_element(By.CSS_SELECTOR, "#keys a.key .esc")
    assert marked.text == "\\u200b" and marked.get_attribute("title") == "ZERO WIDTH SPACE"
    shot(console, browser, "incident-invisible", height=480)
    click(browser, By.CSS_SELECTOR, "#keys a.key .esc")
    assert browser.find_element(By.ID, "key-name").text == "inv\\u200bkey"


def test_keys_picked_in_the_list_go_to_a_bulk_action(console: ConsoleProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    browser.get(f"{console.base}/keys?prefix=inv")
    for box in browser.find_elements(By.CSS_SELECTOR, "#keys input.pick"):
        box.click()
    click(browser, By.ID, "bulk-unlock")
    sent = urlsplit(browser.current_url)
    assert sent.path == "/actions/bulk-unlock"
    assert sorted(parse_qs(sent.query)["key"]) == sorted(["inv\u200bkey", "invkey"])  # exactly


def test_a_sweep_takes_its_older_than_from_the_overview(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    field = browser.find_element(By.ID, "stale-older-than")
    field.clear()
    field.send_keys("10m")
    click(browser, By.ID, "unlock-stale")
    assert parse_qs(urlsplit(browser.current_url).query)["older_than"] == ["10m"]
    assert browser.find_element(By.ID, "preview-keys").text == "pay-stuck-1"  # 12 min ago
    browser.get(f"{console.base}/")
    field = browser.find_element(By.ID, "stale-older-than")
    field.clear()
    field.send_keys("15m")
    click(browser, By.ID, "unlock-stale")
    assert browser.find_elements(By.ID, "preview-keys") == []  # none ran out that long ago


# With PostgreSQL's outbox, and with a broker -----------------------------------------------


def test_the_outbox_replays_a_failing_row_from_its_line(
    postgres_server: Any, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    from idemctl.outbox import add
    from tests.outbox.test_outbox import drop_schema

    schema = unique_schema()
    url = postgres_server.url(schema=schema)
    try:
        with open_store(url) as store:
            store.provision()
            with store.connection() as conn, conn.transaction():  # type: ignore[attr-defined]
                rows = [add(conn, "order", f"o-{i}", "OrderPlaced", {"n": i}, schema=schema)
                        for i in range(3)]  # fmt: skip
            table = store.names.outbox_table  # type: ignore[attr-defined]
            with store.connection() as conn:  # type: ignore[attr-defined]
                conn.execute(
                    f"UPDATE {table} SET attempts = 3, last_error = %s WHERE id = %s",
                    ("KafkaError{code=_MSG_TIMED_OUT}: message timed out", rows[1]),
                )
        process = ConsoleProcess(url, tmp_path, "--allow-repair")
        process.shots = True
        try:
            log_in(browser, process.base, "ana", PASSWORDS["ana"])
            click(browser, By.ID, "nav-outbox")
            failing = browser.find_element(By.ID, "failing-rows").text
            assert str(rows[1]) in failing and "message timed out" in failing
            pending = browser.find_element(By.ID, "unpublished-rows").text
            assert all(str(r) in pending for r in rows)
            shot(process, browser, "incident-outbox", height=820)
            click(browser, By.ID, f"replay-{rows[1]}")
            assert urlsplit(browser.current_url).path == "/actions/replay"
            assert str(rows[1]) in browser.find_element(By.ID, "preview").text
        finally:
            process.stop()
    finally:
        drop_schema(postgres_server, schema)


def test_an_audit_offers_known_groups_keeps_its_form_and_explains_a_lost_key(
    kafka_broker: KafkaBroker, tmp_path: Path, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    from tests.audit.test_audit import commit, keyed, produce
    from tests.consume.test_consume import names

    topic, group = names()
    kafka_broker.create_topic(topic, partitions=1)
    produce(kafka_broker, topic, keyed(4))
    commit(kafka_broker, topic, group, {0: 4})
    url = f"sqlite:///{tmp_path}/audit.db"
    with open_store(url) as store:
        store.provision()
        for key in ("k-0", "k-1"):
            attempt = store.claim(key, lease=60)
            store.complete(key, attempt.owner, attempt.fencing_token, None)
    process = ConsoleProcess(url, tmp_path, "--brokers", kafka_broker.bootstrap)
    process.shots = True
    try:
        log_in(browser, process.base, "ana", PASSWORDS["ana"])
        browser.get(f"{process.base}/audit")
        options = [o.get_attribute("value") for o in
                   browser.find_elements(By.CSS_SELECTOR, "#known-groups option")]  # fmt: skip
        assert group in options
        topics = [o.get_attribute("value") for o in
                  browser.find_elements(By.CSS_SELECTOR, "#known-topics option")]  # fmt: skip
        assert topic in topics
        # A group that committed nothing: the error beside the form, as typed.
        browser.find_element(By.ID, "group").send_keys("nobody-" + group)
        browser.find_element(By.ID, "topic").send_keys(topic)
        click(browser, By.ID, "run-audit")
        assert "has committed nothing" in browser.find_element(By.ID, "audit-error").text
        assert browser.find_element(By.ID, "topic").get_attribute("value") == topic
        # The known group, picked from the list.
        browser.find_element(By.ID, "group").clear()
        browser.find_element(By.ID, "group").send_keys(group)
        click(browser, By.ID, "run-audit")
        verdict = browser.find_element(By.ID, "verdict").text
        assert verdict.startswith("not ok: 4 messages audited, 2 lost"), verdict
        shot(process, browser, "incident-audit")
        click(browser, By.LINK_TEXT, "k-3")
        assert browser.find_element(By.ID, "state").text == "no record"
        said = browser.find_element(By.ID, "known").text
        assert f"topic {topic} partition 0 at offset 3" in said and "deliver it again" in said
        shot(process, browser, "incident-lost", height=500)
    finally:
        process.stop()
