"""A real ``idemctl console`` process on a free loopback port, and a real browser (Debian's
chromium through chromedriver, headless), each started here and stopped by its PID."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idemctl.console.auth import hash_password
from tests.polling import wait_until
from tests.powertools.conftest import _no_lambda_env, redis_client, redis_pt  # noqa: F401
from tests.servers import HOST, free_port, http_answers

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
PASSWORDS = {"ana": "right horse", "bo": "battery staple"}


class ConsoleProcess:
    shots = False
    """Whether its browser tests take the docs' screenshots."""

    def __init__(
        self, url: str, folder: Path, *options: str, bind: str = HOST, path: Path | None = None
    ) -> None:
        """``path``: a folder put first on the console's PYTHONPATH (a ``sitecustomize``
        there can set the store's limits)."""
        self.url = url
        self.port = free_port()
        self.log = folder / "operator.log"
        users = folder / "users.txt"
        users.write_text(
            f"ana operator {hash_password(PASSWORDS['ana'])}\n"
            f"bo viewer {hash_password(PASSWORDS['bo'])}\n"
        )
        command = [
            sys.executable, "-m", "idemctl", "--store", url, "console",
            "--bind", f"{bind}:{self.port}", "--users", str(users),
            "--operator-log", str(self.log), *options,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (path, REPO) if p)}
        self.stderr = folder / "console.err"
        with self.stderr.open("wb") as err:  # a file, never a pipe that fills and blocks it
            self.proc = subprocess.Popen(command, env=env, stderr=err)
        wait_until(
            lambda: http_answers(self.port),
            "the console answers",
            interval=0.1,
            procs=[self.proc],
            detail=self.stderr.read_text,
        )

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def browser() -> Iterator[Any]:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromium-driver are missing (scripts/install-servers)")
        pytest.skip("chromium and chromium-driver are missing")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
