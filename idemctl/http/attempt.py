# Written by scripts/unasync.py from idemctl/http/attempt_aio.py: change that file and run the
# script (scripts/test checks the two agree). Do not edit this one.
"""One guarded HTTP request against the store: claim its key, run the app, then store its
response or release the key. The ASGI middleware drives this module; the WSGI one its sync
copy, ``idemctl.http.attempt``. What to answer and what to store is ``idemctl.http.policy``'s.

Written by scripts/unasync.py from ``idemctl.http.attempt_aio``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from idemctl.errors import ConfigError, LeaseLost, StoreError
from idemctl.http.policy import Attempt, Guarded, Options, Ran, Response, stored_form
from idemctl.model import Acquired, Busy, ClaimOutcome
from idemctl.runner.attempt import waited
from idemctl.runner.heartbeat import Heartbeat
from idemctl.stores.base import Store, TransactionalStore

if TYPE_CHECKING:
    from idemctl.model import JSON

log = logging.getLogger("idemctl.http")

Produced: TypeAlias = Response | None
App: TypeAlias = Callable[[Attempt], Produced]
"""Runs the app for an attempt: its response when it was buffered whole (not yet sent),
None when it was sent as it streamed (too big to store)."""
Answer: TypeAlias = Ran | ClaimOutcome
"""What an attempt comes to: the app ran, or the claim found the key held, done or reused."""


def attempt(store: Store, options: Options, guarded: Guarded, app: App) -> Answer:
    """Run ``app`` at most once to a stored response for ``guarded.stored_key``; what the
    claim found instead when another request holds, held or reused the key (after waiting
    up to ``options.wait`` for one in flight)."""
    once = functools.partial(_once, store, options, guarded, app)
    result = once()
    if options.wait is None or not isinstance(result, Busy):
        return result
    return waited(store, guarded.stored_key, options.wait, once, _busy)


def _busy(result: Answer) -> Busy | None:
    return result if isinstance(result, Busy) else None


def _once(store: Store, options: Options, guarded: Guarded, app: App) -> Answer:
    if options.transactional:
        return _transactional(store, options, guarded, app)
    outcome = store.claim(guarded.stored_key, guarded.fingerprint, options.lease)
    if not isinstance(outcome, Acquired):
        return outcome
    a = outcome
    lease = store.default_lease if options.lease is None else options.lease
    heartbeat = Heartbeat(store, lease, [a], name="idemctl-http")
    try:
        response = app(_attempt(guarded, a))
    except BaseException:
        heartbeat.stop()
        _release(store, a)
        raise
    heartbeat.stop()
    kept = None if response is None else stored_form(options, guarded.request, response)
    if kept is None:
        if response is None:
            log.warning(
                "%s: the response is over max_body (%d bytes): sent as it streamed, not "
                "stored; the key is released",
                guarded.stored_key,
                options.max_body,
            )
        _release(store, a)
        return Ran(response, stored=False)
    try:
        store.complete(a.key, a.owner, a.fencing_token, kept, options.retention)
    except LeaseLost as lost:  # taken over meanwhile: the taker's response is the one kept
        log.warning("%s: response not stored: %s", guarded.stored_key, lost)
        return Ran(response, stored=False)
    return Ran(response, stored=True)


def _attempt(guarded: Guarded, a: Acquired, connection: Any = None) -> Attempt:
    """What the app sees of the attempt ``a`` at ``guarded``."""
    return Attempt(
        guarded.key, guarded.stored_key, a.fencing_token, a.attempt, a.takeover, connection
    )


def _release(store: Store, a: Acquired) -> None:
    """Give the key back, so the client's retry runs the request again."""
    try:
        store.release(a.key, a.owner, a.fencing_token)
    except LeaseLost:
        pass  # taken over already: nothing of ours to give back
    except StoreError as exc:  # its lease ends by itself; a retry takes it over then
        log.warning("%s: could not release the key (its lease will end): %s", a.key, exc)


class _Rollback(Exception):
    """Raised in the transaction to roll back the claim when the response is not stored."""

    def __init__(self, response: Response | None) -> None:
        super().__init__()
        self.response = response


def _transactional(store: Store, options: Options, guarded: Guarded, app: App) -> Answer:
    """The claim, the app's SQL on the attempt's connection and the stored response in one
    transaction: a response not stored rolls the claim back with the app's writes."""
    if not isinstance(store, TransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    try:
        with store.transaction(guarded.stored_key, guarded.fingerprint, options.lease) as unit:
            outcome = unit.outcome
            if not isinstance(outcome, Acquired):
                return outcome  # type: ignore[return-value]
            response = app(_attempt(guarded, outcome, unit.connection))
            kept: JSON | None = (
                None if response is None else stored_form(options, guarded.request, response)
            )
            if kept is None:
                raise _Rollback(response)
            unit.complete(kept, options.retention)
            return Ran(response, stored=True)
    except _Rollback as rollback:
        return Ran(rollback.response, stored=False)
