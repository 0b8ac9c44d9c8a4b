"""A process of the cross-process wait tests: THREADS threads call ``idemctl.run`` on one key
with ``wait=``; each run of the handler is a line in the ledger file. Prints one JSON line:
the outcomes and results. ``--hold``: one call whose handler writes its line, then blocks
(the test SIGKILLs the process)."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from idemctl import open_store
from idemctl.runner import Context, run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("key")
    parser.add_argument("ledger")
    parser.add_argument("--threads", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0, help="the handler's own time")
    parser.add_argument("--wait", type=float, default=10.0)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()

    def handler(ctx: Context) -> dict[str, Any]:
        with open(args.ledger, "a") as f:
            f.write(f"{os.getpid()} {ctx.attempt}\n")
        if args.hold:
            time.sleep(3600)
        time.sleep(args.seconds)
        return {"pid": os.getpid(), "attempt": ctx.attempt}

    store = open_store(args.url)
    if args.hold:
        run(store, args.key, handler, lease=600)
        return
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def call() -> None:
        r = run(store, args.key, handler, wait=args.wait, lease=30)
        with lock:
            results.append({"outcome": r.outcome.value, "result": r.result})

    threads = [threading.Thread(target=call) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(results))
    store.close()


if __name__ == "__main__":
    main()
