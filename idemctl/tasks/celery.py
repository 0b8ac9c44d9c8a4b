"""Celery tasks run effectively once.

    from celery import Celery
    from idemctl.tasks.celery import IdempotentTask

    app = Celery("shop", broker="redis://127.0.0.1:6379/0")
    app.conf.task_acks_late = True  # at least once: a killed worker's task comes again
    app.conf.task_reject_on_worker_lost = True

    @app.task(base=IdempotentTask, idemctl_key="{order}")
    def charge(order: str, amount: int) -> dict: ...

or, keeping a task's own base, ``guard(task, key="{order}")`` after defining it.

Each run claims the task's key (``idemctl.tasks``: its name and a fingerprint of its
arguments by default) in the store of ``idemctl_store`` (None: ``$IDEMCTL_STORE``), with a
lease a heartbeat extends while the task runs, and stores its result when it returns:

- a redelivery of a finished task returns the stored result without running it (a
  Redis broker's visibility timeout, a retried ``apply_async``, a duplicate ``send``);
- a copy delivered while the first still runs (``acks_late`` with a visibility timeout
  shorter than the task) never runs beside it: it waits for the first's result and returns
  it (``idemctl_busy="wait"``, up to ``idemctl_wait`` seconds), or is re-queued to come
  again in ``idemctl_countdown`` seconds (``idemctl_busy="requeue"``, and at the wait's
  end), as ``self.retry`` does but not counted against the task's ``max_retries``;
- a task whose worker was SIGKILLed runs again only once its lease has passed, as a
  takeover with a new fencing token (``idemctl.current_context().fencing_token``), so a
  fenced write of the killed attempt's, should it still land, is refused;
- an exception is recorded as a retriable failure and raised to Celery as it is, so
  ``self.retry``, ``autoretry_for`` and ``max_retries`` work as they do; its exceptions in
  ``idemctl_permanent`` (and ``idemctl.Permanent``) fail the key for good. A soft time
  limit (``SoftTimeLimitExceeded``) is recorded and raised as ``HandlerTimeout``.

Options, as ``idemctl_<name>`` attributes or ``app.task`` keywords (``IdempotentTask``) or
keywords of ``guard``: those of ``idemctl.tasks.TaskOptions``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from celery import Task
from celery.exceptions import Retry, SoftTimeLimitExceeded

from idemctl.errors import HandlerTimeout, KeyBusy
from idemctl.runner.calls import answer
from idemctl.runner.outcome import Outcome
from idemctl.tasks.guard import TaskGuard, TaskOptions

T = TypeVar("T", bound=Task)
OPTIONS = tuple(f.name for f in fields(TaskOptions))


class IdempotentTask(Task):  # type: ignore[misc]  # celery ships no types
    """A Celery task base whose runs are effectively once (see the module's docstring)."""

    idemctl_store: Any = None
    idemctl_key: str | Callable[..., str] | None = None
    idemctl_lease: float | None = None
    idemctl_busy: str = "wait"
    idemctl_wait: float = 3600.0
    idemctl_countdown: float = 5.0
    idemctl_retention: float | None = None
    idemctl_max_attempts: int | None = None
    idemctl_permanent: tuple[type[BaseException], ...] = ()
    _idemctl: TaskGuard | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        guard = self._idemctl
        if guard is None:
            options = TaskOptions(**{name: getattr(self, f"idemctl_{name}") for name in OPTIONS})
            guard = self._idemctl = TaskGuard("celery", self.name, self.run, options)
        # A worker (or apply) pushed the task's request; task(...) in this process did not:
        # it is pushed here, as Celery's own __call__ does.
        direct = self.request.called_directly
        if direct:
            self.push_request(args=args, kwargs=kwargs)
        try:
            return _guarded(self, guard, self.run, args, kwargs)
        finally:
            if direct:
                self.pop_request()


def guard(task: T, **options: Any) -> T:
    """Guard a task defined with its own base: its runs become effectively once, with the
    ``TaskOptions`` given as keywords (``key="{order}"``). Call it where the task is
    defined, before the worker starts."""
    run = task.run
    keeper = TaskGuard("celery", task.name, run, TaskOptions(**options))

    def guarded(*args: Any, **kwargs: Any) -> Any:
        return _guarded(task, keeper, run, args, kwargs)

    task.run = guarded
    return task


def _guarded(
    task: Task,
    guard: TaskGuard,
    run: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    def body(*a: Any, **k: Any) -> Any:
        try:
            return run(*a, **k)
        except SoftTimeLimitExceeded as exc:
            raise HandlerTimeout(f"task {task.name} ran past its soft time limit") from exc

    result = guard.result(body, args, kwargs)
    if result.outcome is Outcome.BUSY:
        request = task.request
        if request.called_directly or request.is_eager:  # in this process: nowhere to queue
            raise KeyBusy(f"task {task.name}: key {result.key!r} is being run by another worker")
        # Another attempt holds the key (and waiting for it, if asked, ran out): this copy
        # comes back later, when the holder's result is there or its lease has passed. As
        # self.retry does, but not counted against the task's own max_retries.
        countdown = guard.options.countdown
        task.signature_from_request(
            request, args, kwargs, countdown=countdown, retries=request.retries
        ).apply_async()
        raise Retry(f"key {result.key!r} is held by another attempt", when=countdown)
    return answer(result, None)
