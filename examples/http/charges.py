"""What both example apps do for ``POST /charges``, framework-free: the charge itself.

Each charge appends one line, the order id, to the file ``$LEDGER`` (so a test counts
charges by counting lines); an order whose id starts with ``flaky`` fails the first time
any process of the app sees it; ``delay`` seconds are slept before charging.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import time
from pathlib import Path
from typing import Any

from idemctl.http import Attempt, Options


class Flaky(Exception):
    """The first attempt at a ``flaky...`` order: the app answers 500."""


class BadCharge(ValueError):
    """A body that is no charge: the app answers 400."""


def ledger() -> Path:
    return Path(os.environ.get("LEDGER", "charges.ledger"))


def parsed(body: Any) -> tuple[str, int]:
    """The order id and amount of a charge request's JSON body."""
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("order"), str)
        or not body["order"]
        or type(body.get("amount")) is not int
    ):
        raise BadCharge('expected {"order": "<id>", "amount": <integer>}')
    return body["order"], body["amount"]


def charge(order: str, amount: int, delay: float, attempt: Attempt | None) -> dict[str, Any]:
    """Charge ``order`` once more (the middleware makes it once): the charge's JSON."""
    if delay > 0:
        time.sleep(delay)
    path = ledger()
    with path.open("a") as lines:
        fcntl.flock(lines, fcntl.LOCK_EX)  # processes and threads append whole lines
        if order.startswith("flaky") and _first_sight(path, order):
            raise Flaky(f"order {order}: the payment provider timed out")
        lines.write(order + "\n")
    return {
        "id": "ch_" + secrets.token_hex(8),
        "order": order,
        "amount": amount,
        "fencing_token": attempt.fencing_token if attempt else None,
    }


def _first_sight(path: Path, order: str) -> bool:
    """Whether the app sees ``order`` for the first time (the caller holds the lock)."""
    seen = path.with_name(path.name + ".seen")
    known = seen.read_text().split("\n") if seen.exists() else []
    if order in known:
        return False
    with seen.open("a") as out:
        out.write(order + "\n")
    return True


def settings() -> tuple[str | None, Options]:
    """The store's URL (``$IDEMCTL_STORE``; None: the embedded default) and the middleware's
    options: the defaults, and for tests ``IDEMCTL_LEASE`` and ``IDEMCTL_WAIT`` (seconds)."""
    lease, wait = os.environ.get("IDEMCTL_LEASE"), os.environ.get("IDEMCTL_WAIT")
    options = Options(lease=float(lease) if lease else None, wait=float(wait) if wait else None)
    return os.environ.get("IDEMCTL_STORE"), options
