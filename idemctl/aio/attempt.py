"""One attempt at a key: claim it, run the handler, complete or fail it.

``run()`` is what ``@idempotent`` builds on; ``invoke()`` runs a handler for a key already
held (``Batch`` builds on it). While a handler runs, a heartbeat extends its lease; a result
produced after the lease was lost is discarded, never stored. A handler that is interrupted
(Ctrl-C, a cancelled task) gives its key back at once.

This module is the original of ``idemctl.runner.attempt`` (scripts/unasync.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from idemctl.aio.context import Handler, call_handler
from idemctl.aio.holding import held, let_go
from idemctl.aio.outbox import AsyncOutbox
from idemctl.errors import (
    ConfigError,
    IdemctlError,
    InvalidPayload,
    LeaseLost,
    StaleFence,
)
from idemctl.model import (
    Acquired,
    Busy,
    GuardReply,
    Order,
    Stale,
    Verdict,
    validate_key,
)
from idemctl.runner.context import Context
from idemctl.runner.ordering import (
    busy,
    guard_of,
    not_run_results,
    out_of_order,
    settle_of,
    stale_completions,
)
from idemctl.runner.outcome import (
    NEVER_RETRIED,
    Invocation,
    Outcome,
    Rollback,
    RunResult,
    discarded,
    error_text,
    exhausted,
    exhausted_error,
    fence_refused,
    last_attempt,
    not_acquired,
    result_lost,
    stored_form,
)
from idemctl.stores.base_async import AsyncTransactionalStore
from idemctl.stores.waiting import MAX_WAIT, STATS

if TYPE_CHECKING:
    from idemctl.stores.base_async import AsyncStore

log = logging.getLogger("idemctl.runner")
T = TypeVar("T")


async def run(
    store: AsyncStore,
    key: str,
    handler: Handler,
    *,
    fingerprint: str | None = None,
    lease: float | None = None,
    retention: float | None = None,
    permanent: tuple[type[BaseException], ...] = (),
    heartbeat: bool = True,
    transactional: bool = False,
    max_attempts: int | None = None,
    order: Order | None = None,
    logger: logging.Logger = log,
    timeout: float | None = None,
    wait: float | None = None,
) -> RunResult:
    """Run ``handler`` at most once to completion for ``key``.

    Store problems (StoreUnavailable, ...) propagate: nothing was decided, so the caller
    must not treat the work as done. Handler exceptions do not propagate; they come back
    as ``Outcome.ERROR`` with the exception in ``error``. ``idemctl.Permanent`` and the
    exception types in ``permanent`` fail the key for good; others leave it retriable.
    The result is returned as JSON gives it back, the same on the first run and on replays.

    ``transactional=True`` (PostgreSQL): claim, the handler's SQL on ``ctx.connection`` and
    complete share one transaction, so the effects commit exactly when the key does.

    ``max_attempts`` bounds the handler's runs for the key, counted in the store (so across
    restarts, redeliveries and duplicates): the last run's failure is recorded as final,
    and a claim past the bound fails the key with AttemptsExhausted without running it.

    ``order`` (an entity and the event's sequence) adds the sequence guard: the handler
    runs only if the sequence is above the last one the entity applied, else the result is
    ``Outcome.STALE``; BUSY while another key's event of the entity is being handled.

    ``timeout`` (seconds) is the handler's soft time limit: past it HandlerTimeout is
    raised in it (a coroutine is cancelled; a thread gets it at its next bytecode, a
    blocking C call when it returns), and the attempt fails as retriable.

    ``wait`` (seconds): a key in flight elsewhere is waited for, up to ``wait``, instead
    of answered BUSY at once: its result when it completes (REPLAYED), or this call claims
    and runs it when the holder fails, lets go or loses its lease; BUSY if it is still in
    flight at the deadline. The store wakes the waiter (see ``idemctl.stores.waiting``).
    """
    validate_key(key)  # InvalidKey before anything is claimed, the same on every store
    if wait is not None and not 0 < wait <= MAX_WAIT:
        raise ConfigError(f"wait must be above 0 and at most {MAX_WAIT:g} seconds, not {wait!r}")
    once = functools.partial(
        _run_once,
        store,
        key,
        handler,
        fingerprint,
        lease,
        retention,
        permanent,
        heartbeat,
        transactional,
        max_attempts,
        order,
        logger,
        timeout,
    )
    result = await once()
    if wait is None or result.outcome is not Outcome.BUSY:
        return result
    return await waited(store, key, wait, once, _busy)


async def waited(
    store: AsyncStore,
    key: str,
    wait: float,
    again: Callable[[], Awaitable[T]],
    busy: Callable[[T], Busy | None],
) -> T:
    """Run ``again`` (a claim, and the work if the key is won) at every wake-up about
    ``key`` until ``busy`` says its result is no longer busy or ``wait`` seconds are over.
    Registered before the first claim again, so a completion meanwhile is not missed. The
    HTTP middleware waits with it too."""
    started = time.monotonic()
    STATS.started()
    watch = await store.watch()
    with watch.watching(key) as watching:
        while True:
            result = await again()
            holder = busy(result)
            left = started + wait - time.monotonic()
            if holder is None or left <= 0:
                break
            await watching.wait_async(holder.record, left)
    STATS.ended(time.monotonic() - started, holder is None)
    return result


def _busy(result: RunResult) -> Busy | None:
    return Busy(result.record) if result.outcome is Outcome.BUSY else None


async def _run_once(
    store: AsyncStore,
    key: str,
    handler: Handler,
    fingerprint: str | None,
    lease: float | None,
    retention: float | None,
    permanent: tuple[type[BaseException], ...],
    heartbeat: bool,
    transactional: bool,
    max_attempts: int | None,
    order: Order | None,
    logger: logging.Logger,
    timeout: float | None,
) -> RunResult:
    """``run`` without waiting: one claim, and the handler if the key is won."""
    if transactional:
        return await _run_transactional(
            store,
            key,
            handler,
            fingerprint,
            lease,
            retention,
            permanent,
            max_attempts,
            logger,
            order,
            timeout,
        )
    outcome = await store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return not_acquired(key, outcome)
    if order is not None:
        (reply,) = await store.guard_many([guard_of(outcome, order)], lease)
        if reply.verdict is not Verdict.GO:
            results = await not_run(store, [(outcome, reply)], retention, logger)
            return results[0]
    did = await invoke(
        store,
        outcome,
        handler,
        lease=lease,
        retention=retention,
        permanent=permanent,
        heartbeat=heartbeat,
        max_attempts=max_attempts,
        order=order,
        logger=logger,
        timeout=timeout,
    )
    return await _complete(store, outcome, did, retention, order, logger)


async def _complete(
    store: AsyncStore,
    a: Acquired,
    did: Invocation,
    retention: float | None,
    order: Order | None,
    logger: logging.Logger,
) -> RunResult:
    """What the handler's run ``did`` comes to: its failure, or its value stored (and, with
    ``order``, the entity advanced first); LEASE_LOST if the key or entity was taken."""
    failed = did.failed(a)
    if failed is not None:
        return failed
    if order is not None:
        (advanced,) = await store.settle_many([settle_of(a, order)], retention)
        if not advanced:
            return result_lost(a, out_of_order(a, order), logger)
    try:
        record = await store.complete(a.key, a.owner, a.fencing_token, did.value, retention)
    except LeaseLost as lost:
        return result_lost(a, discarded(a.key, lost), logger)
    return RunResult(
        Outcome.EXECUTED,
        a.key,
        did.value,
        record,
        attempt=a.attempt,
        fencing_token=a.fencing_token,
    )


async def _run_transactional(
    store: AsyncStore,
    key: str,
    handler: Handler,
    fingerprint: str | None,
    lease: float | None,
    retention: float | None,
    permanent: tuple[type[BaseException], ...],
    max_attempts: int | None,
    logger: logging.Logger,
    order: Order | None,
    timeout: float | None,
) -> RunResult:
    if not isinstance(store, AsyncTransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    failure: Exception | None = None
    lost: StaleFence | None = None
    try:
        async with store.transaction(key, fingerprint, lease, order) as unit:
            if isinstance(unit.outcome, Stale):
                return RunResult(Outcome.STALE, key, last=unit.outcome.last)
            if not isinstance(unit.outcome, Acquired):
                return not_acquired(key, unit.outcome)
            a = unit.outcome
            if exhausted(a, max_attempts):
                failure = exhausted_error(a, max_attempts)
                raise Rollback
            outbox = AsyncOutbox(unit.connection, store.outbox_table)
            ctx = Context.held(a, store, logger, unit.connection, outbox, order)
            try:
                value = stored_form(await call_handler(ctx, handler, timeout))
            except StaleFence as stale:
                lost = fence_refused(a, stale, logger)
                raise Rollback from stale
            except Exception as exc:
                failure = exc
                raise Rollback from exc
            record = await unit.complete(value, retention)
            return RunResult(
                Outcome.EXECUTED,
                key,
                value,
                record,
                attempt=a.attempt,
                fencing_token=a.fencing_token,
            )
    except Rollback:
        if lost is not None:
            return RunResult(
                Outcome.LEASE_LOST,
                key,
                error=lost,
                attempt=a.attempt,
                fencing_token=a.fencing_token,
            )
        assert failure is not None
    # The handler's transaction is gone with all it wrote; record the failure on its own,
    # so attempts are counted and a permanent failure is not run again.
    retriable = not isinstance(failure, (*NEVER_RETRIED, InvalidPayload, *permanent))
    outcome = await store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return RunResult(Outcome.ERROR, key, error=failure, retriable=retriable)
    record = await store.fail(
        key,
        outcome.owner,
        outcome.fencing_token,
        error_text(failure),
        retriable and not last_attempt(outcome, max_attempts),
        retention,
    )
    return RunResult(
        Outcome.ERROR,
        key,
        record=record,
        error=failure,
        retriable=retriable,
        attempt=outcome.attempt,
        fencing_token=outcome.fencing_token,
    )


async def invoke(
    store: AsyncStore,
    acquired: Acquired,
    handler: Handler,
    *,
    lease: float | None = None,
    retention: float | None = None,
    permanent: tuple[type[BaseException], ...] = (),
    heartbeat: bool = True,
    max_attempts: int | None = None,
    order: Order | None = None,
    logger: logging.Logger = log,
    timeout: float | None = None,
) -> Invocation:
    """Run ``handler`` for a key this attempt holds, with a heartbeat, and record a failure;
    completing is left to the caller (``complete`` or, for a batch, ``complete_many``).
    ``retriable`` tells what the exception is; the store records the failure as final on
    the ``max_attempts``-th run, and a claim past it fails without running the handler.
    With ``order`` (whose guard said go), the heartbeat keeps the entity's hold too, and a
    handler that does not finish lets go of the entity; settling is the caller's."""
    key = acquired.key
    if exhausted(acquired, max_attempts):
        error: Exception = exhausted_error(acquired, max_attempts)
        return await record_failure(store, acquired, error, False, retention, order=order)
    ctx = Context.held(acquired, store, logger, order=order)
    try:
        value = (
            await held(
                store,
                acquired,
                functools.partial(call_handler, ctx, handler, timeout),
                lease=store.default_lease if lease is None else lease,
                heartbeat=heartbeat,
                order=order,
                logger=logger,
            )
        ).value
    except StaleFence as stale:  # a fenced write found a later attempt's token: not ours
        return Invocation(lease_lost=fence_refused(acquired, stale, logger))
    except Exception as exc:
        error, retriable = exc, not isinstance(exc, (*NEVER_RETRIED, *permanent))
    else:
        try:
            # What a replay will return; the first run returns the same, so callers cannot
            # come to depend on a form (a tuple, an object) that only the first run gives.
            return Invocation(value=stored_form(value))
        except InvalidPayload as exc:
            # The effects happened; failing permanently keeps them from happening twice.
            error = InvalidPayload(
                f"handler for {key!r} returned a result that cannot be stored: {exc}"
            )
            retriable = False
    final = last_attempt(acquired, max_attempts)
    return await record_failure(
        store, acquired, error, retriable, retention, final=final, order=order
    )


async def record_failure(
    store: AsyncStore,
    a: Acquired,
    error: Exception,
    retriable: bool,
    retention: float | None,
    *,
    final: bool = False,
    order: Order | None = None,
) -> Invocation:
    """Record ``error`` for the key ``a`` holds: retriable unless ``final``; with
    ``order``, let go of its entity first, so the entity's next event need not wait."""
    if order is not None:
        await let_go(store, a, order, log)
    try:
        record = await store.fail(
            a.key, a.owner, a.fencing_token, error_text(error), retriable and not final, retention
        )
    except LeaseLost as lost:
        return Invocation(error=error, retriable=retriable, lease_lost=lost)
    return Invocation(error=error, retriable=retriable, record=record)


async def not_run(
    store: AsyncStore,
    held: Sequence[tuple[Acquired, GuardReply]],
    retention: float | None,
    logger: logging.Logger,
) -> list[RunResult]:
    """What keys whose guard said stale or busy come to. Stale keys are completed with a
    null result (in one round trip): the event is decided; busy keys are given back."""
    stale = stale_completions(held)
    done = await store.complete_many(stale, retention) if stale else []
    for a, _ in busy(held):
        try:
            await store.release(a.key, a.owner, a.fencing_token, handler_ran=False)
        except IdemctlError as exc:  # its lease runs out by itself
            logger.debug("release %s: %s", a.key, exc)
    return not_run_results(held, done, logger)
