# Written by scripts/unasync.py from idemctl/aio/attempt.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""One attempt at a key: claim it, run the handler, complete or fail it.

``run()`` is what ``@idempotent`` builds on; ``invoke()`` runs a handler for a key already
held (``Batch`` builds on it). While a handler runs, a heartbeat extends its lease; a result
produced after the lease was lost is discarded, never stored. A handler that is interrupted
(Ctrl-C, a cancelled task) gives its key back at once.

Written by scripts/unasync.py from ``idemctl.aio.attempt``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from idemctl.errors import (
    ConfigError,
    IdemctlError,
    InvalidPayload,
    KeyNotFound,
    LeaseLost,
    NotProvisioned,
    Refused,
    StaleFence,
    StoreError,
)
from idemctl.model import (
    Acquired,
    Busy,
    GuardReply,
    Order,
    Record,
    Stale,
    Status,
    Verdict,
    validate_key,
)
from idemctl.outbox.writer import Outbox
from idemctl.runner.context import Context, Handler, call_handler
from idemctl.runner.heartbeat import Heartbeat
from idemctl.runner.limits import Abandoned
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
from idemctl.stores.base import TransactionalStore
from idemctl.stores.waiting import MAX_WAIT, STATS

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


def run(
    store: Store,
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
    validate_key(key)
    if wait is not None and (not 0 < wait <= MAX_WAIT):
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
    result = once()
    if wait is None or result.outcome is not Outcome.BUSY:
        return result
    return waited(store, key, wait, once, _busy)


def waited(
    store: Store, key: str, wait: float, again: Callable[[], T], busy: Callable[[T], Busy | None]
) -> T:
    """Run ``again`` (a claim, and the work if the key is won) at every wake-up about
    ``key`` until ``busy`` says its result is no longer busy or ``wait`` seconds are over.
    Registered before the first claim again, so a completion meanwhile is not missed. The
    HTTP middleware waits with it too."""
    started = time.monotonic()
    STATS.started()
    watch = store.watch()
    with watch.watching(key) as watching:
        while True:
            result = again()
            holder = busy(result)
            left = started + wait - time.monotonic()
            if holder is None or left <= 0:
                break
            watching.wait(holder.record, left)
    STATS.ended(time.monotonic() - started, holder is None)
    return result


def _busy(result: RunResult) -> Busy | None:
    return Busy(result.record) if result.outcome is Outcome.BUSY else None


def _run_once(
    store: Store,
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
        return _run_transactional(
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
    outcome = store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return not_acquired(key, outcome)
    if order is not None:
        (reply,) = store.guard_many([guard_of(outcome, order)], lease)
        if reply.verdict is not Verdict.GO:
            results = not_run(store, [(outcome, reply)], retention, logger)
            return results[0]
    did = invoke(
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
    return _complete(store, outcome, did, retention, order, logger)


def _complete(
    store: Store,
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
        (advanced,) = store.settle_many([settle_of(a, order)], retention)
        if not advanced:
            return result_lost(a, out_of_order(a, order), logger)
    try:
        record = store.complete(a.key, a.owner, a.fencing_token, did.value, retention)
    except LeaseLost as lost:
        return result_lost(a, discarded(a.key, lost), logger)
    return RunResult(
        Outcome.EXECUTED, a.key, did.value, record, attempt=a.attempt, fencing_token=a.fencing_token
    )


def _run_transactional(
    store: Store,
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
    if not isinstance(store, TransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    failure: Exception | None = None
    lost: StaleFence | None = None
    try:
        with store.transaction(key, fingerprint, lease, order) as unit:
            if isinstance(unit.outcome, Stale):
                return RunResult(Outcome.STALE, key, last=unit.outcome.last)
            if not isinstance(unit.outcome, Acquired):
                return not_acquired(key, unit.outcome)
            a = unit.outcome
            if exhausted(a, max_attempts):
                failure = exhausted_error(a, max_attempts)
                raise Rollback
            outbox = Outbox(unit.connection, store.outbox_table)
            ctx = Context.held(a, store, logger, unit.connection, outbox, order)
            try:
                value = stored_form(call_handler(ctx, handler, timeout))
            except StaleFence as stale:
                lost = fence_refused(a, stale, logger)
                raise Rollback from stale
            except Exception as exc:
                failure = exc
                raise Rollback from exc
            record = unit.complete(value, retention)
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
    retriable = not isinstance(failure, (*NEVER_RETRIED, InvalidPayload, *permanent))
    outcome = store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return RunResult(Outcome.ERROR, key, error=failure, retriable=retriable)
    record = store.fail(
        key,
        outcome.owner,
        outcome.fencing_token,
        error_text(failure),
        retriable and (not last_attempt(outcome, max_attempts)),
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


def invoke(
    store: Store,
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
        return record_failure(store, acquired, error, False, retention, order=order)
    ctx = Context.held(acquired, store, logger, order=order)
    try:
        value = held(
            store,
            acquired,
            functools.partial(call_handler, ctx, handler, timeout),
            lease=store.default_lease if lease is None else lease,
            heartbeat=heartbeat,
            order=order,
            logger=logger,
        ).value
    except StaleFence as stale:
        return Invocation(lease_lost=fence_refused(acquired, stale, logger))
    except Exception as exc:
        error, retriable = (exc, not isinstance(exc, (*NEVER_RETRIED, *permanent)))
    else:
        try:
            return Invocation(value=stored_form(value))
        except InvalidPayload as exc:
            error = InvalidPayload(
                f"handler for {key!r} returned a result that cannot be stored: {exc}"
            )
            retriable = False
    final = last_attempt(acquired, max_attempts)
    return record_failure(store, acquired, error, retriable, retention, final=final, order=order)


def record_failure(
    store: Store,
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
        let_go(store, a, order, log)
    try:
        record = store.fail(
            a.key, a.owner, a.fencing_token, error_text(error), retriable and (not final), retention
        )
    except LeaseLost as lost:
        return Invocation(error=error, retriable=retriable, lease_lost=lost)
    return Invocation(error=error, retriable=retriable, record=record)


@dataclass(frozen=True)
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


def not_run(
    store: Store,
    held: Sequence[tuple[Acquired, GuardReply]],
    retention: float | None,
    logger: logging.Logger,
) -> list[RunResult]:
    """What keys whose guard said stale or busy come to. Stale keys are completed with a
    null result (in one round trip): the event is decided; busy keys are given back."""
    stale = stale_completions(held)
    done = store.complete_many(stale, retention) if stale else []
    for a, _ in busy(held):
        try:
            store.release(a.key, a.owner, a.fencing_token, handler_ran=False)
        except IdemctlError as exc:
            logger.debug("release %s: %s", a.key, exc)
    return not_run_results(held, done, logger)


def let_go(store: Store, a: Acquired, order: Order, logger: logging.Logger) -> None:
    """The handler will not finish: free the entity for its next event at once."""
    try:
        store.settle_many([settle_of(a, order, applied=False)])
    except IdemctlError as exc:
        logger.debug("let go of entity %s: %s", order.entity, exc)
