"""Benchmark: how fast the web console's pages answer on a large store (issue: "the pages
answer in under 300 ms on a store of 1M keys, SQLite and Redis").

    .venv/bin/python benchmarks/console.py [--stores sqlite,redis] [--keys 1000000]
        [--entities 100000] [--requests 10] [--json]

For each store: fills a store of its own with ``--keys`` keys through the library's batched
paths (``claim_many``, ``complete_many``, ``guard_many`` + ``finish_many``; 500 keys a call,
as ``ops_scale.py`` fills), a mix an operator meets: of every 1,000 keys 987 completed
with a small result, 10 stale (in progress, the lease ended during the fill), 1 in progress
with a live lease (a day), 1 released (in progress, no owner) and 1 failed; the keys under
four prefixes (``order:`` 40%, ``payment:`` 30%, ``email:`` 20%, ``webhook:`` 10%); the first
``--entities`` completed ``order:`` keys each settle an entity of the sequence guard
(``account:NNNNNNNN``). The fill is timed and printed apart from the pages.

Then starts ``idemctl --store URL console --no-auth --bind 127.0.0.1:PORT`` (a process of
its own, as an operator runs it), waits for ``/healthz``, and times every page over one
keep-alive connection (http.client): one warm-up request, then ``--requests`` requests a
page; the time is from sending the request to the last byte of the answer. Printed: the
median and the max in ms, and whether the median is under the 300 ms target (never
asserted). The pages the console may not have (``/api/stats``, ``/api/``, ``/entities``,
``/outbox``, ...) are asked once and timed where they answer 200; the others are named.

Starts redis-server (``ops_scale.py``'s ``server_for``) on a free loopback port; the
console and the server are stopped by their PIDs, temp dirs removed. Exit codes: 0 done,
1 a page did not answer 200 or the console would not start, 2 no redis-server.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    HOST,
    BenchError,
    finish,
    free_port,
    stdout_console,
    stop_on_sigterm,
    stop_process,
)
from ops_scale import CHUNK, server_for, store_url  # noqa: E402

TARGET_MS = 300.0
STORES = ("sqlite", "redis")
PREFIXES = ("order:",) * 4 + ("payment:",) * 3 + ("email:",) * 2 + ("webhook:",)
"""A key's prefix by ``i % 10``: 40% order, 30% payment, 20% email, 10% webhook."""
LIVE_LEASE = 86400.0
"""The lease of the keys left in progress and not stale: a day."""
START_TIMEOUT = 60.0


# The store's keys -----------------------------------------------------------------------


def key_of(i: int) -> str:
    return f"{PREFIXES[i % 10]}{i:09d}"


def kind_of(i: int) -> str:
    """What key ``i`` is left as: spread over the keys by a multiplicative hash, so that
    every prefix and every part of the key order has each kind."""
    r = (i * 2654435761) % 1000
    if r < 10:
        return "stale"
    return {10: "in_progress", 11: "released", 12: "failed"}.get(r, "completed")


def fill(url: str, n: int, entities: int, say: Callable[[str], None]) -> dict[str, Any]:
    """``n`` keys (see the module's docstring) through the library, ``CHUNK`` keys a call;
    the seconds it took and how many of each kind."""
    from idemctl import Acquired, ClaimRequest, Completion, fingerprint, open_store
    from idemctl.model import Guard, Settle, Verdict

    counts = dict.fromkeys(("completed", "stale", "in_progress", "released", "failed"), 0)
    settled = 0
    started = time.perf_counter()
    shown = started
    with open_store(url) as store:
        store.provision()
        provisioned = time.perf_counter() - started
        for first in range(0, n, CHUNK):
            by_kind: dict[str, list[ClaimRequest]] = {kind: [] for kind in counts}
            for i in range(first, min(first + CHUNK, n)):
                payload = {"order": i, "amount": 100 + i % 900}
                by_kind[kind_of(i)].append(ClaimRequest(key_of(i), fingerprint(payload)))
            leases = {"stale": 0.001, "in_progress": LIVE_LEASE}
            got: dict[str, list[Acquired]] = {}
            for kind, requests in by_kind.items():
                if requests:
                    outcomes = store.claim_many(requests, lease=leases.get(kind))
                    got[kind] = [o for o in outcomes if isinstance(o, Acquired)]
                    if len(got[kind]) != len(requests):
                        raise BenchError(f"fill: a new key of {url} was not acquired")
                    counts[kind] += len(requests)
            for o in got.get("released", []):
                store.release(o.key, o.owner, o.fencing_token, handler_ran=False)
            for o in got.get("failed", []):
                store.fail(o.key, o.owner, o.fencing_token, "card declined", retriable=False)
            done = got.get("completed", [])
            completions = [
                Completion(o.key, o.owner, o.fencing_token, {"charged": True, "id": o.key[-9:]})
                for o in done
            ]
            guarded = [o for o in done if o.key.startswith("order:")][: entities - settled]
            guards = [Guard(f"account:{settled + j:08d}", 1, o.key, o.fencing_token)
                      for j, o in enumerate(guarded)]  # fmt: skip
            settles = []
            if guards:
                replies = store.guard_many(guards)
                settles = [
                    Settle(g.entity, g.sequence, g.key, g.fencing_token)
                    for g, r in zip(guards, replies, strict=True)
                    if r.verdict is Verdict.GO
                ]
                settled += len(settles)
            finished = store.finish_many(completions, settles) if settles else \
                store.complete_many(completions)  # fmt: skip
            if not all(finished):
                raise BenchError(f"fill: a key of {url} was not completed")
            now = time.perf_counter()
            if now - shown >= 10 or first + CHUNK >= n:
                shown = now
                done_keys = min(first + CHUNK, n)
                say(f"  {done_keys:>11,} of {n:,} keys in {now - started:6.1f} s "
                    f"({done_keys / (now - started):,.0f} keys/s)")  # fmt: skip
    return {
        "fill_s": time.perf_counter() - started,
        "provision_s": provisioned,
        "kinds": counts,
        "entities": settled,
    }


# The console ------------------------------------------------------------------------------


class ConsoleServer:
    """``idemctl console --no-auth`` on a free loopback port, stopped by its PID."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.port = free_port()
        self.stderr = tmp / "console.stderr"
        self.oplog = tmp / "operator.log"
        command = [
            sys.executable, "-m", "idemctl", "--store", url, "console", "--no-auth",
            "--bind", f"{HOST}:{self.port}", "--operator-log", str(self.oplog),
        ]  # fmt: skip
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        with self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                command, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.stderr.read_text(errors="replace")[-2000:]
                raise BenchError(f"the console did not answer /healthz; it said:\n{tail}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=2)
        try:
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        stop_process(self.proc)


class Client:
    """One keep-alive connection; reconnects once where the server closed it (uvicorn
    closes a connection idle for 5 s)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection(HOST, port, timeout=600)

    def get(self, path: str) -> tuple[int, bytes, float]:
        for attempt in (1, 2):
            started = time.perf_counter()
            try:
                self.conn.request("GET", path)
                answer = self.conn.getresponse()
                body = answer.read()
            except (http.client.RemoteDisconnected, ConnectionError, BrokenPipeError):
                self.conn.close()
                if attempt == 2:
                    raise
                continue
            return answer.status, body, time.perf_counter() - started
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


def pages(client: Client, n: int, entities: int) -> tuple[list[tuple[str, str]], list[str]]:
    """(page, path) of every page timed, and what was left out: the second page's cursor is
    read from /api/keys; the pages the console may or may not have (``/api/stats``,
    ``/entities``, ...) are asked once and timed where they answer 200."""
    status, body, _ = client.get("/api/keys")
    if status != 200:
        raise BenchError(f"/api/keys answered {status}: {body[:300]!r}")
    cursor = json.loads(body)["cursor"]
    middle = n // 2
    while kind_of(middle) != "completed":
        middle += 1
    key = key_of(middle)
    narrow = key[:-1]  # the keys numbered as ``key`` but for the last digit, of its prefix
    first = middle - middle % 10
    few = sum(key_of(i).startswith(narrow) for i in range(first, min(first + 10, n)))
    listed: list[tuple[str, str | None]] = [
        ("overview /", "/"),
        ("/keys", "/keys"),
        ("/keys, page 2 (cursor)", f"/keys?cursor={quote(cursor, safe='')}" if cursor else None),
        ("/keys?prefix=order: (40%)", "/keys?prefix=order:"),
        ("/keys?prefix=webhook: (10%, last)", "/keys?prefix=webhook:"),
        (f"/keys?prefix={narrow} ({few} keys)", f"/keys?prefix={quote(narrow, safe='')}"),
        ("/keys?stale=1", "/keys?stale=1"),
        ("/keys?released=1", "/keys?released=1"),
        ("/keys?status=in_progress", "/keys?status=in_progress"),
        ("/keys?status=completed", "/keys?status=completed"),
        ("/keys?status=failed (0.1%)", "/keys?status=failed"),
        ("/keys/<key>", f"/keys/{quote(key, safe='')}"),
        ("/api/keys", "/api/keys"),
        ("/api/keys/<key>", f"/api/keys/{quote(key, safe='')}"),
        ("/log", "/log"),
    ]
    entity = quote(f"account:{max(entities - 1, 0) // 2:08d}", safe="")
    left_out = []
    for name, path in [
        ("/api/stats", "/api/stats"),
        ("/api/ (overview)", "/api/"),
        ("/entities", "/entities"),
        ("/entities?prefix=account:0000", "/entities?prefix=account:0000"),
        ("/entities/<entity>", f"/entities/{entity}"),
        ("/api/entities", "/api/entities"),
        ("/api/entities/<entity>", f"/api/entities/{entity}"),
        ("/outbox", "/outbox"),
    ]:
        status = client.get(path)[0]
        if status == 200:
            listed.append((name, path))
        else:
            left_out.append(f"{path} ({status})")
    return [(name, path) for name, path in listed if path is not None], left_out


def time_pages(
    client: Client, listed: list[tuple[str, str]], requests: int
) -> list[dict[str, Any]]:
    rows = []
    for name, path in listed:
        times = []
        for _ in range(requests + 1):  # the first is the warm-up
            status, body, seconds = client.get(path)
            if status != 200:
                raise BenchError(f"{path} answered {status}: {body[:300]!r}")
            times.append(seconds * 1000)
        median = statistics.median(times[1:])
        rows.append({
            "page": name, "path": path, "bytes": len(body), "warmup_ms": times[0],
            "median_ms": median, "max_ms": max(times[1:]), "under_target": median < TARGET_MS,
        })  # fmt: skip
    return rows


def one_store(store: str, args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    def say(line: str) -> None:
        print(line, flush=True)

    with server_for(store, tmp) as base:
        url = store_url(store, base)
        # The fill is the library's, as consumers write; SQLite's fsync per transaction is
        # left to the OS meanwhile (synchronous=normal): the console opens it as given.
        fill_url = f"{url}?synchronous=normal" if store == "sqlite" else url
        say(f"{store}: filling {url} with {args.keys:,} keys")
        filled = fill(fill_url, args.keys, args.entities, say)
        say(f"{store}: filled in {filled['fill_s']:.1f} s: {filled['kinds']}, "
            f"{filled['entities']:,} entities")  # fmt: skip
        if store == "sqlite":
            db = Path(url.removeprefix("sqlite:///"))  # with its -wal and -shm
            filled["db_bytes"] = sum(p.stat().st_size for p in db.parent.glob(f"{db.name}*"))
        folder = Path(tempfile.mkdtemp(prefix="console-bench-", dir=tmp))
        _operator_log(folder / "operator.log")
        started = time.perf_counter()
        console = ConsoleServer(url, folder)
        try:
            up = time.perf_counter() - started
            say(f"{store}: console up on port {console.port} in {up:.1f} s; timing the pages")
            client = Client(console.port)
            try:
                listed, left_out = pages(client, args.keys, filled["entities"])
                rows = time_pages(client, listed, args.requests)
            except BenchError as exc:
                tail = console.stderr.read_text(errors="replace")[-3000:]
                raise BenchError(f"{store}: {exc}\nthe console said:\n{tail}") from None
            finally:
                client.close()
        finally:
            console.stop()
        return {
            "store": store,
            "keys": args.keys,
            "fill": filled,
            "console_start_s": up,
            "pages": rows,
            "left_out": left_out,
        }


def _operator_log(path: Path) -> None:
    """200 entries, as the console writes them, for /log to show."""
    from idemctl.console.oplog import OperatorLog

    log = OperatorLog(path)
    for i in range(200):
        log.write("ana", "unlock", key_of(i), "unlocked (1)")


def report(data: dict[str, Any]) -> None:
    from rich.table import Table

    console = stdout_console()
    for run in data["runs"]:
        fill_ = run["fill"]
        table = Table(
            title=f"console pages on {run['store']}, {run['keys']:,} keys, "
            f"{fill_['entities']:,} entities: ms a request, {data['requests']} requests a page"
        )
        for column, justify in (("page", "left"), ("median ms", "right"), ("max ms", "right"),
                                ("warm-up ms", "right"), ("bytes", "right"),
                                (f"median < {TARGET_MS:g} ms", "left")):  # fmt: skip
            table.add_column(column, justify=justify)  # type: ignore[arg-type]
        for row in run["pages"]:
            table.add_row(
                row["page"], f"{row['median_ms']:.1f}", f"{row['max_ms']:.1f}",
                f"{row['warmup_ms']:.1f}", f"{row['bytes']:,}",
                "[green]yes[/]" if row["under_target"] else "[bold red]NO[/]",
            )  # fmt: skip
        console.print(table)
        rate = run["keys"] / fill_["fill_s"]
        size = f", {fill_['db_bytes'] / 2**20:,.0f} MiB on disk" if "db_bytes" in fill_ else ""
        console.print(
            f"  fill: {fill_['fill_s']:.1f} s ({rate:,.0f} keys/s{size}); {fill_['kinds']}; "
            f"console started in {run['console_start_s']:.1f} s",
            highlight=False,
        )
        over = [r["page"] for r in run["pages"] if not r["under_target"]]
        verdict = "every page met" if not over else f"NOT met by {len(over)}: {', '.join(over)}"
        console.print(f"  target median < {TARGET_MS:g} ms: {verdict}", highlight=False)
        if run["left_out"]:
            console.print(
                f"  not timed (the console did not answer 200): {', '.join(run['left_out'])}",
                highlight=False,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default=",".join(STORES), help="a subset of sqlite,redis")
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument(
        "--entities",
        type=int,
        default=100_000,
        help="entities of the sequence guard, one completed order: key each",
    )
    parser.add_argument("--requests", type=int, default=10, help="timed requests a page")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores or set(stores) - set(STORES):
        parser.error(f"--stores takes names from {','.join(STORES)}")
    if args.keys < 100 or args.requests < 1 or args.entities < 0:
        parser.error("--keys at least 100, --requests at least 1, --entities not negative")
    stop_on_sigterm()

    def work() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="console-bench-") as tmp:
            runs = [one_store(store, args, tmp) for store in stores]
        return {"requests": args.requests, "target_ms": TARGET_MS, "runs": runs}

    return finish("console", work, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
