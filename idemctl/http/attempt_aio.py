"""One guarded HTTP request against the store: the runner's engine (``idemctl.aio.attempt``:
its claim, lease extension, release, rollback and wait) with the HTTP policy: an app that raises
gives its key back (the client's retry runs it again), a cancelled one holds it until its
lease ends, and the response is stored, or the key released or forgotten when it is not to
be kept. The ASGI middleware drives this module; the WSGI one its sync copy,
``idemctl.http.attempt``. What to answer and what to store is ``idemctl.http.policy``'s.

Once the app has run, its response is stored or nobody runs the request again: a store
that stops answering is asked again, with back-off, for as long as the attempt's lease is
known to hold (the claim's or the last extension's answer, plus the lease); a retry that
arrives meanwhile finds the store down (503) or the key held (409), never a free key. Past
that, the answer is a 503 and the key's lease runs out: see docs/guides/http.md, "A store
outage".

This module is the original of ``idemctl.http.attempt`` (scripts/unasync.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, cast

from idemctl._unasync import is_async
from idemctl.aio.attempt import waited
from idemctl.aio.holding import DEFINITE, complete_while_held, forget, give_back, held
from idemctl.errors import ConfigError, LeaseLost, StaleFence, StoreError
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
from idemctl.model import Acquired, Busy, ClaimOutcome, Completed, Status
from idemctl.runner.outcome import Rollback, fence_refused
from idemctl.stores.base_async import AsyncStore, AsyncTransactionalStore

log = logging.getLogger("idemctl.http")

Produced: TypeAlias = Response | Streamed
App: TypeAlias = Callable[[Attempt], Awaitable[Produced]]
"""Runs the app for an attempt: its response when it was buffered whole (not yet sent), or
what was sent of it as it streamed (too big to store)."""
Answer: TypeAlias = Ran | Unavailable | ClaimOutcome
"""What an attempt comes to: the app ran, the store did not answer, or the claim found the
key held, done or reused."""


def body_limit(options: Options, store: AsyncStore) -> int:
    """The most response body kept on ``store`` (``max_body``, or less on DynamoDB)."""
    return options.body_limit(store.url.partition(":")[0])


async def attempt(store: AsyncStore, options: Options, guarded: Guarded, app: App) -> Answer:
    """Run ``app`` at most once to a stored response for ``guarded.stored_key``; what the
    claim found instead when another request holds, held or reused the key (after waiting
    up to ``options.wait`` for one in flight); Unavailable when the store did not answer."""
    once = functools.partial(_once, store, options, guarded, app)
    try:
        result = await once()
        if options.wait is None or not isinstance(result, Busy):
            return result
        return await waited(store, guarded.stored_key, options.wait, once, _busy)
    except StoreError as exc:
        if isinstance(exc, DEFINITE):
            raise
        log.warning("%s: the store did not answer; the app was not run: %s", guarded.key, exc)
        return Unavailable(str(exc))


def _busy(result: Answer) -> Busy | None:
    return result if isinstance(result, Busy) else None


async def _once(store: AsyncStore, options: Options, guarded: Guarded, app: App) -> Answer:
    if options.transactional:
        return await _transactional(store, options, guarded, app)
    lease = store.default_lease if options.lease is None else options.lease
    asked = time.monotonic()
    outcome = await store.claim(guarded.stored_key, guarded.fingerprint, options.lease)
    if not isinstance(outcome, Acquired):
        return outcome
    a = outcome
    try:
        # Cancelled, the app is not finished: work it began may still run (a thread it
        # started, a sync view), so the key stays held until its lease ends.
        ran = await held(
            store,
            a,
            functools.partial(app, _attempt(guarded, a)),
            lease=lease,
            hold_if_interrupted=True,
            logger=log,
        )
    except StaleFence as stale:  # the app's fenced write met a later attempt's token
        fence_refused(a, stale, log)
        return await _taken_over(store, guarded.stored_key)
    except Exception:
        if is_async():
            await asyncio.shield(give_back(store, a, None, log))
        else:
            give_back(store, a, None, log)
        raise
    produced = ran.value
    kept = stored_form(options, guarded.request, produced, body_limit(options, store))
    sent = None if isinstance(produced, Streamed) else produced
    if kept is None:
        if produced.status in options.unstored_statuses:
            await forget(store, a, log)  # the endpoint never ran (the framework answered)
        else:
            await give_back(store, a, None, log)
        return Ran(sent, stored=False)
    until = max(asked, ran.kept_since) + lease
    try:
        failed = await complete_while_held(store, a, kept, options.retention, until, log)
    except LeaseLost as lost:  # taken over meanwhile: the taker's response is the one kept
        log.warning("%s: response not stored: %s", guarded.stored_key, lost)
        return Ran(sent, stored=False)
    if failed is not None:
        return Unavailable(str(failed), ran=True)
    return Ran(sent, stored=True)


async def _taken_over(store: AsyncStore, stored_key: str) -> Answer:
    """The answer of an attempt whose key a later one took over: the taker's stored
    response once it completed, else busy (409: the client's retry gets the taker's)."""
    record = await store.get(stored_key)
    if record is not None and record.status is Status.COMPLETED:
        return Completed(record)
    return Busy(record)


def _attempt(guarded: Guarded, a: Acquired, connection: Any = None) -> Attempt:
    """What the app sees of the attempt ``a`` at ``guarded``."""
    return Attempt(
        guarded.key, guarded.stored_key, a.fencing_token, a.attempt, a.takeover, connection
    )


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
                return cast("Answer", outcome)  # a Stale outcome is answered as it is
            produced = await app(_attempt(guarded, outcome, unit.connection))
            sent = None if isinstance(produced, Streamed) else produced
            kept = stored_form(options, guarded.request, produced, body_limit(options, store))
            if kept is None:
                raise Rollback(sent)
            await unit.complete(kept, options.retention)
            return Ran(sent, stored=True)
    except Rollback as rollback:
        return Ran(rollback.value, stored=False)
