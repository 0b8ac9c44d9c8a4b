"""A store outage under charges in flight, on real servers: the example apps under uvicorn
(ASGI) and gunicorn (WSGI), their store a Redis (AOF on, every write fsynced) or a
PostgreSQL of the module's own.

- Redis SIGKILLed with 8 charges in flight (``?delay=2``: claimed, the app sleeping before
  it charges), restarted on the same port and directory once every charge in flight has
  charged (each then meets the dead store as it completes; Redis reloads its AOF); or
  PostgreSQL stopped by its PID (a fast shutdown) and started again on the same data
  directory and port likewise. Each client retries as a client would (on 409, 5xx and
  connection errors, with the same key, back-off, a bounded number of tries): 0 charged
  twice, every client ends with its charge, and that answer is the stored one (a retry
  afterwards replays it byte for byte). Five runs in a row of each (the app's lease is
  ``IDEMCTL_LEASE=10`` s, so that a run on a core that loses the completion is short too).
- The store down before a request: 503 ``store-unavailable`` (application/problem+json)
  with ``Retry-After``, the app not run.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from idemctl import open_store
from idemctl.model import Status
from tests.http.conftest import SERVERS, Served, problem, serve, stored_key, unique
from tests.polling import wait_until
from tests.servers import HOST, PostgresServer, RedisServer

pytestmark = pytest.mark.timeout(600)

CLIENTS = 8
DELAY = 2.0
"""Seconds each charge sleeps before charging: the outage starts while all are asleep."""
RUNS = 5
LEASE = "10"
RETRY_STATUSES = frozenset({409, 500, 502, 503, 504})
"""What a client retries (with the same key), beside connection errors: stripe-python's
rule (409 and any 5xx)."""
TRIES = 25
CLIENT_DEADLINE = 120.0
"""Seconds a client keeps retrying before it gives up (a bound, not an expectation)."""


@dataclass
class StoreServer:
    """The store's server, and how an outage takes it down and brings it back."""

    family: str
    server: RedisServer | PostgresServer
    url: str

    def down(self) -> None:
        """Redis: SIGKILL by PID (nothing flushed but what AOF fsynced). PostgreSQL: a fast
        shutdown by PID (SIGINT: active transactions rolled back, clients disconnected)."""
        if self.family == "redis":
            self.server.kill()
        else:
            self.server.stop()

    def up(self, timeout: float = 60.0) -> None:
        """Start again on the same port, directory and options, once the port is free."""
        wait_until(lambda: bindable(self.server.port), f"port {self.server.port} free", timeout)
        self.server.start(timeout)

    def stop(self) -> None:
        if isinstance(self.server, PostgresServer):
            self.server.remove()
        else:
            self.server.stop()


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def store_server(family: str, directory: Path) -> StoreServer:
    if family == "redis":
        redis = RedisServer(directory, "--appendonly", "yes", "--appendfsync", "always")
        redis.start()
        return StoreServer(family, redis, redis.url())
    postgres = PostgresServer(directory)
    postgres.start()
    return StoreServer(family, postgres, postgres.url(schema="outage", connect_timeout="2s"))


@dataclass
class Outage:
    store: StoreServer
    served: Served


FAMILIES = ("redis", "postgres")


@pytest.fixture(
    scope="module",
    params=[(kind, family) for kind in SERVERS for family in FAMILIES],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def outage(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Outage]:
    kind, family = request.param
    directory = tmp_path_factory.mktemp(f"outage-{kind}-{family}")
    store = store_server(family, directory)
    try:
        with open_store(store.url) as opened:
            opened.provision()
        env = {"IDEMCTL_LEASE": LEASE}
        with serve(kind, store.url, directory / "app", env=env) as served:
            yield Outage(store, served)
    finally:
        store.stop()


@dataclass
class Client:
    """One client's charge: its key and order, and every answer it got (an exception: no
    answer)."""

    key: str
    order: str
    delay: float = DELAY
    answers: list[httpx.Response | Exception] = field(default_factory=list)

    @property
    def final(self) -> httpx.Response | Exception:
        return self.answers[-1]

    def trail(self) -> str:
        return " ".join(
            str(a.status_code) if isinstance(a, httpx.Response) else type(a).__name__
            for a in self.answers
        )


def back_off(tries: int, answer: httpx.Response | None) -> float:
    """Exponential with jitter (0.25 s doubling, at most 4 s), or the answer's
    ``Retry-After`` (at most 5 s)."""
    if answer is not None and answer.headers.get("retry-after", "").isdigit():
        return min(float(answer.headers["retry-after"]), 5.0)
    return min(0.25 * 2**tries, 4.0) * random.uniform(0.5, 1.0)


def charge_until_done(served: Served, client: Client) -> Client:
    """As a client would: the same request with the same key until an answer that is not
    worth retrying, a bounded number of tries."""
    deadline = time.monotonic() + CLIENT_DEADLINE
    for tries in range(TRIES):
        answer: httpx.Response | None = None
        try:
            answer = served.charge(client.key, client.order, delay=client.delay)
        except httpx.TransportError as exc:
            client.answers.append(exc)
        else:
            client.answers.append(answer)
            if answer.status_code not in RETRY_STATUSES:
                return client
        wait = back_off(tries, answer)
        if time.monotonic() + wait > deadline:
            break
        time.sleep(wait)
    return client


def all_in_progress(store_url: str, clients: list[Client], timeout: float = 60.0) -> None:
    """Until each client's key was seen held by a request (the store says so)."""
    keys = [c.key for c in clients]
    seen: set[str] = set()
    with open_store(store_url) as store:

        def all_seen() -> bool:
            for key in set(keys) - seen:
                record = store.get(stored_key(key))
                if record is not None and record.status is Status.IN_PROGRESS:
                    seen.add(key)
            return len(seen) == len(keys)

        def held() -> str:
            trails = "; ".join(f"{c.key}: {c.trail()}" for c in clients)
            return f"held: {len(seen)} of {len(keys)}; {trails}"

        wait_until(all_seen, "every charge held", timeout, interval=0.01, detail=held)


@pytest.mark.parametrize("run", range(RUNS))
def test_a_store_restart_with_charges_in_flight_charges_each_once(outage: Outage, run: int) -> None:
    served, store = outage.served, outage.store
    clients = [Client(unique("k"), unique(f"outage{run}")) for _ in range(CLIENTS)]
    with ThreadPoolExecutor(CLIENTS) as pool:
        running = [pool.submit(charge_until_done, served, c) for c in clients]
        all_in_progress(store.url, clients)
        before = {c.order: served.charges(c.order) for c in clients}
        store.down()
        # Down until every charge in flight has charged: each completion meets the outage.
        charged_all = lambda: all(served.charges(c.order) for c in clients)  # noqa: E731
        wait_until(charged_all, "every charge in flight charged, the store down", CLIENT_DEADLINE)
        during = {c.order: served.charges(c.order) for c in clients}
        store.up()
        for future in running:
            future.result(timeout=CLIENT_DEADLINE + 60)
    charged = {c.order: served.charges(c.order) for c in clients}
    trails = {c.order: c.trail() for c in clients}
    assert sum(before.values()) < CLIENTS, f"all charged before the outage: {before}"
    assert sum(during.values()) > sum(before.values()), f"none charged in the outage: {trails}"
    twice = {o: n for o, n in charged.items() if n > 1}
    assert not twice, f"{len(twice)} of {CLIENTS} charged twice or more: {twice}; {trails}"
    assert charged == dict.fromkeys(charged, 1), (charged, trails)
    for client in clients:
        final = client.final
        assert isinstance(final, httpx.Response) and final.status_code == 201, trails
        assert final.json()["order"] == client.order
        again = served.charge(client.key, client.order, delay=DELAY)
        assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
        assert again.content == final.content, (client.order, again.text, final.text)
    assert {c.order: served.charges(c.order) for c in clients} == charged


def test_the_store_down_before_a_request_is_503_and_the_app_not_run(outage: Outage) -> None:
    served, store = outage.served, outage.store
    warm = served.charge(unique("k"), unique("warm"))  # the app has its store open
    assert warm.status_code == 201, warm.text
    key, order = unique("k"), unique("down")
    store.down()
    try:
        answer = served.charge(key, order)
        doc = problem(answer, 503, "store-unavailable")
        assert int(answer.headers["retry-after"]) >= 1, answer.headers
        assert doc["status"] == 503
        assert served.charges(order) == 0
    finally:
        store.up()
    client = charge_until_done(served, Client(key, order, delay=0))  # the store is back
    assert isinstance(client.final, httpx.Response) and client.final.status_code == 201, (
        client.trail()
    )
    assert served.charges(order) == 1
