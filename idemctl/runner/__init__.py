"""Attempts at keys: claim -> handler -> complete or fail, for one key (``run``,
``@idempotent``; ``attempt`` is written from ``idemctl.aio.attempt`` by scripts/unasync.py)
and for a round of keys held together (``Batch``, what consume runs on)."""

from idemctl.runner.attempt import invoke, run
from idemctl.runner.batch import Batch
from idemctl.runner.context import NO_OUTBOX, Context, current_context
from idemctl.runner.decorator import idempotent
from idemctl.runner.heartbeat import Heartbeat
from idemctl.runner.outcome import NEVER_RETRIED, Invocation, Outcome, RunResult, Step, stored_form

__all__ = [
    "NEVER_RETRIED",
    "NO_OUTBOX",
    "Batch",
    "Context",
    "Heartbeat",
    "Invocation",
    "Outcome",
    "RunResult",
    "Step",
    "current_context",
    "idempotent",
    "invoke",
    "run",
    "stored_form",
]
