"""The console in a real browser (headless chromium) against a real ``idemctl console``
process: log in, find a stale key by prefix, open it, unlock it with the typed
confirmation, and see the action in the operator log; a viewer has no action button and a
forged POST gets 403; a key holding markup renders as text; a wrong password is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from idemctl import open_store
from idemctl.model import ClaimRequest
from tests.backends import expire_lease
from tests.console.conftest import PASSWORDS, ConsoleProcess

SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images" / "console"


@pytest.fixture
def console(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest("pay-stuck-1"), ClaimRequest("pay-ok-2")], lease=3600)
        expire_lease(store, "pay-stuck-1", ago=600)
        store.claim("<script>alert(1)</script>", lease=3600)
    process = ConsoleProcess(url, tmp_path, "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


def log_in(driver: Any, base: str, name: str, password: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/login")
    driver.find_element(By.ID, "name").send_keys(name)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "submit").click()


def test_an_operator_finds_a_stale_key_unlocks_it_and_sees_it_logged(
    console: ConsoleProcess, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", PASSWORDS["ana"])
    assert browser.find_element(By.ID, "total").text == "3"
    browser.get(f"{console.base}/keys")
    browser.find_element(By.ID, "prefix").send_keys("pay-")
    browser.find_element(By.ID, "stale").click()
    browser.find_element(By.ID, "find").click()
    found = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert found == ["pay-stuck-1"]
    browser.find_element(By.LINK_TEXT, "pay-stuck-1").click()
    browser.find_element(By.ID, "unlock").click()
    browser.find_element(By.ID, "confirm").send_keys("pay-stuck-1")
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "confirm.png"))
    browser.find_element(By.ID, "do").click()
    rows = browser.find_element(By.ID, "log").text
    assert "ana unlock pay-stuck-1" in rows
    browser.save_screenshot(str(SHOTS / "operator-log.png"))


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
    cookie = browser.get_cookie("idemctl_session")["value"]
    forged = httpx.post(
        f"{console.base}/actions/unlock", cookies={"idemctl_session": cookie},
        data={"key": "pay-stuck-1", "confirm": "pay-stuck-1", "csrf": "guessed"},
    )  # fmt: skip
    assert forged.status_code == 403


def test_a_wrong_password_is_refused(console: ConsoleProcess, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    log_in(browser, console.base, "ana", "wrong horse")
    assert browser.find_element(By.ID, "login-error").text == "wrong name or password"
    assert browser.get_cookie("idemctl_session") is None
