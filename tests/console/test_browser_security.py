"""DNS rebinding in a real browser (issue 59, finding 2): headless chromium resolves
``attacker.test`` to 127.0.0.1 (``--host-resolver-rules``), as a rebinding name does once
its page is loaded, and a ``--no-auth --allow-repair`` console on loopback is the target.

A page of ``http://attacker.test:PORT`` is same-origin with the console's answers under
that name, so the browser's cross-site checks let its scripts read and post. The
attacker's script is run in that page's context (``execute_async_script``: the console's
own CSP forbids inline scripts, the attacker's server would serve one): the console must
answer it 421, read nothing and do nothing. The same script from the console's own origin
is the control."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.console.conftest import CHROMEDRIVER, CHROMIUM, ConsoleProcess
from tests.console.test_security import SECRET, held, open_console, store_url  # noqa: F401

REBOUND = "attacker.test"

ATTACK = """
const done = arguments[arguments.length - 1];
(async () => {
  const read = await fetch('/api/keys/pay-done-3');
  const shown = await fetch('/api/keys/pay-done-3', {method: 'POST', body: new URLSearchParams()});
  const form = new URLSearchParams({key: 'pay-stuck-1', confirm: 'pay-stuck-1'});
  const acted = await fetch('/api/actions/unlock', {method: 'POST', body: form});
  done({read: read.status, shown: shown.status, acted: acted.status,
        text: (await read.text()) + (await shown.text()) + (await acted.text())});
})().catch(e => done({error: String(e)}));
"""


@pytest.fixture
def rebinding_browser() -> Iterator[Any]:
    """Chromium for which ``attacker.test`` is 127.0.0.1."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing (scripts/install-servers)")
        pytest.skip("chromium and chromium-driver are missing")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900",
        f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_a_rebinding_page_can_neither_read_nor_act(
    open_console: ConsoleProcess,  # noqa: F811
    rebinding_browser: Any,
) -> None:
    from selenium.webdriver.common.by import By

    driver = rebinding_browser
    driver.get(f"http://{REBOUND}:{open_console.port}/")
    assert "421" in driver.find_element(By.TAG_NAME, "body").text
    found = driver.execute_async_script(ATTACK)
    assert "error" not in found, found
    assert (found["read"], found["shown"], found["acted"]) == (421, 421, 421), found
    assert "pay-done-3" not in found["text"] and SECRET["charge"] not in found["text"]
    assert held(open_console.url, "pay-stuck-1")
    # The control: the same script from the console's own origin reads (a record, masked).
    driver.get(f"{open_console.base}/")
    own = driver.execute_async_script(ATTACK)
    assert own["read"] == 200 and "pay-done-3" in own["text"], own
    assert SECRET["charge"] in own["text"]  # --no-auth: the local operator may reveal
