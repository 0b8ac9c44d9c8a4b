"""The operator log as the record (issue 59, finding 5 and the lower ones), against real
``idemctl console`` processes: logins, failed logins, logouts and refusals logged; a key
and an entity of the same name logged apart; every line following
``schemas/operator-log.schema.json``; the default log under the state directory, never the
working directory. (An unwritable log at start and at an action: ``test_security.py``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from idemctl import open_store
from idemctl.console.auth import hash_password
from idemctl.model import ClaimRequest, Guard, Settle
from tests.backends import expire_lease
from tests.cli.helpers import validate
from tests.console.conftest import PASSWORDS, REPO, ConsoleProcess
from tests.console.test_security import csrf_of, log_in, logged, login
from tests.polling import wait_until
from tests.servers import HOST, free_port, http_answers

TWINS = ("entity account:0001", "account:0001")
"""A key and an entity whose names the old log wrote alike (``forget`` on both)."""


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/keys.db"
    with open_store(url) as store:
        store.provision()
        store.claim_many([ClaimRequest("pay-stuck-1")], lease=3600)
        expire_lease(store, "pay-stuck-1", ago=600)
        key, entity = TWINS
        done = store.claim(key, lease=3600)
        store.complete(key, done.owner, done.fencing_token, None)
        event = store.claim("account-event-1", lease=3600)
        store.guard_many([Guard(entity, 1, "account-event-1", event.fencing_token)])
        store.settle_many([Settle(entity, 1, "account-event-1", event.fencing_token)])
        store.complete("account-event-1", event.owner, event.fencing_token, None)
    return url


@pytest.fixture
def console(store_url: str, tmp_path: Path) -> Iterator[ConsoleProcess]:
    process = ConsoleProcess(store_url, tmp_path, "--allow-repair")
    try:
        yield process
    finally:
        process.stop()


def confirmed(client: httpx.Client, name: str, token: str, **params: str) -> httpx.Response:
    """``name`` acted on ``params``, sending back what its dry run asked for."""
    preview = client.get(f"/api/actions/{name}", params=params)
    assert preview.status_code == 200, preview.text
    asked = preview.json()
    form = {**params, "csrf": token, "confirm": asked["confirm"]}
    if "preview" in asked:
        form["preview"] = asked["preview"]
    return client.post(f"/api/actions/{name}", data=form)


def test_logins_failures_logouts_and_refusals_are_logged_each_line_by_the_schema(
    console: ConsoleProcess,
) -> None:
    client = httpx.Client(base_url=console.base, timeout=60)
    assert login(client, "ana", "wrong horse").status_code == 401
    assert login(client, "nobody", "right horse").status_code == 401
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    bo = log_in(console.base, "bo", PASSWORDS["bo"])
    theirs = csrf_of(bo.get("/").text)
    refused = bo.post(
        "/api/actions/unlock", data={"csrf": theirs, "key": "pay-stuck-1", "confirm": "pay-stuck-1"}
    )
    assert refused.status_code == 403
    assert (
        ana.post("/api/actions/unlock", data={"csrf": "forged", "key": "pay-stuck-1"}).status_code
        == 403
    )
    token = csrf_of(ana.get("/").text)
    assert ana.post("/logout", data={"csrf": token}).status_code == 303
    lines = logged(console)
    for line in lines:
        validate("operator-log.schema.json", line)
    seen = [(e["user"], e["action"], e["target"], e["result"]) for e in lines]
    assert ("-", "login", "ana", "failed") in seen, seen  # who it was is not proven
    assert ("-", "login", "", "failed: no such user") in seen, seen
    assert ("ana", "login", "ana", "ok") in seen and ("bo", "login", "bo", "ok") in seen
    assert ("ana", "logout", "ana", "ok") in seen
    assert all(e["target_kind"] == "user" for e in lines if e["action"] in ("login", "logout"))
    bo_refused = [e for e in lines if e["user"] == "bo" and e["action"] == "refused"]
    assert bo_refused and bo_refused[0]["result"].startswith("403"), lines
    assert any(e["user"] == "ana" and e["action"] == "refused" for e in lines), lines
    assert all(e["address"] == HOST for e in lines)
    assert "right horse" not in console.log.read_text()  # no password, even a wrong one
    assert "wrong horse" not in console.log.read_text()
    assert "nobody" not in console.log.read_text()  # a name no one has: maybe a password


def test_a_key_and_an_entity_of_the_same_name_are_logged_apart(console: ConsoleProcess) -> None:
    ana = log_in(console.base, "ana", PASSWORDS["ana"])
    token = csrf_of(ana.get("/").text)
    key, entity = TWINS
    assert confirmed(ana, "forget", token, key=key).status_code == 200
    assert confirmed(ana, "forget", token, entity=entity).status_code == 200
    forgot = [e for e in logged(console) if e["action"] == "forget" and e["result"] != "started"]
    assert [(e["target_kind"], e["target"]) for e in forgot] == [("key", key), ("entity", entity)]
    for line in logged(console):
        validate("operator-log.schema.json", line)


class Started:
    """An ``idemctl console`` of the test's own making (its environment, its folder)."""

    def __init__(self, command: list[str], env: dict[str, str], cwd: Path, err: Path) -> None:
        self.port = free_port()
        with err.open("wb") as out:
            self.proc = subprocess.Popen(
                [*command, "--bind", f"{HOST}:{self.port}"], env=env, cwd=cwd, stderr=out
            )
        wait_until(
            lambda: http_answers(self.port),
            "the console answers",
            interval=0.1,
            procs=[self.proc],
            detail=err.read_text,
        )
        self.base = f"http://{HOST}:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.mark.parametrize("state", ["xdg", "home"])
def test_the_default_operator_log_is_under_the_state_directory(
    store_url: str, tmp_path: Path, state: str
) -> None:
    users = tmp_path / "users.txt"
    users.write_text(f"ana operator {hash_password(PASSWORDS['ana'])}\n")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "XDG_STATE_HOME"}
    env.update(PYTHONPATH=str(REPO), HOME=str(home))
    if state == "xdg":
        env["XDG_STATE_HOME"] = str(tmp_path / "state")
        expected = tmp_path / "state" / "idemctl" / "console-operator.log"
    else:
        expected = home / ".local" / "state" / "idemctl" / "console-operator.log"
    command = [sys.executable, "-m", "idemctl", "--store", store_url, "console",
               "--users", str(users)]  # fmt: skip
    process = Started(command, env, work, tmp_path / "console.err")
    try:
        client = httpx.Client(base_url=process.base, timeout=60)
        assert login(client, "ana", PASSWORDS["ana"]).status_code == 303
        lines: list[dict[str, Any]] = [json.loads(x) for x in expected.read_text().splitlines()]
        assert [(e["user"], e["action"], e["result"]) for e in lines] == [("ana", "login", "ok")]
        assert list(work.iterdir()) == []  # nothing in the working directory
    finally:
        process.stop()
