"""Benchmark: what the Idempotency-Key middleware costs an HTTP API.

    .venv/bin/python benchmarks/http_overhead.py [--requests 400] [--rounds 5]

The example app's ``POST /charges`` (examples/http/asgi_app.py: parse the JSON, append one
line to a ledger in a thread, answer 201) under uvicorn, one worker each, three ways at
once, with the store on one redis-server:

- ``plain``: no middleware (every request charges);
- ``idemctl``: ``idemctl.http.asgi`` on the Redis store;
- ``peer``: asgi-idempotency-header 0.2.0 with its Redis backend (the ``bench`` extra has
  it), left out with a note where it does not import.

Each round sends ``--requests`` requests one after another on one keep-alive connection
(http.client) to each server in turn: first requests (a new key each; plain: a new order
each), then the same keys again (replays). It prints the mean time a request takes and
requests a second per way and round, then the medians over rounds of: the time the
middleware adds to a first request (ms, against plain in the same round), and replays'
requests a second against plain's first requests. Ratios and differences only, taken in
the same run: the machine's speed cancels out; nothing is asserted on time. Servers run
on free loopback ports and are stopped by PID.
"""

from __future__ import annotations

import argparse
import http.client
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.http.servers import AppServer  # noqa: E402
from tests.servers import HOST, RedisServer  # noqa: E402

WAYS = ("plain", "idemctl", "peer")


def peer_installed() -> bool:
    try:
        import fastapi  # noqa: F401 - its Redis backend imports fastapi.responses
        import idempotency_header_middleware  # noqa: F401
    except ImportError:
        return False
    return True


class Server:
    """uvicorn serving benchmarks/http_apps.py as ``way``: tests/http's AppServer, which
    leads a process group of its own and is stopped by its PID."""

    def __init__(self, way: str, redis_url: str, tmp: Path) -> None:
        self.way = way
        self.app = AppServer(
            "uvicorn", f"{redis_url}?prefix=bench:", tmp / f"{way}.ledger", tmp,
            app="benchmarks.http_apps:app", BENCH_APP=way, PEER_REDIS=redis_url,
        ).start(timeout=60)  # fmt: skip
        self.conn = http.client.HTTPConnection(HOST, self.app.port, timeout=30)

    def post(self, key: str | None, order: str) -> tuple[int, bool]:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = f'"{key}"'
        body = b'{"order": "%s", "amount": 500}' % order.encode()
        self.conn.request("POST", "/charges", body, headers)
        answer = self.conn.getresponse()
        answer.read()
        return answer.status, answer.getheader("Idempotent-Replayed") == "true"

    def stop(self) -> None:
        self.app.stop()


def key_less(keys: list[str | None]) -> bool:
    return keys[0] is None


def timed(server: Server, keys: list[str | None], orders: list[str], replay: bool) -> float:
    """Mean seconds a request, checking each answer (201; a replay marked as one, where
    the middleware marks them)."""
    server.conn.close()  # a new connection: uvicorn closes one idle for 5 s
    server.post(None if key_less(keys) else f"warm-{uuid.uuid4().hex}", "warm")
    started = time.perf_counter()
    for key, order in zip(keys, orders, strict=True):
        status, replayed = server.post(key, order)
        if status != 201 or (replay and key is not None and not replayed):
            raise SystemExit(f"{server.way}: answered {status}, replayed={replayed}")
    return (time.perf_counter() - started) / len(keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    ways = [w for w in WAYS if w != "peer" or peer_installed()]
    if "peer" not in ways:
        print(
            "peer: asgi-idempotency-header (and fastapi) not installed: pip install -e '.[bench]'"
        )
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (scripts/install-servers)")
    tmp = Path(tempfile.mkdtemp(prefix="http-bench-"))
    redis = RedisServer(tmp).start()
    servers: dict[str, Server] = {}
    try:
        url = f"redis://{HOST}:{redis.port}/0"
        from idemctl import open_store

        with open_store(f"{url}?prefix=bench:") as store:
            store.provision()
        servers = {way: Server(way, url, tmp) for way in ways}
        for server in servers.values():  # warm: imports, connections, the thread pool
            timed(server, [f"warm-{uuid.uuid4().hex}" for _ in range(50)], ["w"] * 50, False)
        print(f"{args.requests} requests a way and round, one connection, uvicorn 1 worker each")
        heads = ("round", "way", "first ms", "first/s", "replay ms", "replay/s")
        print("{:>5}  {:<8} {:>9} {:>8} {:>10} {:>9}".format(*heads))
        added: dict[str, list[float]] = {w: [] for w in ways if w != "plain"}
        replay_ratio: dict[str, list[float]] = {w: [] for w in ways if w != "plain"}
        for r in range(1, args.rounds + 1):
            firsts: dict[str, float] = {}
            replays: dict[str, float] = {}
            for way in ways if r % 2 else ways[::-1]:  # alternate who goes first
                server = servers[way]
                orders = [f"o-{uuid.uuid4().hex[:12]}" for _ in range(args.requests)]
                keys: list[str | None] = (
                    [None] * args.requests if way == "plain" else [f"k-{o}" for o in orders]
                )
                firsts[way] = timed(server, keys, orders, replay=False)
                shown = ""
                if way != "plain":
                    replays[way] = timed(server, keys, orders, replay=True)
                    shown = f"{replays[way] * 1e3:10.3f} {1 / replays[way]:9.0f}"
                print(f"{r:>5}  {way:<8} {firsts[way] * 1e3:9.3f} {1 / firsts[way]:8.0f} {shown}")
            for way, adds in added.items():
                adds.append((firsts[way] - firsts["plain"]) * 1e3)
                replay_ratio[way].append(firsts["plain"] / replays[way])
        print()
        for way, adds in added.items():
            print(
                f"{way}: adds {statistics.median(adds):.3f} ms to a first request "
                f"(median of rounds; {', '.join(f'{a:.3f}' for a in adds)}); "
                f"replays run at {statistics.median(replay_ratio[way]):.2f}x plain's first "
                f"requests a second ({', '.join(f'{x:.2f}' for x in replay_ratio[way])})"
            )
    finally:
        for server in servers.values():
            server.stop()
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
