"""Run one unit of work: claim the key, run the handler, complete or fail it.

``run()`` is what ``consume`` builds on; ``@idempotent`` wraps a plain function for
library users. While a handler runs, a heartbeat thread extends its lease; a result
produced after the lease was lost is discarded, never stored.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemctl.errors import (
    AttemptsExhausted,
    ConfigError,
    FingerprintMismatch,
    InvalidPayload,
    KeyBusy,
    LeaseLost,
    OutboxError,
    Permanent,
    PreviouslyFailed,
    StoreError,
)
from idemctl.model import (
    JSON,
    Acquired,
    Busy,
    ClaimOutcome,
    Completed,
    Failed,
    Mismatch,
    Record,
    canonical_json,
    validate_key,
)
from idemctl.model import (
    fingerprint as fingerprint_of,
)
from idemctl.outbox.writer import NoOutbox, Outbox
from idemctl.stores.base import TransactionalStore

if TYPE_CHECKING:
    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.runner")

MAX_ERROR_CHARS = 4000
NEVER_RETRIED: tuple[type[BaseException], ...] = (Permanent, OutboxError)
"""Failures that would come back the same on every retry: the key fails for good. An
OutboxError is a handler writing events where they cannot commit with the key, or events
that cannot be stored."""


NO_OUTBOX = NoOutbox(
    "ctx.outbox needs the PostgreSQL store in transactional mode (consume --transactional, "
    "run(..., transactional=True)): elsewhere its rows could not commit with the key"
)
"""``ctx.outbox`` outside transactional mode: one for every context, it only says why."""


@dataclass(frozen=True)
class Context:
    """What a handler may know about the attempt running it."""

    key: str
    fencing_token: int
    """Pass it to your own writes so a zombie attempt's writes can be refused."""
    attempt: int
    takeover: bool
    """A previous attempt on this key never finished and may have done part of the work."""
    owner: str
    store: Store
    logger: logging.Logger
    connection: Any = None
    """In PostgreSQL transactional mode: the psycopg connection whose open transaction holds
    the key. Write your effects on it; they commit together with the key, or not at all."""
    outbox: Outbox = NO_OUTBOX
    """In PostgreSQL transactional mode: ``ctx.outbox.add(aggregatetype, aggregateid, type,
    payload, headers=None)`` writes an event that commits with the key and the effects;
    ``idemctl outbox relay`` publishes it. Elsewhere ``add`` raises OutboxError."""


_current: contextvars.ContextVar[Context] = contextvars.ContextVar("idemctl_context")


def current_context() -> Context:
    """The Context of the handler running in this thread (inside ``@idempotent`` or ``run``)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "current_context() is only available inside an idempotent handler"
        ) from None


class Outcome(StrEnum):
    EXECUTED = "executed"
    """The handler ran and its result is stored."""
    REPLAYED = "replayed"
    """The key was completed before: the stored result, without running the handler."""
    BUSY = "busy"
    """Another worker holds a live lease: try again later."""
    MISMATCH = "mismatch"
    """The key was seen with another payload: not run."""
    FAILED = "failed"
    """The key failed permanently before: not run."""
    ERROR = "error"
    """The handler raised now; the key is recorded as failed (``retriable``: may it run again)."""
    LEASE_LOST = "lease_lost"
    """The handler ran but another attempt took the key meanwhile: its result was discarded."""


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    key: str
    result: JSON = None
    record: Record | None = None
    error: BaseException | None = None
    attempt: int | None = None
    fencing_token: int | None = None
    retriable: bool = False


class Heartbeat:
    """Extends a lease every ``interval`` seconds until stopped or the lease is lost."""

    def __init__(self, store: Store, acquired: Acquired, lease: float, interval: float) -> None:
        self._store, self._acquired, self._lease, self._interval = store, acquired, lease, interval
        self._stop = threading.Event()
        self.lost: LeaseLost | None = None
        self._thread = threading.Thread(
            target=self._beat, name=f"idemctl-heartbeat-{acquired.key}", daemon=True
        )

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        a = self._acquired
        while not self._stop.wait(self._interval):
            try:
                self._store.extend(a.key, a.owner, a.fencing_token, self._lease)
            except LeaseLost as exc:
                self.lost = exc
                log.warning("heartbeat: %s", exc)
                return
            except StoreError as exc:
                # Keep trying: the lease may still hold until the store answers again.
                log.warning("heartbeat could not extend the lease on %r: %s", a.key, exc)


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
    """
    validate_key(key)  # InvalidKey before anything is claimed, the same on every store
    if transactional:
        return _run_transactional(
            store, key, handler, fingerprint, lease, retention, permanent, max_attempts, logger
        )
    outcome = store.claim(key, fingerprint, lease)
    if not isinstance(outcome, Acquired):
        return _settled(key, outcome)
    return _execute(
        store, outcome, handler, lease, retention, permanent, heartbeat, max_attempts, logger
    )


def _settled(key: str, outcome: ClaimOutcome) -> RunResult:
    """The result of a claim that did not acquire its key."""
    match outcome:
        case Completed(record):
            return RunResult(Outcome.REPLAYED, key, record.result, record)
        case Busy(record):
            return RunResult(Outcome.BUSY, key, record=record)
        case Mismatch(record):
            return RunResult(Outcome.MISMATCH, key, record=record)
        case Failed(record):
            return RunResult(Outcome.FAILED, key, record=record)
    raise AssertionError(f"not a settled claim outcome: {outcome!r}")


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
) -> RunResult:
    if not isinstance(store, TransactionalStore):
        raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
    failure: Exception | None = None
    try:
        with store.transaction(key, fingerprint, lease) as unit:
            if not isinstance(unit.outcome, Acquired):
                return _settled(key, unit.outcome)
            a = unit.outcome
            if exhausted(a, max_attempts):
                failure = _exhausted(a, max_attempts)
                raise _Rollback
            ctx = Context(
                key, a.fencing_token, a.attempt, a.takeover, a.owner, store, logger,
                unit.connection, Outbox(unit.connection, store.outbox_table),
            )  # fmt: skip
            try:
                value = stored_form(_call_in_context(ctx, handler))
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
        key, outcome.owner, outcome.fencing_token, _error_text(failure),
        retriable and not _last(outcome, max_attempts), retention,
    )  # fmt: skip
    return RunResult(
        Outcome.ERROR, key, record=record, error=failure, retriable=retriable,
        attempt=outcome.attempt, fencing_token=outcome.fencing_token,
    )  # fmt: skip


@dataclass(frozen=True)
class Invocation:
    """What running a handler under a held key gave: a storable ``value``, or ``error``
    (already recorded in the store with ``store.fail``), or a lost lease."""

    value: JSON = None
    error: BaseException | None = None
    retriable: bool = False
    record: Record | None = None
    lease_lost: LeaseLost | None = None


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
    logger: logging.Logger = log,
) -> Invocation:
    """Run ``handler`` for a key this attempt holds, with a heartbeat, and record a failure;
    completing is left to the caller (``complete`` or, for a batch, ``complete_many``).
    ``retriable`` tells what the exception is; the store records the failure as final on
    the ``max_attempts``-th run, and a claim past it fails without running the handler."""
    key, owner, token = acquired.key, acquired.owner, acquired.fencing_token
    if exhausted(acquired, max_attempts):
        error: Exception = _exhausted(acquired, max_attempts)
        return _record_failure(store, acquired, error, False, retention)
    ctx = Context(key, token, acquired.attempt, acquired.takeover, owner, store, logger)
    lease_seconds = store.default_lease if lease is None else lease
    beat = (
        Heartbeat(store, acquired, lease_seconds, lease_seconds / 3)
        if heartbeat
        else contextlib.nullcontext()
    )
    try:
        with beat:
            value = _call_in_context(ctx, handler)
    except Exception as exc:
        error, retriable = exc, not isinstance(exc, (*NEVER_RETRIED, *permanent))
    except BaseException:
        # Interrupted (Ctrl-C, SystemExit): free the key for the next delivery at once.
        try:
            store.release(key, owner, token)
        except StoreError as exc:
            logger.warning("could not release %r after an interrupt: %s", key, exc)
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
    return _record_failure(
        store, acquired, error, retriable, retention, final=_last(acquired, max_attempts)
    )


def _record_failure(
    store: Store,
    acquired: Acquired,
    error: Exception,
    retriable: bool,
    retention: float | None,
    *,
    final: bool = False,
) -> Invocation:
    """Record ``error`` for the key ``acquired`` holds: retriable unless ``final``."""
    a = acquired
    try:
        record = store.fail(
            a.key, a.owner, a.fencing_token, _error_text(error), retriable and not final, retention
        )
    except LeaseLost as lost:
        return Invocation(error=error, retriable=retriable, lease_lost=lost)
    return Invocation(error=error, retriable=retriable, record=record)


def exhausted(acquired: Acquired, max_attempts: int | None) -> bool:
    """The claim is past ``max_attempts`` runs: the handler must not run again."""
    return max_attempts is not None and acquired.attempt > max_attempts


def _last(acquired: Acquired, max_attempts: int | None) -> bool:
    return max_attempts is not None and acquired.attempt >= max_attempts


def _exhausted(acquired: Acquired, max_attempts: int | None) -> AttemptsExhausted:
    return AttemptsExhausted(
        f"key {acquired.key!r} ran {max_attempts} time(s) already (max_attempts): not run again"
    )


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
) -> RunResult:
    key, owner, token = acquired.key, acquired.owner, acquired.fencing_token
    done: dict[str, Any] = {"attempt": acquired.attempt, "fencing_token": token}
    did = invoke(
        store, acquired, handler, lease=lease, retention=retention, permanent=permanent,
        heartbeat=heartbeat, max_attempts=max_attempts, logger=logger,
    )  # fmt: skip
    if did.lease_lost is not None:
        lost = did.lease_lost
        return RunResult(Outcome.LEASE_LOST, key, error=lost, record=lost.record, **done)
    if did.error is not None:
        return RunResult(
            Outcome.ERROR, key, record=did.record, error=did.error, retriable=did.retriable,
            **done,
        )  # fmt: skip
    try:
        record = store.complete(key, owner, token, did.value, retention)
    except LeaseLost as lost:
        discarded = LeaseLost(
            f"result for {key!r} discarded: {lost} (the handler ran past its lease; "
            "raise the lease or keep the heartbeat on)",
            lost.record,
        )
        logger.warning("%s", discarded)
        return RunResult(Outcome.LEASE_LOST, key, error=discarded, record=lost.record, **done)
    return RunResult(Outcome.EXECUTED, key, did.value, record, **done)


def stored_form(value: Any) -> JSON:
    """``value`` as the store gives it back (its canonical JSON, parsed): what every run of
    a key returns, the first included. InvalidPayload when it is not JSON."""
    if value is None or type(value) in (bool, int):  # already their own stored form
        return value
    return json.loads(canonical_json(value))


def _call_in_context(ctx: Context, handler: Callable[[Context], Any]) -> Any:
    """Run the handler with ``current_context()`` set to ``ctx``, in a copy of this context."""

    def call() -> Any:
        _current.set(ctx)
        return handler(ctx)

    return contextvars.copy_context().run(call)


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


# The decorator ------------------------------------------------------------------------------

P = ParamSpec("P")
T = TypeVar("T")


def idempotent(
    store: Store | str,
    *,
    key: str | Callable[..., str],
    fingerprint: bool | Callable[..., Any] = True,
    lease: float | None = None,
    retention: float | None = None,
    permanent: tuple[type[BaseException], ...] = (),
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Make a function run at most once to completion per idempotency key.

    ``key`` is a template over the function's arguments (``"charge:{order_id}"``) or a
    function of them. ``fingerprint`` guards against reusing a key with other arguments:
    True fingerprints all arguments (they must be JSON-serializable), a function picks
    what to fingerprint, False turns the check off. A repeated call returns the stored
    (JSON) result without running the function; see ``idemctl.errors`` for what it raises
    when the key is busy, mismatched or failed before.
    """

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        signature = inspect.signature(fn)
        opened: list[Store] = []

        def the_store() -> Store:
            if not isinstance(store, str):
                return store
            if not opened:
                from idemctl.stores import open_store

                opened.append(open_store(store))
            return opened[0]

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            k = key.format(**arguments) if isinstance(key, str) else key(*args, **kwargs)
            fp: str | None = None
            if fingerprint is True:
                fp = fingerprint_of(arguments)
            elif callable(fingerprint):
                fp = fingerprint_of(fingerprint(*args, **kwargs))
            result = run(
                the_store(),
                k,
                lambda _ctx: fn(*args, **kwargs),
                fingerprint=fp,
                lease=lease,
                retention=retention,
                permanent=permanent,
            )
            match result.outcome:
                case Outcome.EXECUTED | Outcome.REPLAYED:
                    value: T = result.result
                    return value
                case Outcome.BUSY:
                    raise KeyBusy(
                        f"key {k!r} is being processed by another worker; retry later",
                        result.record,
                    )
                case Outcome.MISMATCH:
                    raise FingerprintMismatch(
                        f"key {k!r} was used before with different arguments", result.record
                    )
                case Outcome.FAILED:
                    error = result.record.error if result.record else None
                    raise PreviouslyFailed(
                        f"key {k!r} failed permanently before: {error}", result.record
                    )
            assert result.error is not None
            raise result.error

        return wrapper

    return decorate
