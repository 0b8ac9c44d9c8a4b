"""rq jobs run effectively once, by a decorator on the job's function.

    from rq import Queue, Retry
    from idemctl.tasks.rq import idempotent

    @idempotent(key="{order}", lease=30)  # store: $IDEMCTL_STORE, or store=URL
    def charge(order: str, amount: int) -> dict: ...

    queue.enqueue(charge, "order-1", 500, retry=Retry(max=3))

The decorated function is what rq imports and runs (its module and name are kept), so
it is enqueued as any function is. Each run claims its key (``idemctl.tasks``: the
function's dotted name and a fingerprint of its arguments by default) with a lease a
heartbeat extends while it runs, and stores its result, on the runner's engine:

- a job that runs again for a key already done (a duplicate enqueue, a job re-queued from
  the failed registry) returns the stored result without running;
- a job whose worker was SIGKILLed is found abandoned by a worker's maintenance once its
  execution's heartbeat has lapsed, and rq retries it if it has retries left (``Retry``),
  else moves it to the FailedJobRegistry; it runs again only past idemctl's lease, as a
  takeover with a new fencing token (``idemctl.current_context()``);
- an exception is recorded as a retriable failure and raised as it is, for rq's
  ``Retry`` to run the job again or to fail it into the FailedJobRegistry; rq's job
  timeout (``JobTimeoutException``) is recorded and raised as ``HandlerTimeout``;
- a copy that finds its key held by a live attempt waits for its result (``wait``,
  3600 s), then raises ``KeyBusy``: rq's ``Retry`` tries it again.

Called in the enqueuing process (not by a worker), the function is guarded the same way.
Options: those of ``idemctl.tasks.TaskOptions``, as keywords (``busy="requeue"`` raises
``KeyBusy`` at once, for ``Retry`` to bring the job back).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from rq.timeouts import JobTimeoutException

from idemctl.errors import HandlerTimeout, KeyBusy
from idemctl.runner.calls import answer
from idemctl.runner.outcome import Outcome
from idemctl.tasks.guard import TaskGuard, TaskOptions

F = TypeVar("F", bound=Callable[..., Any])


def idempotent(**options: Any) -> Callable[[F], F]:
    """Guard an rq job's function (see the module's docstring); ``options``: those of
    ``idemctl.tasks.TaskOptions``."""
    settings = TaskOptions(**options)

    def decorate(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"

        def body(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except JobTimeoutException as exc:
                raise HandlerTimeout(f"job {name} ran past its job timeout") from exc

        keeper = TaskGuard("rq", name, fn, settings)

        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            result = keeper.result(body, args, kwargs)
            if result.outcome is Outcome.BUSY:
                raise KeyBusy(f"job {name}: key {result.key!r} is held by another attempt")
            return answer(result, None)

        return guarded  # type: ignore[return-value]

    return decorate
