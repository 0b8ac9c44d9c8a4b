"""What a handler may know about the attempt running it, and how it is handed over."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from idemctl.errors import HandlerTimeout
from idemctl.frozen import frozen
from idemctl.outbox.rows import NoOutbox

if TYPE_CHECKING:
    from idemctl.aio.outbox import AsyncOutbox
    from idemctl.fence import Fence
    from idemctl.model import Acquired, Order
    from idemctl.outbox.writer import Outbox
    from idemctl.stores.base import Store
    from idemctl.stores.base_async import AsyncStore

NO_OUTBOX = NoOutbox(
    "ctx.outbox needs the PostgreSQL store in transactional mode (consume --transactional, "
    "run(..., transactional=True)): elsewhere its rows could not commit with the key"
)
"""``ctx.outbox`` outside transactional mode: one for every context, it only says why."""


@frozen
class Context:
    """What a handler may know about the attempt running it."""

    key: str
    fencing_token: int
    """Pass it to your own writes so a zombie attempt's writes can be refused."""
    attempt: int
    takeover: bool
    """A previous attempt on this key never finished and may have done part of the work."""
    owner: str
    store: Store | AsyncStore
    """The store the attempt runs on: an ``AsyncStore`` under ``idemctl.aio``."""
    logger: logging.Logger
    connection: Any = None
    """In PostgreSQL transactional mode: the psycopg connection whose open transaction holds
    the key. Write your effects on it; they commit together with the key, or not at all."""
    outbox: Outbox | AsyncOutbox | NoOutbox = NO_OUTBOX
    """In PostgreSQL transactional mode: ``ctx.outbox.add(aggregatetype, aggregateid, type,
    payload, headers=None)`` writes an event that commits with the key and the effects;
    ``idemctl outbox relay`` publishes it (under ``idemctl.aio``, ``await ctx.outbox.add``).
    Elsewhere ``add`` raises OutboxError."""
    order: Order | None = None
    """With the sequence guard: the entity and this event's sequence, which the guard let
    through (write the sequence into your own rows if you keep it there too)."""

    @classmethod
    def held(
        cls,
        a: Acquired,
        store: Store | AsyncStore,
        logger: logging.Logger,
        connection: Any = None,
        outbox: Outbox | AsyncOutbox | NoOutbox = NO_OUTBOX,
        order: Order | None = None,
    ) -> Context:
        """The context of the attempt that holds ``a``."""
        return cls(
            a.key,
            a.fencing_token,
            a.attempt,
            a.takeover,
            a.owner,
            store,
            logger,
            connection,
            outbox,
            order,
        )

    @property
    def fence(self) -> Fence:
        """The key and fencing token, as the fenced writes of ``idemctl.fence`` take them."""
        from idemctl.fence import Fence

        return Fence(self.key, self.fencing_token)

    @property
    def sequence(self) -> int | None:
        """The event's sequence under the guard, else None."""
        return None if self.order is None else self.order.sequence


_current: contextvars.ContextVar[Context] = contextvars.ContextVar("idemctl_context")


def current_context() -> Context:
    """The Context of the handler running in this thread (inside ``@idempotent`` or ``run``)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "current_context() is only available inside an idempotent handler"
        ) from None


Handler = Callable[[Context], Any]
"""A handler: ``def handler(ctx) -> JSON``."""


def call_handler(ctx: Context, handler: Handler, timeout: float | None = None) -> Any:
    """Run the handler with ``current_context()`` set to ``ctx``, in a copy of this context
    (``idemctl.aio.context.call_handler`` is its async counterpart); past ``timeout``
    seconds, HandlerTimeout is raised in it (``idemctl.runner.limits``)."""

    def call() -> Any:
        _current.set(ctx)
        return handler(ctx)

    if timeout is None:
        return contextvars.copy_context().run(call)
    from idemctl.runner.limits import DEADLINES

    armed = DEADLINES.arm(timeout)
    try:
        return contextvars.copy_context().run(call)
    except HandlerTimeout:
        if not armed.fired:
            raise  # the handler's own
        raise HandlerTimeout(timed_out(timeout)) from None
    finally:
        DEADLINES.disarm(armed)


def timed_out(timeout: float) -> str:
    from idemctl.durations import format_duration

    return f"the handler ran past its timeout of {format_duration(timeout)}"


@contextmanager
def entered(ctx: Context) -> Iterator[None]:
    """``current_context()`` is ``ctx`` inside the block: for a coroutine, whose task has a
    context of its own."""
    token = _current.set(ctx)
    try:
        yield
    finally:
        _current.reset(token)
