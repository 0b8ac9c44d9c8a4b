"""The handler `idemctl demo` runs: charge a payment, once per idempotency key.

The charge, the side effect, is a row of the ledger, a SQLite database named by
IDEMCTL_DEMO_LEDGER_DB, written through the fence (`idemctl.fence.sql.fenced_insert`): a
consumer killed between its charge and its completion leaves a row that the takeover's
charge replaces (one row a payment), and a zombie's late charge, under an older token, is
refused with StaleFence. Each try is also a line of the log named by IDEMCTL_DEMO_LEDGER
(one write per line, so lines of concurrent workers never mix). With IDEMCTL_DEMO_UNFENCED
set, the log's lines are the charges: what an unfenced effect does.

IDEMCTL_DEMO_STALL_KEY and IDEMCTL_DEMO_STALL_DIR make the demo's zombie: the first attempt
of that payment writes "<pid> <token>" to the folder's ``inside`` and waits for its ``go``
before it charges (the demo SIGSTOPs it meanwhile, past its lease, and a takeover charges
the payment), so its charge comes late, under an older token.

    idemctl consume --topic payments --group billing --handler payments:charge
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from idemctl.consume import Event
from idemctl.errors import StaleFence
from idemctl.fence.sql import fenced_insert
from idemctl.runner import Context

_local = threading.local()


def _log(line: str) -> None:
    fd = os.open(os.environ["IDEMCTL_DEMO_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _ledger() -> sqlite3.Connection:
    """This thread's connection to the ledger (autocommit: each charge commits alone)."""
    db = getattr(_local, "db", None)
    if db is None:
        path = os.environ.get("IDEMCTL_DEMO_LEDGER_DB")
        if not path:
            raise RuntimeError(
                "set IDEMCTL_DEMO_LEDGER_DB to the ledger database (idemctl demo makes one), "
                "or IDEMCTL_DEMO_UNFENCED=1 to charge lines of IDEMCTL_DEMO_LEDGER"
            )
        db = _local.db = sqlite3.connect(path, timeout=30, isolation_level=None)
    return db


def _stall(ctx: Context) -> None:
    """The demo's zombie: the first attempt of IDEMCTL_DEMO_STALL_KEY says it is in, then
    waits to be let go (a takeover is never held up)."""
    if ctx.takeover or ctx.key != os.environ.get("IDEMCTL_DEMO_STALL_KEY"):
        return
    folder = Path(os.environ["IDEMCTL_DEMO_STALL_DIR"])
    (folder / "inside.tmp").write_text(f"{os.getpid()} {ctx.fencing_token}")
    (folder / "inside.tmp").replace(folder / "inside")  # whole, or not there
    while not (folder / "go").exists():
        time.sleep(0.01)


def charge(event: Event, ctx: Context) -> dict[str, Any]:
    payment = event.json()
    _stall(ctx)
    _log(f"{ctx.key} {payment['cents']} token={ctx.fencing_token}\n")
    if os.environ.get("IDEMCTL_DEMO_UNFENCED"):
        return {"charged": payment["cents"]}
    row = {"payment": ctx.key, "cents": payment["cents"]}
    try:
        fenced_insert(_ledger(), "charges", row, ctx.fence, unique=("payment",))
    except StaleFence:
        _log(f"{ctx.key} refused token={ctx.fencing_token}\n")
        raise  # this attempt lost its key: the runner logs it and lets it go
    return {"charged": payment["cents"]}
