"""The fence through the HTTP middleware, under real uvicorn processes: a request's server
SIGSTOPped past its lease, the client's retry taken over by a second server, whose charge
to the called service lands; the first server, resumed, charges too and is refused by the
service (409 stale-fence): the middleware logs it, keeps its hands off the key, and answers
the first client with the taker's stored response. One charge at the service, the taker's."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http.servers import AppServer
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(180)


def test_a_stopped_servers_late_charge_is_refused_and_its_client_gets_the_takers_answer(
    tmp_path: Path,
) -> None:
    ledger, inside, go = tmp_path / "service.db", tmp_path / "inside", tmp_path / "go"
    store = f"sqlite:///{tmp_path}/keys.db"
    service_app = "examples.fence.service:app"
    with AppServer("uvicorn", "memory://", ledger, tmp_path, app=service_app) as service:
        env = {"SERVICE_URL": service.base_url, "INSIDE": str(inside), "GO": str(go),
               "IDEMCTL_LEASE": "1"}  # fmt: skip
        app = "tests.fence.http_app:app"
        for folder in ("a", "b"):
            (tmp_path / folder).mkdir()
        first = AppServer("uvicorn", store, ledger, tmp_path / "a", app=app, **env)
        second = AppServer("uvicorn", store, ledger, tmp_path / "b", app=app, **env)
        with first, second:
            key = {"Idempotency-Key": '"pay-1"'}
            answered: dict[str, Any] = {}

            def first_client() -> None:
                with httpx.Client(base_url=first.base_url, timeout=120) as c:
                    answered["first"] = c.post("/pay", headers={**key, "x-hold": "1"})

            client = threading.Thread(target=first_client)
            client.start()
            wait_until(inside.exists, "the first request inside the app")
            assert first.pid is not None
            first_pid = first.pid
            os.kill(first_pid, signal.SIGSTOP)  # its heartbeat stops with it
            try:
                with httpx.Client(base_url=second.base_url, timeout=60) as c:

                    def retried() -> httpx.Response | None:
                        answer = c.post("/pay", headers=key)
                        return answer if answer.status_code == 201 else None

                    taken = wait_until(retried, "the retry taken over once the lease ran out")
                go.touch()
            finally:
                os.kill(first_pid, signal.SIGCONT)
            client.join(120)
            assert not client.is_alive()
        log = (tmp_path / "a").glob("uvicorn-*.log")
        text = "".join(p.read_text() for p in log)
    token = taken.json()["token"]
    late = answered["first"]
    assert late.status_code == 201 and late.json() == taken.json()  # the taker's response
    assert late.headers.get("idempotent-replayed") == "true"
    assert "refused for key" in text and f"older than {token}" in text, text[-3000:]
    with sqlite3.connect(ledger) as db:
        rows = db.execute("SELECT payment, idemctl_token FROM charges").fetchall()
    assert len(rows) == 1 and rows[0][1] == token  # one charge, the taker's
