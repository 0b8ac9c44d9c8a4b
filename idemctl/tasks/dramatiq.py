"""dramatiq actors run effectively once, by a middleware.

    import dramatiq
    from idemctl.tasks.dramatiq import Idempotency

    broker.add_middleware(Idempotency())  # store: $IDEMCTL_STORE, or store=URL or a store

    @dramatiq.actor(idemctl_key="{order}", idemctl_lease=30)
    def charge(order: str, amount: int) -> None: ...

The middleware guards each actor declared with an ``idemctl_key`` (or ``idempotent=True``,
whose key is the actor's name and a fingerprint of its arguments), on the runner's engine
as ``idemctl.tasks.celery`` does: a repeat (a redelivery of a message its worker was killed
before acknowledging, a duplicate send) returns the stored result without running; a
killed worker's message, requeued by the broker, runs again only once its lease has
passed, as a takeover with a new fencing token (``idemctl.current_context()``); an
exception is recorded as a retriable failure and raised as it is, so dramatiq's Retries
middleware retries it (``max_retries``, ``retry_when``) and, after the last, dead-letters
it (a reused key with other arguments, ``FingerprintMismatch``, and a key failed for good,
``PreviouslyFailed``, at once: they are added to the actor's ``throws``); a copy that
finds its key held by a live attempt waits for its result
(``idemctl_wait``, 3600 s), then raises ``KeyBusy`` for Retries to try later. The options
are ``idemctl.tasks.TaskOptions``' as ``idemctl_<name>`` actor options.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from dramatiq import Middleware

from idemctl.errors import FingerprintMismatch, KeyBusy, PreviouslyFailed
from idemctl.runner.calls import answer
from idemctl.runner.outcome import Outcome
from idemctl.tasks.guard import TaskGuard, TaskOptions

OPTIONS = tuple(f.name for f in fields(TaskOptions) if f.name != "store")


class Idempotency(Middleware):
    """Guards the actors that ask for it (see the module's docstring); ``store``: a store
    or its URL for every guarded actor (None: ``$IDEMCTL_STORE``, else the embedded
    default)."""

    def __init__(self, store: Any = None) -> None:
        self.store = store

    @property
    def actor_options(self) -> set[str]:
        return {"idempotent", *(f"idemctl_{name}" for name in OPTIONS)}

    def after_declare_actor(self, broker: Any, actor: Any) -> None:
        given = actor.options
        if not (given.get("idempotent") or given.get("idemctl_key")):
            return
        options = TaskOptions(
            store=self.store,
            **{n: given[f"idemctl_{n}"] for n in OPTIONS if f"idemctl_{n}" in given},
        )
        fn: Callable[..., Any] = actor.fn
        keeper = TaskGuard("dramatiq", actor.actor_name, fn, options)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            result = keeper.result(fn, args, kwargs)
            if result.outcome is Outcome.BUSY:
                raise KeyBusy(
                    f"actor {actor.actor_name}: key {result.key!r} is held by another attempt"
                )
            return answer(result, None)

        actor.fn = guarded
        # Answers that a retry would only get again: the message fails (dead-lettered) at
        # once instead of through every retry's back-off.
        throws = actor.options.get("throws") or ()
        throws = throws if isinstance(throws, tuple) else (throws,)
        actor.options["throws"] = (*throws, FingerprintMismatch, PreviouslyFailed)
