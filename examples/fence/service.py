"""A service that idemctl's handlers call over HTTP, fencing its own ledger: a bare ASGI
app (no framework) that charges ``POST /charges/<payment>`` into the SQLite ledger named by
``$LEDGER`` through ``fenced_insert``, with the fence its caller sent as headers
(``idemctl.fence.http.fence_headers``). It makes its table on first use.

    LEDGER=service.db uvicorn examples.fence.service:app

201: charged; 400: fence headers it cannot read; 428: no fence; 409: the stale-fence
problem (the ledger accepted a newer token of that key).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import threading
from contextlib import closing
from typing import Any

from idemctl.errors import StaleFence
from idemctl.fence.http import BadFenceHeaders, fence_from_headers, stale_fence_problem
from idemctl.fence.sql import add_fence_columns, fenced_insert


async def _send(send: Any, status: int, headers: dict[str, str], body: bytes) -> None:
    pairs = [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": pairs})
    await send({"type": "http.response.body", "body": body})


def _json(status: int, doc: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    return status, {"content-type": "application/json"}, json.dumps(doc).encode()


_made = threading.Lock()


def _table(db: sqlite3.Connection) -> None:
    """The ledger's table with the fence's two columns, unless they are there."""
    with _made:
        db.execute("CREATE TABLE IF NOT EXISTS charges (payment TEXT PRIMARY KEY, cents INTEGER)")
        add_fence_columns(db, "charges")  # idemctl_key, idemctl_token


def charge(payment: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict[str, str], bytes]:
    try:
        fence = fence_from_headers(headers)
    except BadFenceHeaders as exc:
        return _json(400, {"error": str(exc)})
    if fence is None:
        return _json(428, {"error": "this service takes fenced writes only"})
    with closing(sqlite3.connect(os.environ["LEDGER"], isolation_level=None, timeout=30)) as db:
        _table(db)
        try:
            fenced_insert(db, "charges", {"payment": payment, "cents": 100}, fence,
                          unique=("payment",))  # fmt: skip
        except StaleFence as stale:
            return stale_fence_problem(stale)
    return _json(201, {"charged": payment, "token": fence.token})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path: str = scope["path"]
    if scope["method"] == "POST" and path.startswith("/charges/"):
        answer = await asyncio.to_thread(charge, path.removeprefix("/charges/"), scope["headers"])
        await _send(send, *answer)
    else:
        await _send(send, *_json(404, {"error": "no such resource"}))
