"""arq jobs run effectively once, by a wrapper around the job's coroutine.

    from idemctl.tasks.arq import idempotent

    @idempotent(key="{order}", lease=30)  # store: $IDEMCTL_STORE, or store=URL
    async def charge(ctx: dict, order: str, amount: int) -> dict: ...

    class WorkerSettings:
        functions = [charge]

The wrapped coroutine keeps the job's name (``charge``) and its ``ctx`` first argument;
its key is ``idemctl.tasks``' over the arguments after ``ctx`` (by default the function's
name and a fingerprint of them). Each run claims the key with a lease a heartbeat extends
while it runs, and stores its result, on the runner's async engine:

- a job that runs again for a key already done (the same order enqueued twice under two
  job ids, a job re-run after its worker died past its completion) returns the stored
  result without running;
- a job whose worker was SIGKILLed is run again by arq once its in-progress marker has
  expired (the job's timeout plus 10 s); it runs only past idemctl's lease, as a takeover
  with a new fencing token (``idemctl.current_context()``);
- an exception is recorded as a retriable failure and raised as it is: arq fails the job,
  or, for arq's ``Retry``, runs it again after its ``defer``, each run claiming the key
  again, up to the job's ``max_tries``;
- a copy that finds its key held by a live attempt waits for its result (``wait``,
  3600 s), then raises arq's ``Retry(defer=countdown)``, to come back (counted in arq's
  ``max_tries``, as every arq retry is);
- arq's ``job_timeout`` cancels the coroutine: the key is left to its lease, as a killed
  worker's is.

arq 0.28 requires redis-py below 6, idemctl's Redis store 7.3 or later: in one
environment, use arq with the SQLite, PostgreSQL or DynamoDB store. Options: those of
``idemctl.tasks.TaskOptions``, as keywords.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from arq import Retry

from idemctl.runner.calls import answer
from idemctl.runner.outcome import Outcome
from idemctl.tasks.guard import TaskGuard, TaskOptions

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def idempotent(**options: Any) -> Callable[[F], F]:
    """Guard an arq job's coroutine function (see the module's docstring); ``options``:
    those of ``idemctl.tasks.TaskOptions``."""
    settings = TaskOptions(**options)

    def decorate(fn: F) -> F:
        signature = inspect.signature(fn)
        if not inspect.iscoroutinefunction(fn) or not signature.parameters:
            raise TypeError(f"{fn.__qualname__}: an arq job is `async def job(ctx, ...)`")

        def arguments(*args: Any, **kwargs: Any) -> None:  # the job's own, after ctx
            raise AssertionError("only its signature is used")

        arguments.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=list(signature.parameters.values())[1:]
        )
        keeper = TaskGuard("arq", fn.__qualname__, arguments, settings)

        @functools.wraps(fn)
        async def guarded(ctx: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            result = await keeper.aresult(functools.partial(fn, ctx), args, kwargs)
            if result.outcome is Outcome.BUSY:
                raise Retry(defer=settings.countdown)
            return answer(result, None)

        return guarded  # type: ignore[return-value]

    return decorate
