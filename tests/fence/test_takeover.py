"""The acceptance of fenced effects, on each helper against its real server (SQLite files,
PostgreSQL, redis-server, moto's DynamoDB server, and a service called over HTTP under
uvicorn that fences its own ledger with the headers it is sent): a holder SIGSTOPped past
its lease is taken over; the takeover charges through the fence and completes; the holder,
resumed, charges too and is refused by its token, logged, and not retried; one charge is
there, the takeover's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from idemctl import Acquired, open_store
from idemctl.fence import Fence
from tests.backends import unique_schema
from tests.fence.effects import KINDS, landed, prepare, write
from tests.http.servers import AppServer
from tests.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=KINDS)
def effect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    kind = request.param
    target: dict[str, Any] = {"name": f"charges_{uuid.uuid4().hex[:12]}"}
    if kind == "sqlite":
        target["path"] = str(tmp_path / "effects.db")
    elif kind == "postgres":
        target["dsn"] = request.getfixturevalue("postgres_server").dsn()
    elif kind.startswith("redis-"):
        target["port"] = request.getfixturevalue("redis_server").port
    elif kind == "dynamodb":
        target["endpoint"] = request.getfixturevalue("moto_server").endpoint_url
    else:  # the service being called, under uvicorn, fencing its own ledger
        target.update(name="charges", path=str(tmp_path / "service.db"))
    prepare(kind, target)
    if kind != "http":
        yield kind, target
        return
    app = "examples.fence.service:app"
    with AppServer("uvicorn", "memory://", Path(target["path"]), tmp_path, app=app) as service:
        target["url"] = service.base_url
        yield kind, target


def test_a_holder_stopped_past_its_lease_has_its_late_write_refused(
    effect: tuple[str, dict[str, Any]], request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kind, target = effect
    if kind == "postgres":
        store_url = request.getfixturevalue("postgres_server").url(schema=unique_schema())
    else:
        store_url = f"sqlite:///{tmp_path}/keys.db"
    go = tmp_path / "go"
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.fence.effects", store_url, kind, json.dumps(target), str(go)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        word, attempt, held = holder.stdout.readline().split()
        assert (word, attempt) == ("running", "1")
        holder.send_signal(signal.SIGSTOP)  # its heartbeat stops with it
        with open_store(store_url) as store:
            # the 1 s lease runs out by the store's clock while the holder is stopped
            def takeover() -> Acquired | None:
                claim = store.claim("pay-1", None, 30)
                return claim if isinstance(claim, Acquired) else None

            taken = wait_until(takeover, "the stopped holder's key taken over")
            assert taken.takeover and taken.fencing_token > int(held)
            token = taken.fencing_token
            write(kind, target, Fence("pay-1", token))
            store.complete("pay-1", taken.owner, token, "charged")
        go.touch()
        holder.send_signal(signal.SIGCONT)
        out, err = holder.communicate(timeout=60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert holder.returncode == 0, err
    assert out.split() == ["outcome", "lease_lost"]  # ran once, not retried
    assert f"refused for key 'pay-1': its token {held} is older than {token}" in err
    assert landed(kind, target) == [("pay-1", token)]  # the takeover's charge, once
