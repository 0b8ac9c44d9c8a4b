"""Background tasks run effectively once: each queue's door, in its own idiom, on the
runner's one engine (claim with a lease and a fencing token, a heartbeat while the task
runs, the result stored and handed to every redelivery).

- ``idemctl.tasks.celery``: ``IdempotentTask``, a Celery task base class, and ``guard``
  for tasks whose base you keep;
- ``idemctl.tasks.dramatiq``: ``Idempotency``, a dramatiq middleware;
- ``idemctl.tasks.rq``: ``idempotent``, a decorator on an rq job's function;
- ``idemctl.tasks.taskiq``: ``Idempotency``, a taskiq middleware (coroutine tasks on the
  async store and engine);
- ``idemctl.tasks.arq``: ``idempotent``, a wrapper around an arq job's coroutine.

A task's key is ``task:<queue>:<task name>#`` and a ``key`` template over its arguments
(``"{order}"``), or a fingerprint of them; the arguments are fingerprinted either way, so
a key reused with other arguments is refused (FingerprintMismatch) instead of replaying
another call's result. ``idemctl tasks`` (``idemctl.operate.tasks``) counts the keys by
queue and task; ``idemctl.metrics.register_tasks`` serves each worker's calls by queue,
task and outcome. Inside the task, ``idemctl.current_context()`` is the attempt: its
``fencing_token`` for writes the fence checks (``idemctl.fence``).

Importing this package loads no queue and no store driver.
"""

from __future__ import annotations

from idemctl.tasks.guard import TaskGuard, TaskOptions

__all__ = ["TaskGuard", "TaskOptions"]
