"""taskiq tasks run effectively once, by a middleware.

    from taskiq_redis import RedisStreamBroker
    from idemctl.tasks.taskiq import Idempotency

    broker = RedisStreamBroker(url).with_middlewares(Idempotency())  # store: $IDEMCTL_STORE

    @broker.task(idemctl_key="{order}", idemctl_lease=30)
    async def charge(order: str, amount: int) -> dict: ...

The middleware guards each task declared with an ``idemctl_key`` label (or
``idempotent=True``, whose key is the task's name and a fingerprint of its arguments) when
the worker starts, on the runner's engine as the other queues' doors do: a coroutine task
on the async store (``idemctl.aio``), a plain function, which taskiq runs in a thread, on
the sync one. A repeat (a message redelivered because its worker died before
acknowledging it, a duplicate ``kiq``) returns the stored result without running; a
killed worker's message, claimed again by another consumer once it has been idle past the
broker's ``idle_timeout`` (taskiq-redis' stream broker), runs again only past idemctl's
lease, as a takeover with a new fencing token (``idemctl.current_context()``); an
exception is recorded as a retriable failure and raised as it is, so the task's result is
an error and taskiq's retry middlewares (``retry_on_error``, ``max_retries``) retry it; a
copy that finds its key held by a live attempt waits for its result (``idemctl_wait``,
3600 s), then raises ``KeyBusy``. The options are ``idemctl.tasks.TaskOptions``' as
``idemctl_<name>`` labels; the middleware reads them from the task as declared in the
worker, as taskiq's retry middleware reads ``types_of_exceptions``, so exception types and
key functions are allowed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from taskiq import TaskiqMiddleware

from idemctl.errors import KeyBusy
from idemctl.runner.calls import answer
from idemctl.runner.outcome import Outcome, RunResult
from idemctl.tasks.guard import TaskGuard, TaskOptions

OPTIONS = tuple(f.name for f in fields(TaskOptions) if f.name != "store")


class Idempotency(TaskiqMiddleware):
    """Guards the tasks that ask for it (see the module's docstring); ``store``: a store,
    an async store or a URL for every guarded task (None: ``$IDEMCTL_STORE``, else the
    embedded default)."""

    def __init__(self, store: Any = None) -> None:
        super().__init__()
        self.store = store

    def startup(self) -> None:
        for task in self.broker.get_all_tasks().values():
            labels = task.labels
            if getattr(task.original_func, "idemctl", None) is not None:
                continue  # guarded already (a broker started twice in one process)
            if labels.get("idempotent") or labels.get("idemctl_key"):
                task.original_func = _guarded(
                    task.task_name, task.original_func, labels, self.store
                )


def _guarded(
    name: str, fn: Callable[..., Any], labels: dict[str, Any], store: Any
) -> Callable[..., Any]:
    options = TaskOptions(
        store=store, **{n: labels[f"idemctl_{n}"] for n in OPTIONS if f"idemctl_{n}" in labels}
    )
    keeper = TaskGuard("taskiq", name, fn, options)

    def answered(result: RunResult) -> Any:
        if result.outcome is Outcome.BUSY:
            raise KeyBusy(f"task {name}: key {result.key!r} is held by another attempt")
        return answer(result, None)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            return answered(await keeper.aresult(fn, args, kwargs))

    else:

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            return answered(keeper.result(fn, args, kwargs))

    guarded.idemctl = keeper  # type: ignore[attr-defined]
    return guarded
