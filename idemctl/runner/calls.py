"""What ``@idempotent`` (sync and async alike) makes of a call: its key, fingerprint and
order from the arguments, and the function's answer (or error) from the run's result."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from idemctl.errors import ConfigError, FingerprintMismatch, KeyBusy, PreviouslyFailed, StaleEvent
from idemctl.model import Order, sequence_of
from idemctl.model import fingerprint as fingerprint_of
from idemctl.runner.outcome import Outcome, RunResult


def check_order(order_key: object, sequence: object) -> None:
    if (order_key is None) != (sequence is None):
        raise ConfigError("order_key and sequence go together: give both or neither")


class Calls:
    """What ``@idempotent`` makes of a call's arguments: its key, fingerprint and order."""

    def __init__(
        self,
        fn: Callable[..., Any],
        key: str | Callable[..., str],
        fingerprint: bool | Callable[..., Any],
        order_key: str | Callable[..., str] | None,
        sequence: str | Callable[..., Any] | None,
    ) -> None:
        self.signature = inspect.signature(fn)
        self.key, self.fingerprint = key, fingerprint
        self.order_key, self.sequence = order_key, sequence

    def of(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, str | None, Order | None]:
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        key = self.key
        k = key.format(**arguments) if isinstance(key, str) else key(*args, **kwargs)
        fp: str | None = None
        if self.fingerprint is True:
            fp = fingerprint_of(arguments)
        elif callable(self.fingerprint):
            fp = fingerprint_of(self.fingerprint(*args, **kwargs))
        order = None
        order_key, sequence = self.order_key, self.sequence
        if order_key is not None and sequence is not None:
            entity = (
                order_key.format(**arguments)
                if isinstance(order_key, str)
                else order_key(*args, **kwargs)
            )
            seq = arguments[sequence] if isinstance(sequence, str) else sequence(*args, **kwargs)
            order = Order(entity, sequence_of(seq))
        return k, fp, order


def answer(result: RunResult, order: Order | None) -> Any:
    """What the decorated function returns for ``result``, or the error it raises."""
    k = result.key
    match result.outcome:
        case Outcome.EXECUTED | Outcome.REPLAYED:
            return result.result
        case Outcome.BUSY:
            raise KeyBusy(
                f"key {k!r} is being processed by another worker; retry later", result.record
            )
        case Outcome.MISMATCH:
            raise FingerprintMismatch(
                f"key {k!r} was used before with different arguments", result.record
            )
        case Outcome.STALE:
            assert order is not None
            raise StaleEvent(
                f"entity {order.entity!r} applied sequence {result.last} already; "
                f"{k!r} (sequence {order.sequence}) did not run",
                result.record,
            )
        case Outcome.FAILED:
            error = result.record.error if result.record else None
            raise PreviouslyFailed(f"key {k!r} failed permanently before: {error}", result.record)
    assert result.error is not None
    raise result.error
