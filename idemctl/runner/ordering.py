"""The sequence guard around a held key: ask before the handler runs, settle after.

An attempt that holds its key asks the store whether its event is newer than what the
entity applied (``guard_many``): stale events are not run and their key is completed with a
null result (a duplicate replays it), busy ones give their key back, and the rest hold the
entity until they settle. When the handler finished, the entity advances with the key's
completion: in one step where the store has one (``finish_many``: one transaction or
script), else the entity first, so a crash between the two leaves an entity that already
says "applied" and the redelivery comes back stale instead of running again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from idemctl.errors import LeaseLost
from idemctl.model import Acquired, Completion, Guard, GuardReply, Order, Settle, Verdict
from idemctl.runner.outcome import Outcome, RunResult

if TYPE_CHECKING:
    pass


def guard_of(a: Acquired, order: Order) -> Guard:
    return Guard(order.entity, order.sequence, a.key, a.fencing_token)


def settle_of(a: Acquired, order: Order, applied: bool = True) -> Settle:
    return Settle(order.entity, order.sequence, a.key, a.fencing_token, applied)


def missing_predecessor(order: Order, last: int | None) -> bool:
    """``--contiguous``: the event before this one (sequence - 1) is not applied yet.
    Sequences are taken to start at 1: an entity with nothing applied waits for it."""
    return order.sequence > (0 if last is None else last) + 1


def stale_completions(held: Sequence[tuple[Acquired, GuardReply]]) -> list[Completion]:
    """The completions, with a null result, of the keys whose guard said stale."""
    return [_completion(a) for a, r in held if r.verdict is Verdict.STALE]


def busy(held: Sequence[tuple[Acquired, GuardReply]]) -> list[tuple[Acquired, GuardReply]]:
    """The keys whose guard said busy: they are given back, not run."""
    return [(a, r) for a, r in held if r.verdict is Verdict.BUSY]


def not_run_results(
    held: Sequence[tuple[Acquired, GuardReply]], done: Sequence[bool], logger: logging.Logger
) -> list[RunResult]:
    """What ``not_run`` (``idemctl.runner.attempt``) returns, ``done`` answering
    ``stale_completions(held)``."""
    stale = [(a, r) for a, r in held if r.verdict is Verdict.STALE]
    results = {}
    for (a, reply), ok in zip(stale, done, strict=True):
        if not ok:  # the key was taken meanwhile: the entity says stale all the same
            logger.debug("stale key %s was taken before it completed", a.key)
        results[a.key] = RunResult(
            Outcome.STALE,
            a.key,
            attempt=a.attempt,
            fencing_token=a.fencing_token,
            last=reply.last,
        )
    for a, reply in busy(held):
        results[a.key] = RunResult(Outcome.BUSY, a.key, last=reply.last)
    return [results[a.key] for a, _ in held]


def _completion(a: Acquired) -> Completion:
    return Completion(a.key, a.owner, a.fencing_token, None)


def out_of_order(a: Acquired, order: Order) -> LeaseLost:
    return LeaseLost(
        f"result for {a.key!r} discarded: its hold on entity {order.entity!r} was taken "
        "before it finished (the handler ran past its lease; raise the lease or keep the "
        "heartbeat on)"
    )
