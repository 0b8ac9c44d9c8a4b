"""``await run(...)`` and ``@idempotent`` on ``async def``: idemctl.runner's semantics on an
``AsyncStore``, step for step (see ``idemctl.runner.single``), with what needs no store
shared with it: outcomes, results' stored form, the sequence guard's decisions, and what
``@idempotent`` makes of a call's arguments and of its result."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar, runtime_checkable

from idemctl.errors import ConfigError, IdemctlError, InvalidPayload, LeaseLost, StoreError
from idemctl.model import (
    JSON,
    Acquired,
    ClaimOutcome,
    Guard,
    GuardReply,
    Order,
    Record,
    Stale,
    Verdict,
    validate_key,
)
from idemctl.runner.context import Context, entered
from idemctl.runner.decorator import Calls, answer, check_order
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
    Outcome,
    RunResult,
    error_text,
    exhausted,
    exhausted_error,
    last_attempt,
    settled,
    stored_form,
)
from idemctl.runner.single import Invocation, discarded, result_lost

if TYPE_CHECKING:
    from idemctl.aio.store import AsyncStore

log = logging.getLogger("idemctl.runner")

P = ParamSpec("P")
T = TypeVar("T")

Handler = Callable[[Context], Awaitable[Any] | Any]
"""``async def handler(ctx) -> JSON``; a plain function works too (it blocks the loop)."""


class AsyncUnit(Protocol):
    """One key inside an open transaction (``AsyncTransactionalStore.transaction``)."""

    outcome: ClaimOutcome | Stale
    connection: Any
    """The transaction's async connection while the key is Acquired."""

    async def complete(self, result: JSON = None, retention: float | None = None) -> Record: ...


@runtime_checkable
class AsyncTransactionalStore(Protocol):
    """An async store whose claim, the handler's SQL and completion share one transaction."""

    outbox_table: str

    def transaction(
        self,
        key: str,
        fingerprint: str | None = None,
        lease: float | None = None,
        order: Order | None = None,
    ) -> AbstractAsyncContextManager[AsyncUnit]: ...


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
) -> RunResult:
    """Run ``handler`` at most once to completion for ``key``: ``idemctl.run`` for asyncio
    (the same arguments, outcomes and errors). While the handler runs, a task extends its
    lease; a cancelled handler gives its key back at once, as an interrupted one does."""
    validate_key(key)
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
        )
    outcome = await store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return settled(key, outcome)
    if order is not None:
        (reply,) = await store.guard_many([guard_of(outcome, order)], lease)
        if reply.verdict is not Verdict.GO:
            return (await _not_run(store, [(outcome, reply)], retention, logger))[0]
    done: dict[str, Any] = {"attempt": outcome.attempt, "fencing_token": outcome.fencing_token}
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
    )
    failed = did.failed(outcome)
    if failed is not None:
        return failed
    if (
        order is not None
        and not (await store.settle_many([settle_of(outcome, order)], retention))[0]
    ):
        return result_lost(outcome, out_of_order(outcome, order), logger)
    try:
        record = await store.complete(
            key, outcome.owner, outcome.fencing_token, did.value, retention
        )
    except LeaseLost as lost:
        return result_lost(outcome, discarded(key, lost), logger)
    return RunResult(Outcome.EXECUTED, key, did.value, record, **done)


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
) -> Invocation:
    """``idemctl.runner.invoke`` for asyncio: run ``handler`` for a key this attempt holds,
    with a heartbeat task, and record a failure; completing is the caller's."""
    key = acquired.key
    if exhausted(acquired, max_attempts):
        error: Exception = exhausted_error(acquired, max_attempts)
        return await _record_failure(store, acquired, error, False, retention, order=order)
    ctx = Context.held(acquired, store, logger, order=order)
    guards = [] if order is None else [guard_of(acquired, order)]
    beat = (
        Heartbeat(store, store.default_lease if lease is None else lease, [acquired], guards)
        if heartbeat
        else None
    )
    try:
        try:
            value = await call(ctx, handler)
        finally:
            if beat is not None:
                await beat.stop()
    except Exception as exc:
        error, retriable = exc, not isinstance(exc, (*NEVER_RETRIED, *permanent))
    except BaseException:
        # Cancelled or interrupted: free the key for the next delivery at once, even if
        # the task is cancelled again meanwhile.
        await asyncio.shield(_give_back(store, acquired, order, logger))
        raise
    else:
        try:
            return Invocation(value=stored_form(value))
        except InvalidPayload as exc:
            # The effects happened; failing permanently keeps them from happening twice.
            error = InvalidPayload(
                f"handler for {key!r} returned a result that cannot be stored: {exc}"
            )
            retriable = False
    final = last_attempt(acquired, max_attempts)
    return await _record_failure(
        store, acquired, error, retriable, retention, final=final, order=order
    )


async def call(ctx: Context, handler: Handler) -> Any:
    """The handler's value, awaited if it is a coroutine, with ``current_context()`` set."""
    with entered(ctx):
        value = handler(ctx)
        if inspect.isawaitable(value):
            value = await value
        return value


async def _give_back(
    store: AsyncStore, a: Acquired, order: Order | None, logger: logging.Logger
) -> None:
    if order is not None:
        await _let_go(store, a, order, logger)
    try:
        await store.release(a.key, a.owner, a.fencing_token)
    except StoreError as exc:
        logger.warning(
            "could not release %r after an interrupt: %s",
            a.key,
            exc,
            extra={"idemctl": {"key": a.key}},
        )


async def _record_failure(
    store: AsyncStore,
    a: Acquired,
    error: Exception,
    retriable: bool,
    retention: float | None,
    *,
    final: bool = False,
    order: Order | None = None,
) -> Invocation:
    if order is not None:
        await _let_go(store, a, order, log)
    try:
        record = await store.fail(
            a.key, a.owner, a.fencing_token, error_text(error), retriable and not final, retention
        )
    except LeaseLost as lost:
        return Invocation(error=error, retriable=retriable, lease_lost=lost)
    return Invocation(error=error, retriable=retriable, record=record)


async def _not_run(
    store: AsyncStore,
    held: Sequence[tuple[Acquired, GuardReply]],
    retention: float | None,
    logger: logging.Logger,
) -> list[RunResult]:
    """``idemctl.runner.ordering.not_run``: stale keys completed, busy ones given back."""
    stale = stale_completions(held)
    done = await store.complete_many(stale, retention) if stale else []
    for a, _ in busy(held):
        try:
            await store.release(a.key, a.owner, a.fencing_token, handler_ran=False)
        except IdemctlError as exc:  # its lease runs out by itself
            logger.debug("release %s: %s", a.key, exc)
    return not_run_results(held, done, logger)


async def _let_go(store: AsyncStore, a: Acquired, order: Order, logger: logging.Logger) -> None:
    try:
        await store.settle_many([settle_of(a, order, applied=False)])
    except IdemctlError as exc:  # its hold runs out by itself
        logger.debug("let go of entity %s: %s", order.entity, exc)


class _Rollback(Exception):
    """Raised inside a transaction to roll it back after the handler failed."""


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
) -> RunResult:
    if not isinstance(store, AsyncTransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    from idemctl.outbox.writer import AsyncOutbox

    failure: Exception | None = None
    try:
        async with store.transaction(key, fingerprint, lease, order) as unit:
            if isinstance(unit.outcome, Stale):
                return RunResult(Outcome.STALE, key, last=unit.outcome.last)
            if not isinstance(unit.outcome, Acquired):
                return settled(key, unit.outcome)
            a = unit.outcome
            if exhausted(a, max_attempts):
                failure = exhausted_error(a, max_attempts)
                raise _Rollback
            outbox = AsyncOutbox(unit.connection, store.outbox_table)
            ctx = Context.held(a, store, logger, unit.connection, outbox, order)
            try:
                value = stored_form(await call(ctx, handler))
            except Exception as exc:
                failure = exc
                raise _Rollback from exc
            record = await unit.complete(value, retention)
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
    # The handler's transaction is gone with all it wrote; record the failure on its own.
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


class Heartbeat:
    """``idemctl.runner.Heartbeat`` as a task: every ``lease/3`` seconds it extends the
    leases of ``held`` (and the entity holds ``guards`` name) until stopped."""

    def __init__(
        self, store: AsyncStore, lease: float, held: Sequence[Acquired], guards: Sequence[Guard]
    ) -> None:
        self.store, self.lease = store, lease
        self._held = list(held)
        self._guards = list(guards)
        self._task = asyncio.create_task(self._beat(), name="idemctl-heartbeat")

    async def stop(self) -> None:
        """Cancel the beats and wait for them to end. The caller's own cancellation still
        reaches it (awaiting the cancelled task under ``suppress`` would swallow it)."""
        self._task.cancel()
        await asyncio.wait([self._task])
        if not self._task.cancelled() and self._task.exception() is not None:
            log.warning("heartbeat stopped: %r", self._task.exception())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            unanswered: StoreError | None = None
            if self._guards:  # asking again extends the hold; a lost one shows when it settles
                try:
                    await self.store.guard_many(self._guards, self.lease)
                except StoreError as exc:
                    unanswered = exc
            for a in list(self._held):
                try:
                    await self.store.extend(a.key, a.owner, a.fencing_token, self.lease)
                except LeaseLost as exc:  # completed meanwhile, or taken: completion says
                    log.debug("heartbeat: %s", exc)
                    self._held.remove(a)
                except StoreError as exc:
                    unanswered = exc
            if unanswered is not None:
                log.warning("heartbeat could not extend the leases it holds: %s", unanswered)


def idempotent(
    store: AsyncStore | str,
    *,
    key: str | Callable[..., str],
    fingerprint: bool | Callable[..., Any] = True,
    lease: float | None = None,
    retention: float | None = None,
    permanent: tuple[type[BaseException], ...] = (),
    order_key: str | Callable[..., str] | None = None,
    sequence: str | Callable[..., Any] | None = None,
) -> Callable[[Callable[P, Awaitable[T]]], Callable[P, Awaitable[T]]]:
    """``idemctl.idempotent`` for ``async def`` functions: the same arguments, results and
    errors; ``store`` is an ``AsyncStore`` or a URL opened on first call."""
    check_order(order_key, sequence)

    def decorate(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
        calls = Calls(fn, key, fingerprint, order_key, sequence)
        opened: list[AsyncStore] = []

        def the_store() -> AsyncStore:
            if not isinstance(store, str):
                return store
            if not opened:
                from idemctl.aio import open_store

                opened.append(open_store(store))
            return opened[0]

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            k, fp, order = calls.of(args, kwargs)
            result = await run(
                the_store(),
                k,
                lambda _ctx: fn(*args, **kwargs),
                fingerprint=fp,
                lease=lease,
                retention=retention,
                permanent=permanent,
                order=order,
            )
            value: T = answer(result, order)
            return value

        return wrapper

    return decorate
