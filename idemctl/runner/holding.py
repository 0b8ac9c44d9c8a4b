# Written by scripts/unasync.py from idemctl/aio/holding.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""Work run for a key already held: its heartbeat meanwhile, and what follows it. The key
given back (freed, or forgotten with its fingerprint), the result stored while the lease
holds, the entity let go. The runner's attempt and the HTTP middleware's both build on it.

Written by scripts/unasync.py from ``idemctl.aio.holding``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from idemctl.errors import IdemctlError, KeyNotFound, LeaseLost, NotProvisioned, Refused, StoreError
from idemctl.frozen import frozen
from idemctl.model import Acquired, Order, Record, Status
from idemctl.runner.heartbeat import Heartbeat
from idemctl.runner.limits import Abandoned
from idemctl.runner.ordering import guard_of, settle_of

if TYPE_CHECKING:
    from idemctl.model import JSON
    from idemctl.stores.base import Store
log = logging.getLogger("idemctl.runner")
T = TypeVar("T")
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0
"""Seconds between two tries at storing a result while the store does not answer."""
DEFINITE = (LeaseLost, Refused, NotProvisioned, KeyNotFound)
"""Store errors that are answers, not silence: asking again would get the same."""


@frozen
class Held(Generic[T]):
    """What work run for a held key returned, and since when its lease is known to hold."""

    value: T
    kept_since: float
    """``time.monotonic()`` when the last heartbeat the store answered in full began (0.0
    when none did): the lease holds at least ``lease`` seconds from then."""


def held(
    store: Store,
    a: Acquired,
    work: Callable[[], T],
    *,
    lease: float,
    heartbeat: bool = True,
    order: Order | None = None,
    hold_if_interrupted: bool = False,
    logger: logging.Logger = log,
) -> Held[T]:
    """Run ``work`` for the key ``a`` holds, a heartbeat extending its lease every
    ``lease/3`` seconds meanwhile (and, with ``order``, its entity's hold). An exception
    propagates, the heartbeat stopped: what it means is the caller's policy (the runner
    records a failure, the HTTP middleware gives the key back). An interrupt (Ctrl-C,
    SystemExit, a cancelled task) frees the key for the next delivery at once, even if the
    task is cancelled again meanwhile; ``hold_if_interrupted`` holds it until its lease ends
    instead, for work that may still run when its caller is gone (a thread a cancelled
    request started). A thread abandoned past its hard time limit touches nothing: its key
    was settled for it."""
    beat = (
        Heartbeat(
            store,
            lease,
            [a],
            [] if order is None else [guard_of(a, order)],
            name=f"idemctl-heartbeat-{a.key}",
        )
        if heartbeat
        else None
    )
    try:
        try:
            value = work()
        finally:
            if beat is not None:
                beat.stop()
    except Exception:
        raise
    except BaseException as exc:
        if isinstance(exc, Abandoned):
            raise
        if hold_if_interrupted:
            logger.warning("%s: interrupted; its key is held until its lease ends", a.key)
        else:
            give_back(store, a, order, logger)
        raise
    return Held(value, 0.0 if beat is None else beat.kept_since)


def give_back(store: Store, a: Acquired, order: Order | None, logger: logging.Logger) -> None:
    """The key ``a`` holds (and its entity) freed for the next delivery at once. Taken over
    already: nothing of ours to give back; a store that does not answer: the lease ends by
    itself, and a retry takes the key over then."""
    if order is not None:
        let_go(store, a, order, logger)
    try:
        store.release(a.key, a.owner, a.fencing_token)
    except LeaseLost:
        pass
    except StoreError as exc:
        logger.warning(
            "could not release %r (its lease will end): %s",
            a.key,
            exc,
            extra={"idemctl": {"key": a.key}},
        )


def forget(store: Store, a: Acquired, logger: logging.Logger = log) -> None:
    """The key ``a`` holds given back and forgotten with its fingerprint, so different
    work runs under the same key (a release keeps the fingerprint: it would mismatch).
    Extended first, a fenced write: still ours, so nobody else's claim is forgotten, and
    held, so nobody claims it between the two."""
    try:
        store.extend(a.key, a.owner, a.fencing_token, 5.0)
        store.forget(a.key, force=True)
    except (LeaseLost, Refused, KeyNotFound):
        pass
    except StoreError as exc:
        logger.warning("%s: could not give the key back (its lease will end): %s", a.key, exc)


def complete_while_held(
    store: Store,
    a: Acquired,
    value: JSON,
    retention: float | None,
    until: float,
    logger: logging.Logger = log,
) -> StoreError | None:
    """Store ``value`` as ``a``'s result, asking again with back-off while the store does
    not answer and ``a``'s lease holds (``until``, on the monotonic clock, less a margin
    for the store's clock): None once stored, the store's last error once it may no longer
    ask. LeaseLost when taken over (an earlier try that landed, whose answer was what got
    lost, counts as stored)."""
    margin = min(1.0, (until - time.monotonic()) / 10)
    backoff = FIRST_BACKOFF
    while True:
        try:
            store.complete(a.key, a.owner, a.fencing_token, value, retention)
            return None
        except LeaseLost as lost:
            if completed_by(lost.record, a):
                return None
            raise
        except DEFINITE:
            raise
        except StoreError as exc:
            left = until - margin - time.monotonic()
            if left <= 0:
                logger.error(
                    (
                        "%s: the result could not be stored before the key's lease ends; a "
                        "retry after that runs it again: %s"
                    ),
                    a.key,
                    exc,
                )
                return exc
            logger.warning("%s: storing the result, asked again: %s", a.key, exc)
            time.sleep(min(backoff, left))
            backoff = min(backoff * 2, MAX_BACKOFF)


def completed_by(record: Record | None, a: Acquired) -> bool:
    """Whether ``record`` was completed by the attempt ``a`` (the token is ``a``'s alone: a
    takeover would have raised it)."""
    return (
        record is not None
        and record.status is Status.COMPLETED
        and (record.fencing_token == a.fencing_token)
    )


def let_go(store: Store, a: Acquired, order: Order, logger: logging.Logger) -> None:
    """The handler will not finish: free the entity for its next event at once."""
    try:
        store.settle_many([settle_of(a, order, applied=False)])
    except IdemctlError as exc:
        logger.debug("let go of entity %s: %s", order.entity, exc)
