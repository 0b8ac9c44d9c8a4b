"""The stores the manual's transcripts start from: a ```console block with output carries
``<!-- test: scenario=NAME -->`` and runs in a directory that ``SCENARIOS[NAME]`` seeded.

Each scenario seeds the default SQLite store, ``PATH/idemctl.db`` (what ``idemctl`` opens
when run in PATH), through the library, as workers would have left it. A stale lease is a
claim with a lease of a millisecond, its record then moved PAST seconds back; a record
past retention, a completion kept for a millisecond whose retention is then set to have
ended PAST seconds back (tests/backends.py: the store's clock, not a sleep). Everything
else is live for far longer than a transcript runs. Each scenario takes well under a
second.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from idemctl import Acquired, Context, Order, Outcome, Permanent, Store, open_store, run
from idemctl.model import Guard, Verdict
from tests.backends import backdate, expire_retention

TINY = 0.001
"""A lease or a retention, in seconds, that is over by the time the scenario returns."""

PAST = 0.05
"""Seconds by which a TINY lease or retention is over: the store's times moved back so."""

LONG = 3600.0
"""A lease, in seconds, that is still live while a transcript runs."""


def url_of(path: Path) -> str:
    """The default store of a transcript run in ``path``."""
    return f"sqlite:///{path}/idemctl.db"


def claimed(store: Store, key: str, lease: float | None = None) -> Acquired:
    got = store.claim(key, lease=lease)
    assert isinstance(got, Acquired), got
    return got


def charge(ctx: Context) -> dict[str, str]:
    """A payment handler that succeeds."""
    return {"charge_id": "ch_" + ctx.key.split(":")[1], "status": "succeeded"}


def declined(ctx: Context) -> None:
    """A payment handler that fails for good."""
    raise Permanent("card declined")


def applied(ctx: Context) -> None:
    """A handler that applies an event to its entity and returns nothing."""


def completed(store: Store, *keys: str) -> None:
    for key in keys:
        result = run(store, key, charge, heartbeat=False)
        assert result.outcome is Outcome.EXECUTED, result


def stale(store: Store, key: str, attempts: int) -> None:
    """``key`` in progress, its owner's lease over: each of its ``attempts`` was SIGKILLed."""
    for _ in range(attempts):
        claimed(store, key, lease=TINY)
        backdate(store, key, PAST)


def empty(path: Path) -> None:
    """Nothing: not even the store's file."""


def fresh(path: Path) -> None:
    """A provisioned store without a record: ``idemctl init`` ran, nothing was consumed."""
    with open_store(url_of(path)) as store:
        store.provision()


def incident(path: Path) -> None:
    """A worker was SIGKILLed while it held charge:1234 (its second attempt): charge:1001,
    1002 and 1003 completed, charge:1100 failed for good (card declined), charge:1234 in
    progress with its lease expired (stale), charge:1235 in progress with a live lease of an
    hour."""
    with open_store(url_of(path)) as store:
        completed(store, "charge:1001", "charge:1002", "charge:1003")
        result = run(store, "charge:1100", declined, heartbeat=False)
        assert result.outcome is Outcome.ERROR and not result.retriable, result
        claimed(store, "charge:1235", lease=LONG)
        stale(store, "charge:1234", attempts=2)


def expired(path: Path) -> None:
    """Records past retention waiting for ``purge``: charge:0901 and charge:0902, kept for a
    millisecond, beside charge:1001 and charge:1002, kept for the default 7 days."""
    with open_store(url_of(path)) as store:
        completed(store, "charge:1001", "charge:1002")
        for key in ("charge:0901", "charge:0902"):
            got = claimed(store, key)
            store.complete(key, got.owner, got.fencing_token, None, retention=TINY)
            expire_retention(store, key, PAST)


def entities(path: Path) -> None:
    """The sequence guard: account:42 applied sequence 18 (event evt-a7d3) and evt-b410's
    attempt holds it now, for sequence 19, with the default hold of 30 s; account:7 applied
    sequence 3 (evt-0a2e) and nobody holds it."""
    with open_store(url_of(path)) as store:
        for key, order in (
            ("evt-a7d3", Order("account:42", 18)),
            ("evt-0a2e", Order("account:7", 3)),
        ):
            result = run(store, key, applied, heartbeat=False, order=order)
            assert result.outcome is Outcome.EXECUTED, result
        got = claimed(store, "evt-b410")
        (reply,) = store.guard_many([Guard("account:42", 19, "evt-b410", got.fencing_token)])
        assert reply.verdict is Verdict.GO, reply


def powertools_event(path: Path) -> None:
    """No store: the event a Lambda function got stuck on, in ``event.json``."""
    (path / "event.json").write_text(
        '{"body": "{\\"order_id\\": \\"o-1001\\", \\"cents\\": 2500}"}\n'
    )


SCENARIOS: dict[str, Callable[[Path], None]] = {
    "empty": empty,
    "fresh": fresh,
    "incident": incident,
    "expired": expired,
    "entities": entities,
    "powertools-event": powertools_event,
}
"""Each scenario by the name a transcript gives in ``<!-- test: scenario=NAME -->``."""
