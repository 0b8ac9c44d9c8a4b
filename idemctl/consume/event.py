"""What a handler receives, and how a handler is found from ``module:function``."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

from idemctl.errors import ConfigError
from idemctl.frozen import frozen
from idemctl.runner import Context


@frozen
class Event:
    """One Kafka record, as a handler sees it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    """The Kafka record key (not the idempotency key: that is ``ctx.key``)."""
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=tuple)
    timestamp: int | None = None
    """Milliseconds since the epoch, as the producer or broker set it."""

    def json(self) -> Any:
        """The value parsed as JSON."""
        return None if self.value is None else json.loads(self.value)

    def header(self, name: str) -> bytes | None:
        """The last value of header ``name``, or None."""
        found = [v for k, v in self.headers if k == name]
        return found[-1] if found else None


Handler = Callable[[Event, Context], Any]


def load_handler(path: str) -> Handler:
    """``module:function`` as a handler taking ``(event, ctx)``. The function may take
    ``(event)`` or ``(event, ctx)``, and may be ``async``."""
    module_name, _, name = path.partition(":")
    if not module_name or not name:
        raise ConfigError(
            f"handler {path!r} is not module:function (e.g. examples.payments:charge)"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import handler module {module_name!r}: {exc} "
            "(is it on PYTHONPATH, or run from its directory?)"
        ) from None
    fn = module
    for part in name.split("."):
        fn = getattr(fn, part, None)  # type: ignore[assignment]
        if fn is None:
            raise ConfigError(f"module {module_name!r} has no {name!r} (handler {path!r})")
    if not callable(fn):
        raise ConfigError(f"handler {path!r} is not callable")
    return adapt(fn, path)


def adapt(fn: Callable[..., Any], name: str | None = None) -> Handler:
    """Call ``fn`` as ``fn(event)`` or ``fn(event, ctx)``; run it to completion if async.
    ConfigError (naming it ``name``) when it can be called neither way."""
    takes_ctx = _takes_ctx(fn, name or str(getattr(fn, "__qualname__", fn)))
    is_async = inspect.iscoroutinefunction(fn)

    def call(event: Event, ctx: Context) -> Any:
        result = fn(event, ctx) if takes_ctx else fn(event)
        return asyncio.run(result) if is_async else result

    return call


def _takes_ctx(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes ``(event, ctx)`` rather than ``(event)``; checked before the first
    message, so a handler that cannot take either never claims a key."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return False  # a builtin without a signature: called with the event alone
    for args, takes in (((None, None), True), ((None,), False)):
        try:
            signature.bind(*args)
        except TypeError:
            continue
        return takes
    raise ConfigError(f"handler {name!r} takes {signature}: it must take (event) or (event, ctx)")
