"""The error tree: every error idemctl raises derives from IdemctlError.

The CLI turns each branch into one exit code (see ``idemctl.exitcodes``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from idemctl.model import Record


class IdemctlError(Exception):
    """Root of every error idemctl raises on purpose."""


# Configuration -----------------------------------------------------------------


class ConfigError(IdemctlError):
    """A bad URL, an unknown scheme, an invalid option or config file."""


class OptionError(ConfigError):
    """An option, filter or cursor an operator action cannot take as given: ``option`` names
    what it means, as the parameter is called (``cursor``, ``key_header``); each front end
    spells it its own way (the CLI's ``--key-header``, the console's form field)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option, self.message = option, message


class MissingDriver(ConfigError):
    """The store's Python driver is not installed; the message names the extra."""


# Keys and payloads --------------------------------------------------------------


class InvalidKey(IdemctlError, ValueError):
    """An empty idempotency key, or one longer than 512 bytes."""


class InvalidPayload(IdemctlError, ValueError):
    """A payload or result that cannot be fingerprinted or stored as JSON."""


class InvalidCursor(IdemctlError, ValueError):
    """A ``scan`` cursor this store did not hand out."""


# Stores ------------------------------------------------------------------------------


class StoreError(IdemctlError):
    """The store could not do what was asked."""


class StoreUnavailable(StoreError):
    """The store cannot be reached or did not answer in time. Nothing was decided:
    callers must fail closed (not process, not commit) and try again later."""


class NotProvisioned(StoreError):
    """The store is reachable but its tables, indexes or scripts are missing.

    ``idemctl init`` provisions them."""


class NotPowertools(NotProvisioned):
    """A URL with ``layout=powertools`` names a table (or Redis database) that holds no
    Powertools records: another application's, or Powertools' read with the wrong key or
    attribute names. Nothing is read further, nothing written."""


class KeyNotFound(StoreError, KeyError):
    """No record under that key (or it is past retention)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"no record for key {self.key!r}"


class EntityNotFound(KeyNotFound):
    """No entity of the sequence guard under that name (or it is past retention)."""

    def __str__(self) -> str:
        return f"no entity {self.key!r}"


class Refused(StoreError):
    """The operation would be unsafe in the key's current state (a live lease, a
    completed key asked to unlock); pass force where the operation offers it."""

    def __init__(self, message: str, record: Record | None = None) -> None:
        super().__init__(message)
        self.record = record


class IncompleteTransaction(StoreError):
    """A transaction block acquired its key but ended without ``complete()``: rolled back."""


class LeaseLost(StoreError):
    """This owner no longer holds the key: its lease was taken over, released or
    unlocked, or the record is gone. Whatever the attempt produced must be discarded."""

    def __init__(self, message: str, record: Record | None = None) -> None:
        super().__init__(message)
        self.record = record


class StaleFence(LeaseLost):
    """A fenced write was refused: the resource already accepted a newer fencing token of
    the same key, so a later attempt took the key over and this one is a zombie. The runner
    treats it as a lost key: not retried, not dead-lettered, logged (``idemctl.fence``)."""

    def __init__(self, resource: str, key: str, token: int, last: int) -> None:
        super().__init__(
            f"fenced write to {resource} refused for key {key!r}: its token {token} is older "
            f"than {last}, which the resource accepted from a later attempt"
        )
        self.resource, self.key, self.token, self.last = resource, key, token, last


# Running work ---------------------------------------------------------------------------


class ProcessingError(IdemctlError):
    """Raised by ``@idempotent`` when the key cannot be processed now."""

    def __init__(self, message: str, record: Record | None = None) -> None:
        super().__init__(message)
        self.record = record


class KeyBusy(ProcessingError):
    """Another worker holds a live lease on the key: retry later."""


class StaleEvent(ProcessingError):
    """The sequence guard: the entity already applied this sequence or a later one, so
    the function did not run (``@idempotent(..., order_key=..., sequence=...)``)."""


class FingerprintMismatch(ProcessingError):
    """The key was used before with a different payload."""


class PreviouslyFailed(ProcessingError):
    """The key failed permanently before; it is not run again."""


class Permanent(Exception):
    """Raise from a handler (or wrap another exception) to fail the key without retries."""


class AttemptsExhausted(Permanent):
    """The key's handler ran ``max_attempts`` times already: it is failed for good
    instead of being run again."""


class HandlerTimeout(IdemctlError):
    """Raised inside a handler that ran past its soft time limit (``consume
    --handler-timeout``): the attempt counts as failed and is retried. A handler may catch
    it to clean up, and should let it go on."""

    def __init__(self, message: str = "the handler ran past its time limit") -> None:
        super().__init__(message)


class StuckHandlers(IdemctlError):
    """``idemctl consume`` stopped with handlers that did not return: SIGTERM's
    ``--drain-timeout`` passed, or more handlers passed their hard time limit than
    ``--max-abandoned`` allows. Their messages were left uncommitted; ``keys`` names them."""

    def __init__(self, message: str, keys: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.keys = keys


class ConsumeStopped(IdemctlError):
    """``idemctl consume`` stopped on purpose before a message it must not pass: a
    dead-letter storm (``--dlq-breaker``) or ``--on-missing-key stop``. Nothing past that
    message was committed."""


class ConsumeAborted(ConsumeStopped):
    """The consumer stopped on purpose (``--on-missing-key stop``); nothing past the message
    that stopped it was stored. (A dead letter the broker refuses does not stop it: the
    message's partition waits until the dead letter is written.)"""


class KafkaUnavailable(IdemctlError):
    """The Kafka brokers gave the consumer no partitions in time, or were lost for longer
    than ``--join-timeout`` under ``--exit-when-idle``. Nothing was committed past the
    messages already finished."""


class OutboxError(IdemctlError):
    """An outbox row that cannot be written: no open transaction to write it in, no
    outbox where the handler runs, or fields that are not what the table holds."""
