# Written by scripts/unasync.py from idemctl/http/attempt_aio.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""One guarded HTTP request against the store: claim its key, run the app, then store its
response or release the key. The ASGI middleware drives this module; the WSGI one its sync
copy, ``idemctl.http.attempt``. What to answer and what to store is ``idemctl.http.policy``'s.

Once the app has run, its response is stored or nobody runs the request again: a store
that stops answering is asked again, with back-off, for as long as the attempt's lease is
known to hold (the claim's or the last heartbeat's answer, plus the lease); a retry that
arrives meanwhile finds the store down (503) or the key held (409), never a free key. Past
that, the answer is a 503 and the key's lease runs out: see docs/guides/http.md, "A store
outage".

Written by scripts/unasync.py from ``idemctl.http.attempt_aio``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from idemctl.errors import ConfigError, KeyNotFound, LeaseLost, NotProvisioned, Refused, StoreError
from idemctl.http.policy import (
    Attempt,
    Guarded,
    Options,
    Ran,
    Response,
    Streamed,
    Unavailable,
    stored_form,
)
from idemctl.model import Acquired, Busy, ClaimOutcome, Status
from idemctl.runner.attempt import waited
from idemctl.runner.heartbeat import Heartbeat
from idemctl.runner.outcome import Rollback
from idemctl.stores.base import Store, TransactionalStore

if TYPE_CHECKING:
    from idemctl.model import JSON
log = logging.getLogger("idemctl.http")
Produced: TypeAlias = Response | Streamed
App: TypeAlias = Callable[[Attempt], Produced]
"""Runs the app for an attempt: its response when it was buffered whole (not yet sent), or
what was sent of it as it streamed (too big to store)."""
Answer: TypeAlias = Ran | Unavailable | ClaimOutcome
"""What an attempt comes to: the app ran, the store did not answer, or the claim found the
key held, done or reused."""
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0
"""Seconds between two tries at storing a response while the store does not answer."""
DEFINITE = (LeaseLost, Refused, NotProvisioned, KeyNotFound)
"""Store errors that are answers, not silence: asking again would get the same."""


def body_limit(options: Options, store: Store) -> int:
    """The most response body kept on ``store`` (``max_body``, or less on DynamoDB)."""
    return options.body_limit(store.url.partition(":")[0])


def attempt(store: Store, options: Options, guarded: Guarded, app: App) -> Answer:
    """Run ``app`` at most once to a stored response for ``guarded.stored_key``; what the
    claim found instead when another request holds, held or reused the key (after waiting
    up to ``options.wait`` for one in flight); Unavailable when the store did not answer."""
    once = functools.partial(_once, store, options, guarded, app)
    try:
        result = once()
        if options.wait is None or not isinstance(result, Busy):
            return result
        return waited(store, guarded.stored_key, options.wait, once, _busy)
    except StoreError as exc:
        if isinstance(exc, DEFINITE):
            raise
        log.warning("%s: the store did not answer; the app was not run: %s", guarded.key, exc)
        return Unavailable(str(exc))


def _busy(result: Answer) -> Busy | None:
    return result if isinstance(result, Busy) else None


def _once(store: Store, options: Options, guarded: Guarded, app: App) -> Answer:
    if options.transactional:
        return _transactional(store, options, guarded, app)
    lease = store.default_lease if options.lease is None else options.lease
    asked = time.monotonic()
    outcome = store.claim(guarded.stored_key, guarded.fingerprint, options.lease)
    if not isinstance(outcome, Acquired):
        return outcome
    a = outcome
    heartbeat = Heartbeat(store, lease, [a], name="idemctl-http")
    try:
        produced = app(_attempt(guarded, a))
    except asyncio.CancelledError:
        heartbeat.stop()
        log.warning("%s: the app was cancelled; its key is held until its lease ends", a.key)
        raise
    except Exception:
        heartbeat.stop()
        _release(store, a)
        raise
    heartbeat.stop()
    kept = stored_form(options, guarded.request, produced, body_limit(options, store))
    sent = None if isinstance(produced, Streamed) else produced
    if kept is None:
        if produced.status in options.unstored_statuses:
            _forget(store, a)
        else:
            _release(store, a)
        return Ran(sent, stored=False)
    until = max(asked, heartbeat.kept_since) + lease
    try:
        stored = _complete(store, a, kept, options.retention, until)
    except LeaseLost as lost:
        log.warning("%s: response not stored: %s", guarded.stored_key, lost)
        return Ran(sent, stored=False)
    if isinstance(stored, Unavailable):
        return stored
    return Ran(sent, stored=True)


def _complete(
    store: Store, a: Acquired, kept: JSON, retention: float, until: float
) -> Unavailable | None:
    """Store ``kept`` as ``a``'s result, asking again while the store does not answer and
    ``a``'s lease holds (``until``, on the monotonic clock, less a margin for the store's
    clock); Unavailable once it no longer may."""
    margin = min(1.0, (until - time.monotonic()) / 10)
    backoff = FIRST_BACKOFF
    while True:
        try:
            store.complete(a.key, a.owner, a.fencing_token, kept, retention)
            return None
        except LeaseLost as lost:
            if _completed_by(lost.record, a):
                return None
            raise
        except DEFINITE:
            raise
        except StoreError as exc:
            left = until - margin - time.monotonic()
            if left <= 0:
                log.error(
                    (
                        "%s: the response could not be stored before the key's lease ends; a "
                        "retry after that runs the request again: %s"
                    ),
                    a.key,
                    exc,
                )
                return Unavailable(str(exc), ran=True)
            log.warning("%s: storing the response, asked again: %s", a.key, exc)
            time.sleep(min(backoff, left))
            backoff = min(backoff * 2, MAX_BACKOFF)


def _completed_by(record: Any, a: Acquired) -> bool:
    """Whether ``record`` was completed by the attempt ``a`` (the token is ``a``'s alone: a
    takeover would have raised it)."""
    return (
        record is not None
        and record.status is Status.COMPLETED
        and (record.fencing_token == a.fencing_token)
    )


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
        pass
    except StoreError as exc:
        log.warning("%s: could not release the key (its lease will end): %s", a.key, exc)


def _forget(store: Store, a: Acquired) -> None:
    """The endpoint never ran (a framework's own validation answered): the key is given
    back and forgotten with the request's fingerprint, so the corrected request runs under
    the same key (a release keeps the fingerprint: the corrected one would be a mismatch)."""
    try:
        store.extend(a.key, a.owner, a.fencing_token, 5.0)
        store.forget(a.key, force=True)
    except (LeaseLost, Refused, KeyNotFound):
        pass
    except StoreError as exc:
        log.warning("%s: could not give the key back (its lease will end): %s", a.key, exc)


def _transactional(store: Store, options: Options, guarded: Guarded, app: App) -> Answer:
    """The claim, the app's SQL on the attempt's connection and the stored response in one
    transaction: a response not stored rolls the claim back with the app's writes."""
    if not isinstance(store, TransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    try:
        with store.transaction(guarded.stored_key, guarded.fingerprint, options.lease) as unit:
            outcome = unit.outcome
            if not isinstance(outcome, Acquired):
                return cast("Answer", outcome)
            produced = app(_attempt(guarded, outcome, unit.connection))
            sent = None if isinstance(produced, Streamed) else produced
            kept = stored_form(options, guarded.request, produced, body_limit(options, store))
            if kept is None:
                raise Rollback(sent)
            unit.complete(kept, options.retention)
            return Ran(sent, stored=True)
    except Rollback as rollback:
        return Ran(rollback.value, stored=False)
