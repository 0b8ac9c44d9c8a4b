"""``@idempotent``: a plain function made to run at most once to completion per key."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemctl.errors import ConfigError, FingerprintMismatch, KeyBusy, PreviouslyFailed, StaleEvent
from idemctl.model import Order, sequence_of
from idemctl.model import fingerprint as fingerprint_of
from idemctl.runner.attempt import run
from idemctl.runner.outcome import Outcome, RunResult
from idemctl.stores import open_store

if TYPE_CHECKING:
    from idemctl.stores.base import Store

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
    order_key: str | Callable[..., str] | None = None,
    sequence: str | Callable[..., Any] | None = None,
    timeout: float | None = None,
    wait: float | None = None,
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Make a function run at most once to completion per idempotency key.

    ``key`` is a template over the function's arguments (``"charge:{order_id}"``) or a
    function of them. ``fingerprint`` guards against reusing a key with other arguments:
    True fingerprints all arguments (they must be JSON-serializable), a function picks
    what to fingerprint, False turns the check off. A repeated call returns the stored
    (JSON) result without running the function; see ``idemctl.errors`` for what it raises
    when the key is busy, mismatched or failed before.

    ``order_key`` (a template or function like ``key``: the entity) and ``sequence`` (the
    name of the argument holding it, or a function of the arguments) add the sequence
    guard: a call whose sequence is not above the entity's last applied one does not run
    and raises StaleEvent. Sequences are whole numbers or ISO 8601 timestamps.

    ``timeout`` (seconds): past it, HandlerTimeout is raised inside the function (at its
    next bytecode; a blocking C call sees it when it returns) and propagates from the call;
    the key is failed as retriable, so the next call runs it again.

    ``wait`` (seconds): a call that finds its key in flight waits up to ``wait`` for the
    holder instead of raising KeyBusy at once: it returns the holder's result, or runs the
    function itself if the holder failed, let go or lost its lease; KeyBusy at the deadline.
    """
    check_order(order_key, sequence)

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        call = Calls(fn, key, fingerprint, order_key, sequence)
        opened: list[Store] = []

        def the_store() -> Store:
            if not isinstance(store, str):
                return store
            if not opened:
                opened.append(open_store(store))
            return opened[0]

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            k, fp, order = call.of(args, kwargs)
            result = run(
                the_store(),
                k,
                lambda _ctx: fn(*args, **kwargs),
                fingerprint=fp,
                lease=lease,
                retention=retention,
                permanent=permanent,
                timeout=timeout,
                order=order,
                wait=wait,
            )
            value: T = answer(result, order)
            return value

        return wrapper

    return decorate


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
