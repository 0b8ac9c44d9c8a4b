"""``@idempotent``: a plain function made to run at most once to completion per key."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from idemctl.errors import FingerprintMismatch, KeyBusy, PreviouslyFailed
from idemctl.model import fingerprint as fingerprint_of
from idemctl.runner.outcome import Outcome
from idemctl.runner.single import run
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
