"""Run one unit of work: claim the key, run the handler, complete or fail it.

``run()`` is what ``@idempotent`` builds on; ``invoke()`` runs a handler for a key already
held (``Batch`` builds on it). While a handler runs, a heartbeat extends its lease; a result
produced after the lease was lost is discarded, never stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemctl.errors import ConfigError, InvalidPayload, LeaseLost, StoreError
from idemctl.model import JSON, Acquired, Order, Record, Stale, Verdict, validate_key
from idemctl.outbox.writer import Outbox
from idemctl.runner.context import Context, call_in_context
from idemctl.runner.heartbeat import Heartbeat
from idemctl.runner.ordering import guard_of, let_go, not_run, out_of_order, settle_of
from idemctl.runner.outcome import (
    NEVER_RETRIED,
    Outcome,
    RunResult,
    error_text,
    exhausted,
    exhausted_error,
    last_attempt,
    settled,
    stored_form,
)
from idemctl.stores.base import TransactionalStore

if TYPE_CHECKING:
    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.runner")


def run(
    store: Store,
    key: str,
    handler: Callable[[Context], Any],
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
    """
    validate_key(key)  # InvalidKey before anything is claimed, the same on every store
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
        )
    outcome = store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return settled(key, outcome)
    if order is not None:
        (reply,) = store.guard_many([guard_of(outcome, order)], lease)
        if reply.verdict is not Verdict.GO:
            return not_run(store, [(outcome, reply)], retention, logger)[0]
    return _execute(
        store,
        outcome,
        handler,
        lease,
        retention,
        permanent,
        heartbeat,
        max_attempts,
        logger,
        order,
    )


class _Rollback(Exception):
    """Raised inside a transaction to roll it back after the handler failed."""


def _run_transactional(
    store: Store,
    key: str,
    handler: Callable[[Context], Any],
    fingerprint: str | None,
    lease: float | None,
    retention: float | None,
    permanent: tuple[type[BaseException], ...],
    max_attempts: int | None,
    logger: logging.Logger,
    order: Order | None,
) -> RunResult:
    if not isinstance(store, TransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    failure: Exception | None = None
    try:
        with store.transaction(key, fingerprint, lease, order) as unit:
            if isinstance(unit.outcome, Stale):
                return RunResult(Outcome.STALE, key, last=unit.outcome.last)
            if not isinstance(unit.outcome, Acquired):
                return settled(key, unit.outcome)
            a = unit.outcome
            if exhausted(a, max_attempts):
                failure = exhausted_error(a, max_attempts)
                raise _Rollback
            outbox = Outbox(unit.connection, store.outbox_table)
            ctx = Context.held(a, store, logger, unit.connection, outbox, order)
            try:
                value = stored_form(call_in_context(ctx, handler))
            except Exception as exc:
                failure = exc
                raise _Rollback from exc
            record = unit.complete(value, retention)
            return RunResult(
                Outcome.EXECUTED,
                key,
                value,
                record,
                attempt=a.attempt,
                fencing_token=a.fencing_token,
            )
    except _Rollback:
        assert failure is not None
    # The handler's transaction is gone with all it wrote; record the failure on its own,
    # so attempts are counted and a permanent failure is not run again.
    retriable = not isinstance(failure, (*NEVER_RETRIED, InvalidPayload, *permanent))
    outcome = store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return RunResult(Outcome.ERROR, key, error=failure, retriable=retriable)
    record = store.fail(
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


@dataclass(frozen=True)
class Invocation:
    """What running a handler under a held key gave: a storable ``value``, or ``error``
    (already recorded in the store with ``store.fail``), or a lost lease."""

    value: JSON = None
    error: BaseException | None = None
    retriable: bool = False
    record: Record | None = None
    lease_lost: LeaseLost | None = None

    def failed(self, acquired: Acquired) -> RunResult | None:
        """LEASE_LOST or ERROR when the handler gave no value to complete, else None."""
        a = acquired
        if self.lease_lost is not None:
            lost = self.lease_lost
            return RunResult(
                Outcome.LEASE_LOST, a.key, None, lost.record, lost, a.attempt, a.fencing_token
            )
        if self.error is not None:
            return RunResult(
                Outcome.ERROR,
                a.key,
                None,
                self.record,
                self.error,
                a.attempt,
                a.fencing_token,
                self.retriable,
            )
        return None


def invoke(
    store: Store,
    acquired: Acquired,
    handler: Callable[[Context], Any],
    *,
    lease: float | None = None,
    retention: float | None = None,
    permanent: tuple[type[BaseException], ...] = (),
    heartbeat: bool = True,
    max_attempts: int | None = None,
    order: Order | None = None,
    logger: logging.Logger = log,
) -> Invocation:
    """Run ``handler`` for a key this attempt holds, with a heartbeat, and record a failure;
    completing is left to the caller (``complete`` or, for a batch, ``complete_many``).
    ``retriable`` tells what the exception is; the store records the failure as final on
    the ``max_attempts``-th run, and a claim past it fails without running the handler.
    With ``order`` (whose guard said go), the heartbeat keeps the entity's hold too, and a
    handler that does not finish lets go of the entity; settling is the caller's."""
    key, owner, token = acquired.key, acquired.owner, acquired.fencing_token
    if exhausted(acquired, max_attempts):
        error: Exception = exhausted_error(acquired, max_attempts)
        return _record_failure(store, acquired, error, False, retention, order=order)
    ctx = Context.held(acquired, store, logger, order=order)
    beat = (
        Heartbeat(
            store, store.default_lease if lease is None else lease, f"idemctl-heartbeat-{key}"
        )
        if heartbeat
        else None
    )
    try:
        if beat is not None:
            beat.hold([acquired], [] if order is None else [guard_of(acquired, order)])
        try:
            value = call_in_context(ctx, handler)
        finally:
            if beat is not None:
                beat.stop()
    except Exception as exc:
        error, retriable = exc, not isinstance(exc, (*NEVER_RETRIED, *permanent))
    except BaseException:
        # Interrupted (Ctrl-C, SystemExit): free the key for the next delivery at once.
        if order is not None:
            let_go(store, acquired, order, logger)
        try:
            store.release(key, owner, token)
        except StoreError as exc:
            logger.warning(
                "could not release %r after an interrupt: %s",
                key,
                exc,
                extra={"idemctl": {"key": key}},
            )
        raise
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
    return _record_failure(store, acquired, error, retriable, retention, final=final, order=order)


def _record_failure(
    store: Store,
    acquired: Acquired,
    error: Exception,
    retriable: bool,
    retention: float | None,
    *,
    final: bool = False,
    order: Order | None = None,
) -> Invocation:
    """Record ``error`` for the key ``acquired`` holds: retriable unless ``final``; with
    ``order``, let go of its entity first, so the entity's next event need not wait."""
    a = acquired
    if order is not None:
        let_go(store, a, order, log)
    try:
        record = store.fail(
            a.key, a.owner, a.fencing_token, error_text(error), retriable and not final, retention
        )
    except LeaseLost as lost:
        return Invocation(error=error, retriable=retriable, lease_lost=lost)
    return Invocation(error=error, retriable=retriable, record=record)


def _execute(
    store: Store,
    acquired: Acquired,
    handler: Callable[[Context], Any],
    lease: float | None,
    retention: float | None,
    permanent: tuple[type[BaseException], ...],
    heartbeat: bool,
    max_attempts: int | None,
    logger: logging.Logger,
    order: Order | None = None,
) -> RunResult:
    key, owner, token = acquired.key, acquired.owner, acquired.fencing_token
    done: dict[str, Any] = {"attempt": acquired.attempt, "fencing_token": token}
    did = invoke(
        store,
        acquired,
        handler,
        lease=lease,
        retention=retention,
        permanent=permanent,
        heartbeat=heartbeat,
        max_attempts=max_attempts,
        order=order,
        logger=logger,
    )
    failed = did.failed(acquired)
    if failed is not None:
        return failed
    if order is not None and not store.settle_many([settle_of(acquired, order)], retention)[0]:
        return result_lost(acquired, out_of_order(acquired, order), logger)
    try:
        record = store.complete(key, owner, token, did.value, retention)
    except LeaseLost as lost:
        return result_lost(acquired, discarded(key, lost), logger)
    return RunResult(Outcome.EXECUTED, key, did.value, record, **done)


def discarded(key: str, lost: LeaseLost) -> LeaseLost:
    """Why a handler's result was not stored: completing it found the lease ``lost``."""
    return LeaseLost(
        f"result for {key!r} discarded: {lost} (the handler ran past its lease; "
        "raise the lease or keep the heartbeat on)",
        lost.record,
    )


def result_lost(a: Acquired, lost: LeaseLost, logger: logging.Logger) -> RunResult:
    """LEASE_LOST for a handler that finished after its key (or entity) was taken: logged."""
    logger.warning("%s", lost, extra={"idemctl": {"key": a.key, "outcome": "lease_lost"}})
    return RunResult(
        Outcome.LEASE_LOST,
        a.key,
        error=lost,
        record=lost.record,
        attempt=a.attempt,
        fencing_token=a.fencing_token,
    )
