"""One guarded HTTP request against the store: claim its key, run the app, then store its
response or release the key. The ASGI middleware drives this module; the WSGI one its sync
copy, ``idemctl.http.attempt``. What to answer and what to store is ``idemctl.http.policy``'s.

This module is the original of ``idemctl.http.attempt`` (scripts/unasync.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from idemctl.aio.attempt import waited
from idemctl.aio.heartbeat import Heartbeat
from idemctl.aio.store import AsyncStore, AsyncTransactionalStore
from idemctl.errors import ConfigError, LeaseLost, StoreError
from idemctl.http.policy import Attempt, Guarded, Options, Ran, Response, stored_form
from idemctl.model import Acquired, Busy, ClaimOutcome

if TYPE_CHECKING:
    from idemctl.model import JSON

log = logging.getLogger("idemctl.http")

Produced: TypeAlias = Response | None
App: TypeAlias = Callable[[Attempt], Awaitable[Produced]]
"""Runs the app for an attempt: its response when it was buffered whole (not yet sent),
None when it was sent as it streamed (too big to store)."""
Answer: TypeAlias = Ran | ClaimOutcome
"""What an attempt comes to: the app ran, or the claim found the key held, done or reused."""


async def attempt(store: AsyncStore, options: Options, guarded: Guarded, app: App) -> Answer:
    """Run ``app`` at most once to a stored response for ``guarded.stored_key``; what the
    claim found instead when another request holds, held or reused the key (after waiting
    up to ``options.wait`` for one in flight)."""
    once = functools.partial(_once, store, options, guarded, app)
    result = await once()
    if options.wait is None or not isinstance(result, Busy):
        return result
    return await waited(store, guarded.stored_key, options.wait, once, _busy)


def _busy(result: Answer) -> Busy | None:
    return result if isinstance(result, Busy) else None


async def _once(store: AsyncStore, options: Options, guarded: Guarded, app: App) -> Answer:
    if options.transactional:
        return await _transactional(store, options, guarded, app)
    outcome = await store.claim(guarded.stored_key, guarded.fingerprint, options.lease)
    if not isinstance(outcome, Acquired):
        return outcome
    a = outcome
    lease = store.default_lease if options.lease is None else options.lease
    heartbeat = Heartbeat(store, lease, [a], name="idemctl-http")
    try:
        response = await app(_attempt(guarded, a))
    except BaseException:
        await heartbeat.stop()
        await asyncio.shield(_release(store, a))
        raise
    await heartbeat.stop()
    kept = None if response is None else stored_form(options, guarded.request, response)
    if kept is None:
        if response is None:
            log.warning(
                "%s: the response is over max_body (%d bytes): sent as it streamed, not "
                "stored; the key is released",
                guarded.stored_key,
                options.max_body,
            )
        await _release(store, a)
        return Ran(response, stored=False)
    try:
        await store.complete(a.key, a.owner, a.fencing_token, kept, options.retention)
    except LeaseLost as lost:  # taken over meanwhile: the taker's response is the one kept
        log.warning("%s: response not stored: %s", guarded.stored_key, lost)
        return Ran(response, stored=False)
    return Ran(response, stored=True)


def _attempt(guarded: Guarded, a: Acquired, connection: Any = None) -> Attempt:
    """What the app sees of the attempt ``a`` at ``guarded``."""
    return Attempt(
        guarded.key, guarded.stored_key, a.fencing_token, a.attempt, a.takeover, connection
    )


async def _release(store: AsyncStore, a: Acquired) -> None:
    """Give the key back, so the client's retry runs the request again."""
    try:
        await store.release(a.key, a.owner, a.fencing_token)
    except LeaseLost:
        pass  # taken over already: nothing of ours to give back
    except StoreError as exc:  # its lease ends by itself; a retry takes it over then
        log.warning("%s: could not release the key (its lease will end): %s", a.key, exc)


class _Rollback(Exception):
    """Raised in the transaction to roll back the claim when the response is not stored."""

    def __init__(self, response: Response | None) -> None:
        super().__init__()
        self.response = response


async def _transactional(store: AsyncStore, options: Options, guarded: Guarded, app: App) -> Answer:
    """The claim, the app's SQL on the attempt's connection and the stored response in one
    transaction: a response not stored rolls the claim back with the app's writes."""
    if not isinstance(store, AsyncTransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    try:
        async with store.transaction(
            guarded.stored_key, guarded.fingerprint, options.lease
        ) as unit:
            outcome = unit.outcome
            if not isinstance(outcome, Acquired):
                return outcome  # type: ignore[return-value]
            response = await app(_attempt(guarded, outcome, unit.connection))
            kept: JSON | None = (
                None if response is None else stored_form(options, guarded.request, response)
            )
            if kept is None:
                raise _Rollback(response)
            await unit.complete(kept, options.retention)
            return Ran(response, stored=True)
    except _Rollback as rollback:
        return Ran(rollback.response, stored=False)
