"""The console in a real browser (headless chromium) against a real ``idemctl console``
process, on SQLite and on Redis: log in, find a stale key by prefix, open it, unlock it
with the typed confirmation, and see the action in the operator log; reveal a masked
result; sweep the stale keys; a viewer has no action button and a forged POST gets 403; a
key holding markup renders as text; a wrong password is refused. The screenshots of the
docs (docs/images/console/) are the SQLite run's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from idemctl.model import ClaimRequest
from tests.backends import expire_lease, unique_prefix
from tests.console.conftest import PASSWORDS, ConsoleProcess

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"


RESULT = {"charge": "ch_1", "note": "<img src=x onerror=alert(1)>"}


@pytest.fixture(params=["sqlite", "redis"])
def console(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/keys.db"
    else:
        server = request.getfixturevalue("redis_server")
        url = f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest("pay-stuck-1"), ClaimRequest("pay-ok-2")], lease=3600)
        expire_lease(store, "pay-stuck-1", ago=600)
        store.claim("<script>alert(1)</script>", lease=3600)
        done = store.claim("pay-done-3", lease=3600)
        store.complete("pay-done-3", done.owner, done.fencing_token, RESULT)
    process = ConsoleProcess(url, tmp_path, "--allow-repair")
    process.shots = request.param == "sqlite"
    try:
        yield process
    finally:
        process.stop()


def shot(console: ConsoleProcess, driver: Any, name: str) -> None:
    """The docs' screenshot ``name`` (from the SQLite run)."""
    if console.shots:
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / f"{name}.png"))


def click(driver: Any, by: str, what: str) -> None:
    """Click, then wait for the page it loads (reading the old page meanwhile is a race)."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(by, what).click()

    def gone(_: Any) -> bool:
        """The old page's root is gone. Asked mid-navigation, chromedriver may say so as
        an inspector error rather than a stale element (CI: "Node with given id does not
        belong to the document")."""
        try:
            page.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as exc:
            if "does not belong to the document" in str(exc):
                return True
            raise
        return False

    WebDriverWait(driver, 30).until(gone)


def log_in(driver: Any, base: str, name: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/login")
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.ID, "password").send_keys(password)
    click(driver, By.ID, "submit")


def test_an_operator_finds_a_stale_key_unlocks_it_and_sees_it_logged(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    assert browser.find_element(By.ID, "total").text == "4"
    assert browser.find_element(By.CSS_SELECTOR, "#stale a").text == "1"
    shot(console, browser, "overview")
    browser.get(f"{console.base}/keys")
    browser.find_element(By.ID, "prefix").send_keys("pay-")
    browser.find_element(By.ID, "stale").click()
    click(browser, By.ID, "find")
    found = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert found == ["pay-stuck-1"]
    shot(console, browser, "keys")
    click(browser, By.LINK_TEXT, "pay-stuck-1")
    click(browser, By.ID, "unlock")
    assert "The record is in_progress, attempt 1," in browser.find_element(By.ID, "preview").text
    browser.find_element(By.ID, "confirm").send_keys("pay-stuck-2")  # mistyped: nothing done
    click(browser, By.ID, "do")
    assert browser.find_element(By.ID, "mistyped").text.startswith("the confirmation did not")
    browser.find_element(By.ID, "confirm").send_keys("pay-stuck-1")
    shot(console, browser, "confirm")
    click(browser, By.ID, "do")
    rows = browser.find_element(By.ID, "log").text
    assert "ana unlock pay-stuck-1 1 done" in rows
    shot(console, browser, "operator-log")
    with open_store(console.url) as store:
        record = store.get("pay-stuck-1")
        assert record is not None and record.owner is None  # released: the next claim runs


def test_a_result_is_masked_until_an_operator_reveals_it_and_that_is_logged(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    browser.get(f"{console.base}/keys/pay-done-3")
    assert browser.find_element(By.ID, "result").text.startswith("masked")
    assert "ch_1" not in browser.page_source
    click(browser, By.ID, "reveal")
    shown = browser.find_element(By.CSS_SELECTOR, "#result pre").text
    assert json.loads(shown) == RESULT and "<img src=x onerror=alert(1)>" in shown  # as text
    assert browser.execute_script("return document.querySelectorAll('main img').length") == 0
    shot(console, browser, "key")
    browser.get(f"{console.base}/log")
    assert "ana reveal pay-done-3 shown" in browser.find_element(By.ID, "log").text


def test_an_operator_unlocks_every_stale_key_after_a_dry_run(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    click(browser, By.ID, "unlock-stale")
    assert browser.find_element(By.ID, "preview-keys").text == "pay-stuck-1"
    assert browser.find_element(By.ID, "expected").text == "unlock-stale 1"
    browser.find_element(By.ID, "confirm").send_keys("unlock-stale 1")
    click(browser, By.ID, "do")
    assert "ana unlock-stale older than 0s 1 done" in browser.find_element(By.ID, "log").text
    browser.get(f"{console.base}/")
    assert browser.find_element(By.CSS_SELECTOR, "#stale a").text == "0"


def test_a_key_holding_markup_shows_as_text(console: ConsoleProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "bo", PASSWORDS["bo"])
    browser.get(f"{console.base}/keys")
    keys = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert "<script>alert(1)</script>" in keys
    assert browser.execute_script("return document.querySelectorAll('main script').length") == 0


def test_a_viewer_has_no_action_and_a_forged_post_is_refused(
    console: ConsoleProcess, browser: Any
) -> None:
    import httpx
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "bo", PASSWORDS["bo"])
    browser.get(f"{console.base}/keys/pay-stuck-1")
    assert browser.find_elements(By.ID, "unlock") == []
    assert browser.find_elements(By.ID, "forget") == []
    browser.get(f"{console.base}/keys/pay-done-3")
    assert browser.find_elements(By.ID, "reveal") == []  # a viewer never sees a result
    browser.get(f"{console.base}/")
    assert browser.find_elements(By.ID, "unlock-stale") == []
    cookie = browser.get_cookie("idemctl_session")["value"]
    token = browser.find_element(By.NAME, "csrf").get_attribute("value")  # bo's own
    for csrf in ("guessed", token):
        forged = httpx.post(
            f"{console.base}/actions/unlock", cookies={"idemctl_session": cookie},
            data={"key": "pay-stuck-1", "confirm": "pay-stuck-1", "csrf": csrf},
        )  # fmt: skip
        assert forged.status_code == 403
    with open_store(console.url) as store:
        record = store.get("pay-stuck-1")
        assert record is not None and record.owner is not None  # still held


def test_a_wrong_password_is_refused(console: ConsoleProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", "wrong horse")
    assert browser.find_element(By.ID, "login-error").text == "wrong name or password"
    assert browser.get_cookie("idemctl_session") is None


def test_an_operator_finds_a_tasks_stale_keys_from_the_tasks_page(
    tmp_path: Path, browser: Any
) -> None:
    """The tasks page, by queue and task name; a task's stale count leads to its keys
    whose lease ran out (the docs' screenshot ``tasks``)."""
    from selenium.webdriver.common.by import By

    url = f"sqlite:///{tmp_path}/tasks.db"
    with open_store(url) as store:
        store.provision()
        for order in range(3):
            done = store.claim(f"task:celery:shop.charge#o-{order}", lease=3600)
            store.complete(done.key, done.owner, done.fencing_token, {"charged": 100})
        store.claim_many([ClaimRequest("task:celery:shop.charge#o-7"),
                          ClaimRequest("task:dramatiq:send_receipt#o-1")], lease=3600)  # fmt: skip
        expire_lease(store, "task:celery:shop.charge#o-7", ago=600)  # its worker killed
    console = ConsoleProcess(url, tmp_path)
    console.shots = True
    try:
        log_in(browser, console.base, "ana", PASSWORDS["ana"])
        click(browser, By.ID, "nav-tasks")
        rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#tasks tr")][1:]
        assert len(rows) == 2 and rows[0].startswith("celery shop.charge 1 1 3 0 0")
        assert rows[1].startswith("dramatiq send_receipt 1 0 0 0 0")
        shot(console, browser, "tasks")
        click(browser, By.CSS_SELECTOR, "#tasks a.stale")
        found = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
        assert found == ["task:celery:shop.charge#o-7"]
    finally:
        console.stop()
