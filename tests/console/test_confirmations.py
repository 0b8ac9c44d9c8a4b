"""Issue 59, finding 3 and deliverable 3 (and 9's bulk actions), against real ``idemctl
console`` processes over HTTP, on SQLite and on Redis: a confirmation acts only on what its
dry run showed.

Each race is made by the test between the dry run (GET) and its confirmation (POST), with
the store's own API (a retry's claim and complete, a takeover, a lease run out by
``tests.backends.expire_lease``): a forget previewed as failed and completed meanwhile, an
unlock previewed with fencing token T of a key taken over since, an ``unlock-stale 5``
whose count stayed 5 with another key in it, and the bulk actions on keys picked in a
list, with one typed confirmation naming the count.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest

from idemctl import open_store
from idemctl.model import Status
from tests.backends import expire_lease, expire_retention, unique_prefix
from tests.console.conftest import PASSWORDS, ConsoleProcess

DRY_RUN = ("confirm", "preview", "fields", "selection", "bound")
"""What every dry run's document holds beside the action's own fields."""


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/keys.db"
    else:
        server = request.getfixturevalue("redis_server")
        url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    with open_store(url) as store:
        store.provision()
    return url


@pytest.fixture
def console(store_url: str, tmp_path: Path) -> Iterator[ConsoleProcess]:
    process = ConsoleProcess(store_url, tmp_path, "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


def log_in(base: str) -> tuple[httpx.Client, str]:
    """ana's client, logged in through the login form, and her session's CSRF token."""
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=60)
    form = client.get("/login")
    answer = client.post("/login", data={"csrf": csrf_of(form.text), "name": "ana",
                                         "password": PASSWORDS["ana"]})  # fmt: skip
    assert answer.status_code == 303, answer.text
    return client, csrf_of(client.get("/").text)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]*)"', html)
    assert found is not None, html
    return found.group(1)


def hidden(html: str, name: str) -> str:
    found = re.search(rf'<input type="hidden" name="{name}" value="([^"]*)"', html)
    assert found is not None, html
    return unescape(found.group(1))


def text_of(html: str, element: str) -> str:
    """The text of the element whose id is ``element`` (its tags dropped)."""
    found = re.search(rf'<(\w+)[^>]* id="{element}"[^>]*>(.*?)</\1>', html, re.S)
    assert found is not None, (element, html)
    cells = re.sub(r"</?(?:td|th|tr|li|p|ul|table)\b[^>]*>", " ", found.group(2))
    return " ".join(unescape(re.sub(r"<[^>]+>", "", cells)).split())


def sent_back(dry: dict[str, Any], csrf: str, **params: Any) -> dict[str, Any]:
    """The confirmation of the dry run ``dry`` of ``params``: what it asked to send back.
    (The original console's dry runs had no ``preview``: none is sent there.)"""
    form = {**params, "csrf": csrf, "confirm": dry["confirm"]}
    if "preview" in dry:
        form["preview"] = dry["preview"]
    return form


def claimed(store: Any, key: str) -> Any:
    attempt = store.claim(key, lease=3600)
    assert attempt.owner is not None, attempt
    return attempt


def stale(store: Any, *keys: str) -> dict[str, Any]:
    """``keys`` claimed, their leases run out: each one's attempt."""
    attempts = {k: claimed(store, k) for k in keys}
    for key in keys:
        expire_lease(store, key, ago=600)
    return attempts


def record(url: str, key: str) -> Any:
    with open_store(url) as store:
        return store.get(key)


def entries(console: ConsoleProcess) -> list[dict[str, Any]]:
    """The operator log's lines."""
    lines = console.log.read_text().splitlines() if console.log.is_file() else []
    return [json.loads(line) for line in lines if line.strip()]


def logged(console: ConsoleProcess) -> list[tuple[str, str, str]]:
    return [(e["action"], e["target"], e["result"]) for e in entries(console)]


# Finding 3: a forget previewed as failed, completed meanwhile ---------------------------------


def test_a_forget_previewed_as_failed_deletes_nothing_once_a_retry_completed_it(
    console: ConsoleProcess,
) -> None:
    """On the original console the completed record was deleted: the next delivery ran
    the handler again (a double charge)."""
    tokens = {}
    with open_store(console.url) as store:
        for key in ("pay-1", "pay-2"):
            first = claimed(store, key)
            store.fail(key, first.owner, first.fencing_token, "card declined", retriable=True)
            tokens[key] = first.fencing_token
    ana, csrf = log_in(console.base)
    dry = ana.get("/api/actions/forget", params={"key": "pay-1"}).json()
    assert dry["record"]["status"] == "failed" and dry["confirm"] == "pay-1"
    with open_store(console.url) as store:  # a retry claims it and completes
        retry = claimed(store, "pay-1")
        store.complete("pay-1", retry.owner, retry.fencing_token, {"charge": "ch_1"})
    answer = ana.post("/api/actions/forget", data=sent_back(dry, csrf, key="pay-1"))
    now = record(console.url, "pay-1")
    assert now is not None and now.status is Status.COMPLETED  # nothing deleted
    assert answer.status_code == 409, answer.text
    assert set(DRY_RUN) <= set(dry) and dry["fields"] == {"key": "pay-1"}
    said = answer.json()
    assert said["done"] is False and said["refused"] == "changed"
    assert said["changed"] == [{
        "name": "pay-1",
        "said": f"previewed as failed with fencing token {tokens['pay-1']}, attempt 1; "
                f"now completed with fencing token {retry.fencing_token}, attempt 2",
    }]  # fmt: skip
    # The new preview is in the answer: confirming it forgets the completed record.
    assert said["record"]["status"] == "completed" and said["confirm"] == "pay-1"
    again = ana.post("/api/actions/forget", data=sent_back(said, csrf, key="pay-1"))
    assert again.status_code == 200 and again.json()["count"] == 1, again.text
    assert record(console.url, "pay-1") is None
    # The page says it too, with the new preview's form.
    page = ana.get("/actions/forget", params={"key": "pay-2"}).text
    form = {"csrf": csrf, "key": "pay-2", "confirm": "pay-2"}
    if 'name="preview"' in page:
        form["preview"] = hidden(page, "preview")
    with open_store(console.url) as store:
        retry = claimed(store, "pay-2")
        store.complete("pay-2", retry.owner, retry.fencing_token, {"charge": "ch_2"})
    shown = ana.post("/actions/forget", data=form)
    assert shown.status_code == 409, shown.text
    assert text_of(shown.text, "changed") == "nothing was done: the key changed since its preview"
    said_there = (
        f"previewed as failed with fencing token {tokens['pay-2']}, attempt 1; "
        f"now completed with fencing token {retry.fencing_token}, attempt 2"
    )
    assert text_of(shown.text, "changes") == f"pay-2: {said_there}"
    assert text_of(shown.text, "state").startswith("The record is completed, attempt 2,")
    assert hidden(shown.text, "preview") != form["preview"]
    assert record(console.url, "pay-2") is not None
    assert ("forget", "pay-2", f"nothing done, changed since its preview: pay-2: {said_there}") in (
        logged(console)
    )


# Finding 3: an unlock previewed with token T, the key taken over since ---------------------


def test_an_unlock_previewed_with_token_t_never_frees_the_attempt_that_took_it_over(
    console: ConsoleProcess,
) -> None:
    """The key is taken over after the dry run (token T + 1), and that attempt's lease ran
    out too: the original console freed it."""
    with open_store(console.url) as store:
        first = stale(store, "pay-stuck")["pay-stuck"].fencing_token
    ana, csrf = log_in(console.base)
    dry = ana.get("/api/actions/unlock", params={"key": "pay-stuck"}).json()
    with open_store(console.url) as store:
        taker = claimed(store, "pay-stuck")  # a takeover: the next token
        assert taker.fencing_token > first
        expire_lease(store, "pay-stuck", ago=60)  # and stale in its turn
    answer = ana.post("/api/actions/unlock", data=sent_back(dry, csrf, key="pay-stuck"))
    now = record(console.url, "pay-stuck")
    assert (now.owner, now.fencing_token) == (taker.owner, taker.fencing_token)  # not freed
    assert answer.status_code == 409, answer.text
    # The dry run showed the record as it was (the unlock's own record is the one after).
    assert dry["before"]["fencing_token"] == first and dry["before"]["owner"] is not None
    assert dry["bound"]["keys"]["pay-stuck"]["fencing_token"] == first
    (change,) = answer.json()["changed"]
    assert change["said"].startswith(
        f"previewed as in_progress with fencing token {first}, attempt 1"
    )
    assert (
        f"; now in_progress with fencing token {taker.fencing_token}, attempt 2" in (change["said"])
    )
    # The page of the same race: nothing done, what changed, the new preview to confirm.
    page = ana.get("/actions/unlock", params={"key": "pay-stuck"}).text
    assert text_of(page, "state").startswith(
        f"The record is in_progress, attempt 2, fencing token {taker.fencing_token}, "
        "stale: its lease ran out"
    )
    form = {"csrf": csrf, "key": "pay-stuck", "confirm": "pay-stuck"}
    if 'name="preview"' in page:
        form["preview"] = hidden(page, "preview")
    with open_store(console.url) as store:
        third = claimed(store, "pay-stuck")
        expire_lease(store, "pay-stuck", ago=60)
    shown = ana.post("/actions/unlock", data=form)
    assert shown.status_code == 409, shown.text
    assert f"now in_progress with fencing token {third.fencing_token}" in (
        text_of(shown.text, "changes")
    )
    assert record(console.url, "pay-stuck").owner == third.owner


def test_an_unlock_of_a_key_completed_since_its_preview_says_why_it_cannot_be_now(
    console: ConsoleProcess,
) -> None:
    """The worker came back and completed it: nothing is done, and the new dry run is the
    refusal an unlock of a completed key gets (no form to confirm)."""
    with open_store(console.url) as store:
        attempt = stale(store, "pay-late")["pay-late"]
    ana, csrf = log_in(console.base)
    dry = ana.get("/api/actions/unlock", params={"key": "pay-late"}).json()
    page = ana.get("/actions/unlock", params={"key": "pay-late"}).text
    with open_store(console.url) as store:
        store.complete("pay-late", attempt.owner, attempt.fencing_token, {"ok": True})
    answer = ana.post("/api/actions/unlock", data=sent_back(dry, csrf, key="pay-late"))
    assert record(console.url, "pay-late").status is Status.COMPLETED
    assert answer.status_code == 409, answer.text
    said = answer.json()
    assert said["count"] == 0 and "is completed" in said["failure"]
    assert "now completed with fencing token" in said["changed"][0]["said"]
    form = {"csrf": csrf, "key": "pay-late", "confirm": "pay-late"}
    if 'name="preview"' in page:
        form["preview"] = hidden(page, "preview")
    shown = ana.post("/actions/unlock", data=form)
    assert shown.status_code == 409 and 'id="confirm-form"' not in shown.text
    assert "is completed" in text_of(shown.text, "now-failure")


# Finding 3: unlock-stale 5, one completed and another stale meanwhile ----------------------


def test_unlock_stale_frees_only_the_keys_its_preview_listed_and_names_those_left_alone(
    console: ConsoleProcess,
) -> None:
    """Previewed: s-1..s-5. Meanwhile s-1 completes and s-6 turns stale: the count is still
    5, which is what the original console compared, and it freed s-6."""
    with open_store(console.url) as store:
        attempts = stale(store, *(f"s-{i}" for i in range(1, 6)))
        late = claimed(store, "s-6")
    ana, csrf = log_in(console.base)
    dry = ana.get("/api/actions/unlock-stale", params={"older_than": "0s"}).json()
    assert dry["keys"] == [f"s-{i}" for i in range(1, 6)] and dry["confirm"] == "unlock-stale 5"
    with open_store(console.url) as store:
        one = attempts["s-1"]
        store.complete("s-1", one.owner, one.fencing_token, None)
        expire_lease(store, "s-6", ago=600)
    answer = ana.post("/api/actions/unlock-stale", data=sent_back(dry, csrf, older_than="0s"))
    assert answer.status_code == 200, answer.text
    assert record(console.url, "s-6").owner == late.owner  # never previewed: not freed
    for i in range(2, 6):
        assert record(console.url, f"s-{i}").owner is None
    assert record(console.url, "s-1").status is Status.COMPLETED
    done = answer.json()
    assert done["keys"] == ["s-2", "s-3", "s-4", "s-5"] and done["count"] == 4
    alone = {o["key"]: o["said"] for o in done["left_alone"]}
    assert set(alone) == {"s-1", "s-6"}
    token = attempts["s-1"].fencing_token
    assert alone["s-1"].startswith(
        f"left alone: previewed as in_progress with fencing token {token}, attempt 1"
    )
    assert f"now completed with fencing token {token}, attempt 1" in alone["s-1"]
    assert alone["s-6"] == "left alone: not in the preview" and done["appeared"] == ["s-6"]
    assert done["logged"]["result"] == "4 done, 2 left alone"
    lines = logged(console)
    assert ("unlock-stale", "s-6", "left alone: not in the preview") in lines
    assert ("unlock-stale", "s-2", "freed") in lines
    # The sweep's own lines: the keys it was to act on before, those it acted on after.
    sweep = [e for e in entries(console) if e.get("target_kind") == "sweep"]
    assert [(e["result"], e.get("keys")) for e in sweep] == [
        ("started", [f"s-{i}" for i in range(1, 6)]),
        ("4 done, 2 left alone", ["s-2", "s-3", "s-4", "s-5"]),
    ]
    assert len({e["id"] for e in sweep}) == 1


def test_a_sweep_that_grew_acts_on_what_it_showed_and_its_page_names_the_rest(
    console: ConsoleProcess,
) -> None:
    """The operator typed what was asked (``unlock-stale 1``) and another key went stale:
    the original console answered "the confirmation did not match"."""
    with open_store(console.url) as store:
        stale(store, "g-1")
        claimed(store, "g-2")
    ana, csrf = log_in(console.base)
    page = ana.get("/actions/unlock-stale", params={"older_than": "0s"}).text
    assert text_of(page, "expected") == "unlock-stale 1"
    form = {"csrf": csrf, "older_than": "0s", "confirm": "unlock-stale 1"}
    if 'name="preview"' in page:
        form["preview"] = hidden(page, "preview")
    with open_store(console.url) as store:
        expire_lease(store, "g-2", ago=600)
    shown = ana.post("/actions/unlock-stale", data=form)
    assert shown.status_code == 200, shown.text
    assert text_of(shown.text, "result") == "unlock-stale: 1 done, 1 left alone."
    assert text_of(shown.text, "left-alone") == "1 left alone: g-2."
    assert "not in the preview" in text_of(shown.text, "outcomes")
    assert record(console.url, "g-1").owner is None and record(console.url, "g-2").owner


def test_a_confirmation_without_its_preview_or_with_a_forged_one_does_nothing(
    console: ConsoleProcess,
) -> None:
    with open_store(console.url) as store:
        stale(store, "k-1")
    ana, csrf = log_in(console.base)
    dry = ana.get("/api/actions/unlock", params={"key": "k-1"}).json()
    token = str(dry.get("preview", "x.y"))
    body, mac = token.split(".")
    for preview in (None, "", "x.y", f"{body}.{mac[::-1]}", f"{body[:-2]}AA.{mac}"):
        form = {"csrf": csrf, "key": "k-1", "confirm": "k-1"}
        if preview is not None:
            form["preview"] = preview
        answer = ana.post("/api/actions/unlock", data=form)
        assert answer.status_code == 400, (preview, answer.text)
        assert answer.json()["refused"] == "unbound" and answer.json()["preview"]
        assert record(console.url, "k-1").owner is not None
    # Another key's preview is no good for this one.
    with open_store(console.url) as store:
        stale(store, "k-2")
    other = ana.get("/api/actions/unlock", params={"key": "k-2"}).json()
    answer = ana.post("/api/actions/unlock", data={**sent_back(other, csrf, key="k-1"),
                                                   "confirm": "k-1"})  # fmt: skip
    assert answer.status_code == 400 and record(console.url, "k-1").owner is not None
    assert ana.post("/api/actions/unlock", data=sent_back(dry, csrf, key="k-1")).status_code == 200
    assert record(console.url, "k-1").owner is None


# Deliverable 9: bulk actions on the keys picked ----------------------------------------------


def test_bulk_unlock_and_forget_take_one_confirmation_naming_the_count(
    console: ConsoleProcess,
) -> None:
    """``key`` repeated, as the keys list's checkboxes send it; each key bound to its
    previewed state, each outcome said and logged. (No such route on the original.)"""
    with open_store(console.url) as store:
        attempts = stale(store, "b-1", "b-2", "b-4")
        done = claimed(store, "b-3")
        store.complete("b-3", done.owner, done.fencing_token, {"charge": "ch_3"})
    ana, csrf = log_in(console.base)
    picked = [("key", k) for k in ("b-1", "b-2", "b-3", "b-4")]
    dry = ana.get("/api/actions/bulk-unlock", params=picked)
    assert dry.status_code == 200, dry.text
    dry_run = dry.json()
    assert dry_run["confirm"] == "unlock 3 keys" and dry_run["count"] == 3
    assert dry_run["selection"] == ["b-1", "b-2", "b-3", "b-4"] and dry_run["fields"] == {}
    items = {i["key"]: i for i in dry_run["items"]}
    assert [k for k, i in items.items() if i["would"]] == ["b-1", "b-2", "b-4"]
    assert "completed" in items["b-3"]["why"] and items["b-3"]["record"]["result"] is None
    form = {"csrf": csrf, "preview": dry_run["preview"], "key": [k for _, k in picked]}
    mistyped = ana.post("/api/actions/bulk-unlock", data={**form, "confirm": "unlock 4 keys"})
    assert mistyped.status_code == 400 and mistyped.json()["refused"] == "mistyped"
    assert all(record(console.url, k).owner for k in ("b-1", "b-2", "b-4"))
    with open_store(console.url) as store:  # b-4 is taken over, and stale again
        taker = claimed(store, "b-4")
        expire_lease(store, "b-4", ago=60)
    answer = ana.post("/api/actions/bulk-unlock", data={**form, "confirm": "unlock 3 keys"})
    assert answer.status_code == 200, answer.text
    result = answer.json()
    outcomes = {o["key"]: (o["done"], o["said"]) for o in result["outcomes"]}
    assert outcomes["b-1"] == (True, "freed") and outcomes["b-2"] == (True, "freed")
    assert outcomes["b-4"][0] is False
    assert f"now in_progress with fencing token {taker.fencing_token}" in outcomes["b-4"][1]
    assert set(outcomes) == {"b-1", "b-2", "b-4"}  # b-3 was never bound
    assert record(console.url, "b-4").owner == taker.owner
    assert record(console.url, "b-1").owner is None and attempts
    assert result["logged"]["result"] == "2 done, 1 left alone"
    lines = logged(console)
    for key in ("b-1", "b-2"):
        assert ("bulk-unlock", key, "freed") in lines
    assert any(
        a == "bulk-unlock" and t == "b-4" and r.startswith("left alone") for a, t, r in lines
    )
    # bulk-forget through the page: one confirmation, each key's outcome on the page.
    page = ana.get("/actions/bulk-forget", params=[("key", "b-3"), ("key", "b-4")])
    assert page.status_code == 200, page.text
    assert text_of(page.text, "expected") == "forget 1 key"  # b-4 is in progress: refused
    assert "no: key 'b-4' is in progress" in text_of(page.text, "picked")
    keys = re.findall(r'<input type="hidden" name="key" value="([^"]*)"', page.text)
    assert keys == ["b-3", "b-4"]
    shown = ana.post("/actions/bulk-forget", data={
        "csrf": csrf, "preview": hidden(page.text, "preview"), "confirm": "forget 1 key",
        "key": keys,
    })  # fmt: skip
    assert shown.status_code == 200, shown.text
    assert text_of(shown.text, "result") == "bulk-forget: 1 done."
    assert text_of(shown.text, "outcomes") == "key what came of it b-3 forgot"
    assert record(console.url, "b-3") is None and record(console.url, "b-4") is not None


def test_a_bulk_action_wants_keys_and_at_most_its_limit(console: ConsoleProcess) -> None:
    from idemctl.console.actions import LIMIT

    ana, _ = log_in(console.base)
    nothing = ana.get("/api/actions/bulk-unlock")
    assert nothing.status_code == 400 and "pick the keys" in nothing.json()["error"]
    many = ana.get("/api/actions/bulk-forget", params=[("key", f"k-{i}") for i in range(LIMIT + 1)])
    assert many.status_code == 400 and f"at most {LIMIT}" in many.json()["error"]
    missing = ana.get("/api/actions/bulk-forget", params=[("key", "nobody")]).json()
    assert missing["count"] == 0 and missing["items"][0]["why"] == "no record for key 'nobody'"


def test_a_purge_is_bound_to_its_preview_s_cutoff(console: ConsoleProcess) -> None:
    """Forgotten keys (tombstones past retention) before the dry run are purged; one
    forgotten after it is left for the next purge, and the count typed stays the one the
    dry run showed. (The original console asked again: "purge 2" then, not "purge 1".)"""
    if not console.url.startswith("sqlite"):
        pytest.skip("Redis drops what is past retention by itself: nothing to purge")
    with open_store(console.url) as store:
        for key in ("p-1", "p-2"):
            done = claimed(store, key)
            store.complete(key, done.owner, done.fencing_token, None)
        store.forget("p-1")
        expire_retention(store, "p-1", ago=3600)  # well before the dry run
    ana, csrf = log_in(console.base)
    dry = ana.get("/api/actions/purge", params={"older_than": "0s"}).json()
    assert (dry["count"], dry["confirm"]) == (1, "purge 1")
    with open_store(console.url) as store:
        store.forget("p-2")
    answer = ana.post("/api/actions/purge", data=sent_back(dry, csrf, older_than="0s"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["count"] == 1 and answer.json()["dry_run"] is False
    after = ana.get("/api/actions/purge", params={"older_than": "0s"}).json()
    assert after["count"] == 1  # p-2's tombstone, forgotten after the preview


# In a browser: the keys picked in the list, one confirmation ------------------------------

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"


def test_an_operator_picks_keys_in_the_list_and_unlocks_them_with_one_confirmation(
    tmp_path: Path, browser: Any
) -> None:
    """The keys list's checkboxes, the bulk dry run (each key's state, whether it would be
    unlocked), the count typed, each key's outcome; screenshots for the docs."""
    from selenium.webdriver.common.by import By

    from tests.console.test_browser import click
    from tests.console.test_browser import log_in as browser_log_in

    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        store.provision()
        stale(store, "pay-stuck-1", "pay-stuck-2", "pay-stuck-3")
        done = claimed(store, "pay-done-4")
        store.complete("pay-done-4", done.owner, done.fencing_token, None)
        failed = claimed(store, "pay-failed-5")
        store.fail("pay-failed-5", failed.owner, failed.fencing_token, "card declined")
    process = ConsoleProcess(url, tmp_path, "--allow-repair")
    try:
        browser_log_in(browser, process.base, "ana", PASSWORDS["ana"])
        browser.get(f"{process.base}/keys?prefix=pay-")
        for box in browser.find_elements(By.CSS_SELECTOR, "input.pick"):
            if box.get_attribute("value") in ("pay-stuck-1", "pay-stuck-3", "pay-done-4"):
                box.click()
        click(browser, By.ID, "bulk-unlock")
        assert browser.find_element(By.ID, "expected").text == "unlock 2 keys"
        rows = browser.find_element(By.ID, "picked").text
        assert "pay-done-4" in rows and "no: key 'pay-done-4' is completed" in rows
        browser.find_element(By.ID, "confirm").send_keys("unlock 2 keys")
        SHOTS.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SHOTS / "bulk-confirm.png"))
        click(browser, By.ID, "do")
        assert browser.find_element(By.ID, "result").text == "bulk-unlock: 2 done."
        outcomes = browser.find_element(By.ID, "outcomes").text
        assert "pay-stuck-1 freed" in outcomes and "pay-stuck-3 freed" in outcomes
        browser.save_screenshot(str(SHOTS / "bulk-done.png"))
        assert record(url, "pay-stuck-1").owner is None and record(url, "pay-stuck-2").owner
        # Finding 3 in the browser: a forget previewed as failed, completed meanwhile.
        browser.get(f"{process.base}/actions/forget?key=pay-failed-5")
        assert "The record is failed, attempt 1" in browser.find_element(By.ID, "state").text
        with open_store(url) as store:
            retry = claimed(store, "pay-failed-5")
            store.complete("pay-failed-5", retry.owner, retry.fencing_token, {"charge": "ch_5"})
        browser.find_element(By.ID, "confirm").send_keys("pay-failed-5")
        click(browser, By.ID, "do")
        assert browser.find_element(By.ID, "changed").text.startswith("nothing was done")
        said = browser.find_element(By.ID, "changes").text
        assert "previewed as failed" in said and "now completed" in said
        assert "The record is completed, attempt 2" in browser.find_element(By.ID, "state").text
        browser.save_screenshot(str(SHOTS / "confirm-changed.png"))
        assert record(url, "pay-failed-5").status is Status.COMPLETED
        browser.find_element(By.ID, "confirm").send_keys("pay-failed-5")  # the new preview
        click(browser, By.ID, "do")
        assert record(url, "pay-failed-5") is None
    finally:
        process.stop()
