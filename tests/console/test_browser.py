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


def click(driver: Any, by: str, what: str) -> None:
    """Click, then wait for the page it loads (reading the old page meanwhile is a race)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as loaded
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(by, what).click()
    WebDriverWait(driver, 30).until(loaded.staleness_of(page))


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
    assert browser.find_element(By.ID, "total").text == "3"
    browser.get(f"{console.base}/keys")
    browser.find_element(By.ID, "prefix").send_keys("pay-")
    browser.find_element(By.ID, "stale").click()
    click(browser, By.ID, "find")
    found = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#keys a.key")]
    assert found == ["pay-stuck-1"]
    click(browser, By.LINK_TEXT, "pay-stuck-1")
    click(browser, By.ID, "unlock")
    browser.find_element(By.ID, "confirm").send_keys("pay-stuck-1")
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "confirm.png"))
    click(browser, By.ID, "do")
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
