"""The handler `idemctl demo` runs: charge a payment, once per idempotency key.

The charge, the side effect, is a line appended to the ledger file named by
IDEMCTL_DEMO_LEDGER (one write per line, so lines of concurrent workers never mix).

    idemctl consume --topic payments --group billing --handler payments:charge
"""

from __future__ import annotations

import os
from typing import Any

from idemctl.consume import Event
from idemctl.runner import Context


def charge(event: Event, ctx: Context) -> dict[str, Any]:
    payment = event.json()
    line = f"{ctx.key} {payment['cents']} token={ctx.fencing_token}\n".encode()
    fd = os.open(os.environ["IDEMCTL_DEMO_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return {"charged": payment["cents"]}
