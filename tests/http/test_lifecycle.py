"""What happens across a request's life on real servers: a server SIGKILLed mid-request
(the retry charges once, after the lease: never a stuck 409), a slow request whose
heartbeat holds its key, and ``wait=``, where concurrent duplicates get the first one's
response instead of 409."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from idemctl.model import Status
from tests.backends import expire_lease
from tests.http.conftest import (
    MATRIX,
    SERVERS,
    Served,
    problem,
    serve,
    store_url,
    stored_key,
    unique,
)
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(params=MATRIX, ids=lambda p: f"{p[0]}-{p[1]}")
def kind_and_url(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    kind, family = request.param
    return kind, store_url(request, family, tmp_path)


def in_progress(served: Served, key: str, timeout: float = 60) -> None:
    """Wait until a request holds ``key`` (the store says so)."""
    with served.store() as store:

        def taken() -> bool:
            record = store.get(key)
            return record is not None and record.status is Status.IN_PROGRESS and bool(record.owner)

        wait_until(taken, f"a request took {key}", timeout, interval=0.02)


def test_a_server_killed_mid_request_lets_the_retry_charge_once(
    kind_and_url: tuple[str, str], tmp_path: Path
) -> None:
    kind, url = kind_and_url
    key, order, ledger = unique("k"), unique("o"), tmp_path / "ledger"
    lost: list[BaseException] = []
    with serve(kind, url, tmp_path / "first", ledger=ledger) as served:

        def doomed() -> None:
            try:
                served.charge(key, order, delay=120)
            except httpx.HTTPError as exc:  # the server died under it
                lost.append(exc)

        request = threading.Thread(target=doomed)
        request.start()
        in_progress(served, stored_key(key))
        served.server.kill()
        request.join(30)
        assert lost and not request.is_alive()

    with serve(kind, url, tmp_path / "second", ledger=ledger) as retry:
        busy = retry.charge(key, order)  # the dead request's lease is still live: 409
        problem(busy, 409, "request-in-progress")
        assert int(busy.headers["retry-after"]) >= 1
        with retry.store() as store:  # its lease over, on the store's clock
            expire_lease(store, stored_key(key))
        taken = retry.charge(key, order)
        assert taken.status_code == 201 and "idempotent-replayed" not in taken.headers
        assert retry.charge(key, order).content == taken.content
        assert retry.charges(order) == 1
        with retry.store() as store:
            record = store.get(stored_key(key))
        assert record is not None and record.status is Status.COMPLETED and record.attempts == 2


BOTH_SERVERS = [(server, family) for server in SERVERS for family in ("sqlite", "redis")]


def served_with(
    request: pytest.FixtureRequest, tmp_path: Path, env: dict[str, str]
) -> Iterator[Served]:
    """The example app under the param's server and store, with ``env`` set."""
    kind, family = request.param
    with serve(kind, store_url(request, family, tmp_path), tmp_path, env=env) as running:
        yield running


@pytest.fixture(params=BOTH_SERVERS, ids=lambda p: f"{p[0]}-{p[1]}")
def waiting(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    yield from served_with(request, tmp_path, {"IDEMCTL_WAIT": "60"})


def test_with_wait_concurrent_duplicates_get_the_first_response(waiting: Served) -> None:
    key, order = unique("k"), unique("o")
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda _: waiting.charge(key, order, delay=1), range(20)))
    assert [a.status_code for a in answers] == [201] * 20
    assert len({a.content for a in answers}) == 1
    assert sum("idempotent-replayed" not in a.headers for a in answers) == 1
    assert waiting.charges(order) == 1


@pytest.fixture(params=BOTH_SERVERS, ids=lambda p: f"{p[0]}-{p[1]}")
def short_lease(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    yield from served_with(request, tmp_path, {"IDEMCTL_LEASE": "3"})


def test_the_heartbeat_holds_a_slow_request_past_its_lease(short_lease: Served) -> None:
    """A 3 s lease and a request of 12 s: once the lease it was claimed with is over, the
    store shows the same claim holding the key with its lease extended, and a duplicate
    finds it held (409); the first request's response is stored."""
    key, order = unique("k"), unique("o")
    with ThreadPoolExecutor(1) as pool, short_lease.store() as store:
        slow = pool.submit(short_lease.charge, key, order, delay=12)
        in_progress(short_lease, stored_key(key))
        first = store.get(stored_key(key))
        assert first is not None and first.lease_expires_at is not None
        # The lease it was claimed with over, by the clock the server's heartbeat runs on.
        end = first.lease_expires_at
        wait_until(lambda: datetime.now(UTC) > end, "the first lease is over")
        held = store.get(stored_key(key))
        assert held is not None and held.lease_expires_at is not None
        assert (held.owner, held.fencing_token) == (first.owner, first.fencing_token)
        assert held.lease_expires_at > first.lease_expires_at  # the heartbeat extended it
        problem(short_lease.charge(key, order), 409, "request-in-progress")
        done = slow.result()
    assert done.status_code == 201
    assert short_lease.charge(key, order).content == done.content
    assert short_lease.charges(order) == 1
