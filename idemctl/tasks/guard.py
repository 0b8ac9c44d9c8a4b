"""What every queue's door shares: a task call's key and fingerprint, its store, and the
run on the runner's engine, whose answer the door maps to its queue's own ways (a retry,
a failure, the stored result)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from idemctl.errors import ConfigError
from idemctl.model import fingerprint as fingerprint_of
from idemctl.runner.attempt import run
from idemctl.runner.calls import Calls
from idemctl.runner.outcome import Outcome, RunResult
from idemctl.tasks.stats import STATS

if TYPE_CHECKING:
    from idemctl.stores.base import Store
    from idemctl.stores.base_async import AsyncStore

BUSY = ("wait", "requeue")
OUTCOME: dict[str, str] = {
    Outcome.EXECUTED: "new",
    Outcome.REPLAYED: "replayed",
    Outcome.ERROR: "error",
    Outcome.BUSY: "busy",
    Outcome.MISMATCH: "mismatch",
    Outcome.LEASE_LOST: "lease_lost",
}
"""The runner's outcomes as ``idemctl.tasks.stats`` counts them; the rest (a key failed for
good, its attempts exhausted) are ``failed``."""


@dataclass(frozen=True)
class TaskOptions:
    """How a task is guarded (each queue's door takes them as keyword arguments)."""

    store: str | Store | AsyncStore | None = None
    """A store, or its URL (None: ``$IDEMCTL_STORE``, else the embedded SQLite default),
    opened on the first call in each worker process (an async store for an async task's
    door, taskiq's, which wraps a sync one given)."""
    key: str | Callable[..., str] | None = None
    """A template over the task's arguments (``"{order}"``) or a function of them, or None
    for the fingerprint of the arguments: the key after ``task:<queue>:<task name>#``."""
    lease: float | None = None
    """Seconds a claim holds without a heartbeat (a killed worker's task runs again past
    it); None: the store's default. The heartbeat extends it while the task runs."""
    busy: str = "wait"
    """A copy that finds its key held by a live attempt (a redelivery while the first copy
    runs): ``wait`` for the holder's result (then return it, or run if the holder failed
    or was killed), up to ``wait`` seconds, then re-queue; ``requeue`` at once, to run
    again in ``countdown`` seconds."""
    wait: float = 3600.0
    countdown: float = 5.0
    retention: float | None = None
    """Seconds a completed key's result is kept (None: the store's default)."""
    max_attempts: int | None = None
    """Runs of the task's key before its failure is final, counted in the store across
    workers and redeliveries (None: the queue's own retries decide)."""
    permanent: tuple[type[BaseException], ...] = ()
    """Exceptions that fail the key for good: a redelivery raises PreviouslyFailed."""

    def __post_init__(self) -> None:
        if self.busy not in BUSY:
            raise ConfigError(f"busy={self.busy!r}: use one of {', '.join(BUSY)}")
        if self.wait < 0 or self.countdown < 0:
            raise ConfigError("wait and countdown are seconds, 0 or more")


class TaskGuard:
    """One task's guard: ``result(fn, args, kwargs)`` runs ``fn`` at most once to completion
    for the call's key and answers the runner's RunResult (the door maps it).

    Its keys are ``task:<queue>:<task name>#<key>``, so that operators see a queue's and a
    task's keys together (``idemctl tasks``, ``idemctl list --prefix task:celery:``) and
    two tasks' keys never meet; ``<key>`` is the ``key`` template's, else the fingerprint
    of the arguments."""

    def __init__(self, queue: str, name: str, fn: Callable[..., Any], options: TaskOptions) -> None:
        self.queue, self.name, self.options = queue, name, options
        self.prefix = f"task:{queue}:{name}#"
        self._calls = Calls(fn, options.key or _unused, True, None, None)
        self._store: Store | None = None
        self._astore: AsyncStore | None = None
        self._pid = 0
        self._apid = 0
        self._aloop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        """The loop ``_astore`` was opened on: a reference, not its id(), which a loop made
        after that one ended may be given again."""
        self._lock = threading.Lock()

    def key_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str | None]:
        """The call's key and the fingerprint of its arguments."""
        fp: str | None
        if self.options.key is None:
            bound = self._calls.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            fp = fingerprint_of(bound.arguments)
            return self.prefix + fp, fp
        key, fp, _ = self._calls.of(args, kwargs)
        return self.prefix + key, fp

    def store(self) -> Store:
        """The store, opened once per process (a forked worker child opens its own: a
        connection is not shared across fork)."""
        given = self.options.store
        if given is not None and not isinstance(given, str):
            return given  # type: ignore[return-value]  # an AsyncStore is the async door's
        with self._lock:
            if self._store is None or self._pid != os.getpid():
                from idemctl.stores import open_store

                self._store = open_store(self._url())
                self._pid = os.getpid()
            return self._store

    def astore(self) -> AsyncStore:
        """The async store, opened once per process and event loop (an asyncio client's
        connections belong to the loop that made them); a sync store given is wrapped
        (worker threads, or the backend's asyncio half)."""
        from idemctl.aio.opening import open_store, wrap
        from idemctl.stores.base_async import AsyncStore

        given = self.options.store
        if isinstance(given, AsyncStore):
            return given
        loop = asyncio.get_running_loop()
        with self._lock:
            made_here = self._aloop is not None and self._aloop() is loop
            if self._astore is None or self._apid != os.getpid() or not made_here:
                self._astore = (
                    open_store(self._url())
                    if given is None or isinstance(given, str)
                    else wrap(given)
                )
                self._apid, self._aloop = os.getpid(), weakref.ref(loop)
            return self._astore

    def _url(self) -> str:
        from idemctl.stores import DEFAULT_URL

        given = self.options.store
        return (
            (given if isinstance(given, str) else None)
            or os.environ.get("IDEMCTL_STORE")
            or DEFAULT_URL
        )

    def result(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RunResult:
        """Run ``fn(*args, **kwargs)`` for the call's key; a key held by a live attempt is
        waited for (``options.wait`` seconds) unless ``options.busy`` is ``requeue``."""
        key, fp = self.key_of(args, kwargs)
        return run(
            self.store(), key, lambda _ctx: fn(*args, **kwargs), fingerprint=fp, **self._run()
        )

    async def aresult(
        self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> RunResult:
        """``result`` for a coroutine function, on the async store and engine."""
        from idemctl.aio.attempt import run as arun

        key, fp = self.key_of(args, kwargs)
        started = time.monotonic()
        result = await arun(
            self.astore(), key, lambda _ctx: fn(*args, **kwargs), fingerprint=fp, **self._run()
        )
        self._count(result, started)
        return result

    def _count(self, result: RunResult, started: float) -> None:
        outcome = OUTCOME.get(result.outcome, "failed")
        STATS.count(self.queue, self.name, outcome, time.monotonic() - started)

    def _run(self) -> dict[str, Any]:
        o = self.options
        return {
            "lease": o.lease,
            "retention": o.retention,
            "permanent": o.permanent,
            "max_attempts": o.max_attempts,
            "wait": o.wait if o.busy == "wait" and o.wait > 0 else None,
        }


def _unused(*args: Any, **kwargs: Any) -> str:  # the default key is TaskGuard.key_of's
    raise AssertionError("unreachable")
