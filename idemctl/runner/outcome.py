"""One vocabulary for what running a key came to, for one message and for a batch."""

from __future__ import annotations

import json
import logging
from enum import StrEnum
from typing import Any, NamedTuple

from idemctl.errors import AttemptsExhausted, LeaseLost, OutboxError, Permanent, StaleFence
from idemctl.frozen import frozen
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
)

MAX_ERROR_CHARS = 4000
NEVER_RETRIED: tuple[type[BaseException], ...] = (Permanent, OutboxError)
"""Failures that would come back the same on every retry: the key fails for good. An
OutboxError is a handler writing events where they cannot commit with the key, or events
that cannot be stored."""


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
    STALE = "stale"
    """The sequence guard: the entity already applied this event's sequence or a later
    one, so the handler did not run (the key is completed with a null result)."""


class Step(StrEnum):
    """Where a key of a ``Batch`` stands between its steps: what only a Batch answers
    (``run()`` settles every key in one call, and answers an ``Outcome``)."""

    HELD = "held"
    """Batch.claim: this batch holds the key now; run it (Batch.run) or give it back."""
    RAN = "ran"
    """Batch.run: the handler returned and its completion is on its way; Batch.complete_all
    tells how it ended (executed, lease_lost or unavailable)."""
    RELEASED = "released"
    """Batch.give_back: claimed but not run, given back for the next delivery."""
    UNAVAILABLE = "unavailable"
    """The store did not answer: nothing is decided, the key must come round again."""


class RunResult(NamedTuple):
    """What running a key came to (a named tuple: consume makes three per message)."""

    outcome: Outcome | Step
    """An ``Outcome``; a ``Step`` only in a ``Batch``'s answers."""
    key: str
    result: JSON = None
    record: Record | None = None
    error: BaseException | None = None
    attempt: int | None = None
    fencing_token: int | None = None
    retriable: bool = False
    last: int | None = None
    """With an order: the entity's last applied sequence when the guard answered."""


class Rollback(Exception):
    """Raised inside a store transaction to roll it back, the claim with it (the handler
    failed, or the HTTP response is not to be stored); ``value`` rides out with it."""

    def __init__(self, value: Any = None) -> None:
        super().__init__()
        self.value = value


def not_acquired(key: str, outcome: ClaimOutcome) -> RunResult:
    """What a claim that did not acquire its key comes to."""
    match outcome:
        case Completed(record):
            return RunResult(Outcome.REPLAYED, key, record.result, record)
        case Busy(record):
            return RunResult(Outcome.BUSY, key, record=record)
        case Mismatch(record):
            return RunResult(Outcome.MISMATCH, key, record=record)
        case Failed(record):
            return RunResult(Outcome.FAILED, key, record=record)
    raise AssertionError(f"not a claim outcome that acquired nothing: {outcome!r}")


def exhausted(acquired: Acquired, max_attempts: int | None) -> bool:
    """The claim is past ``max_attempts`` runs: the handler must not run again."""
    return max_attempts is not None and acquired.attempt > max_attempts


def last_attempt(acquired: Acquired, max_attempts: int | None) -> bool:
    return max_attempts is not None and acquired.attempt >= max_attempts


def exhausted_error(acquired: Acquired, max_attempts: int | None) -> AttemptsExhausted:
    return AttemptsExhausted(
        f"key {acquired.key!r} ran {max_attempts} time(s) already (max_attempts): not run again"
    )


def stored_form(value: Any) -> JSON:
    """``value`` as the store gives it back (its canonical JSON, parsed): what every run of
    a key returns, the first included. InvalidPayload when it is not JSON."""
    if value is None or type(value) in (bool, int):  # already their own stored form
        return value
    return json.loads(canonical_json(value))


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


@frozen
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


def fence_refused(a: Acquired, stale: StaleFence, logger: logging.Logger) -> StaleFence:
    """A fenced write of the attempt holding ``a`` was refused: a later attempt took the key
    over. Logged; the attempt ends as LEASE_LOST (not retried, not failed, not dead-lettered:
    the key is the later attempt's)."""
    logger.warning(
        "%s; attempt %d (token %d) ends here",
        stale,
        a.attempt,
        a.fencing_token,
        extra={"idemctl": {"key": a.key, "outcome": "fence_refused"}},
    )
    return stale
