"""The contract suite on both APIs: the same tests drive a sync store directly, or an async
one (``idemctl.aio``) through ``Blocking``, which runs each of its coroutines on an event
loop of its own; ``run`` is ``idemctl.run`` or ``await idemctl.aio.run`` to match, and a
handler's own SQL (transactional mode) is written once with ``after``."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any, TypeVar

from idemctl import aio
from idemctl.model import Status
from idemctl.runner import Context, RunResult
from idemctl.runner import run as run_sync
from idemctl.stores.base import Store
from tests.backends import Backend
from tests.polling import wait_until

T = TypeVar("T")
APIS = ("sync", "async")


class Blocking:
    """An AsyncStore used from sync code: every coroutine method is called on the loop's
    thread and waited for, so the suite's tests read the same on both APIs."""

    def __init__(self, store: aio.AsyncStore) -> None:
        self.store = store
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        return lambda *args, **kwargs: self.call(attr(*args, **kwargs))

    def close(self) -> None:
        try:
            self.call(self.store.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()

    def __enter__(self) -> Blocking:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def on_api(backend: Backend, api: str) -> Backend:
    """``backend`` opened through ``api``."""
    if api == "sync":
        return backend
    open_async = backend.open_async or (lambda: aio.wrap(backend.open()))
    return replace(backend, api=api, open=lambda: Blocking(open_async()))  # type: ignore[arg-type,return-value]


def opened(url: str, api: str) -> Store:
    """The store at ``url`` through ``api`` (in a race's worker process)."""
    from idemctl.stores import open_store

    store = open_store(url)
    return store if api == "sync" else Blocking(aio.wrap(store))  # type: ignore[return-value]


def run(store: Any, key: str, handler: Callable[[Context], Any], **options: Any) -> RunResult:
    """``idemctl.run`` on a sync store; ``idemctl.aio.run`` (with an async handler that
    calls ``handler``) on a Blocking one."""
    if not isinstance(store, Blocking):
        return run_sync(store, key, handler, **options)

    async def handle(ctx: Context) -> Any:
        value = handler(ctx)
        return await value if inspect.isawaitable(value) else value

    return store.call(aio.run(store.store, key, handle, **options))


def after(steps: Sequence[Any], finish: Callable[[], T]) -> Any:
    """What a handler written once for both APIs returns: ``finish()`` (its value, or the
    exception it raises) once ``steps`` are done. Statements on a sync connection, and
    outbox rows added on one, are done when called; on an async connection they are
    coroutines, awaited here in order (``run`` awaits what the handler returns)."""
    if not any(inspect.isawaitable(step) for step in steps):
        return finish()

    async def in_order() -> T:
        for step in steps:
            await step
        return finish()

    return in_order()


def counts(store: Any) -> Any:
    """``store.stats()`` as every record counts, where the store's own counts are
    approximate (DynamoDB's item count): there its exact in-progress part must agree with
    a scan's, and the scan's counts are returned."""
    stats = store.stats()
    if stats.counted_by != "approximate":
        return stats
    exact = store.stats(exact=True)
    in_progress = ("stale", "released", "oldest_in_progress")
    assert {f: getattr(stats, f) for f in in_progress} == {
        f: getattr(exact, f) for f in in_progress
    }
    assert stats.by_status[Status.IN_PROGRESS] == exact.by_status[Status.IN_PROGRESS]
    return exact


def waiting(
    store: Any,
    key: str,
    wait: float = 60,
    handler: Callable[[Any], Any] | None = None,
    **options: Any,
) -> tuple[Future[RunResult], list[str]]:
    """``run(..., wait=, **options)`` in a thread, returned once the store's watch has
    registered the key (a settle from then on wakes it), and the keys its handler ran."""
    ran: list[str] = []

    def handle(ctx: Any) -> Any:
        ran.append(ctx.key)
        return handler(ctx) if handler else {"ran": "waiter"}

    future: Future[RunResult] = Future()

    def call() -> None:
        try:
            future.set_result(run(store, key, handle, wait=wait, **options))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=call, daemon=True).start()

    def registered() -> bool:
        assert not future.done(), future.result()
        return key in store.watch().waited

    wait_until(registered, "the waiter registered", interval=0.005)
    return future, ran
