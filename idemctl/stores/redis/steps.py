# Written by scripts/unasync.py from idemctl/stores/redis/steps_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""The protocol's steps on Redis: each an operation of ``stores.redis.ops`` (its script
call, and what the replies come to) run on this store's client; on one server an entity
and its key finish in one script.

Written by scripts/unasync.py from ``idemctl.stores.redis.steps_async``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from idemctl.model import (
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Guard,
    GuardReply,
    Holder,
    Record,
    Settle,
)
from idemctl.stores.redis.core import RedisCore


class RedisSteps(RedisCore):
    """The claim/complete path and the sequence guard's steps, one script call each."""

    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        return self._do(self.ops.claim(requests, lease))

    def _complete(self, c: Completion, retention: float) -> Record:
        return self._do(self.ops.complete(c, retention))

    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]:
        return self._do(self.ops.complete_many(completions, self.retention_for(retention)))

    def finish_many(
        self,
        completions: Sequence[Completion],
        settles: Sequence[Settle],
        retention: float | None = None,
    ) -> list[bool]:
        """On one server, each entity and its key in one script (finish.lua): both or
        neither. A cluster keeps them on two nodes: the entities first, then the keys."""
        if self.cluster or not settles:
            return self._settle_then_complete(completions, settles, retention)
        finish, plain = self.ops.finish(completions, settles, self.retention_for(retention))
        finished = self._do(finish)
        if plain:
            answers = self.complete_many(plain, retention)
            finished.update(zip((c.key for c in plain), answers, strict=True))
        return [finished[c.key] for c in completions]

    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        return self._do(self.ops.fail(held, error, retriable, retention))

    def extend(
        self, key: str, owner: str, fencing_token: int, lease: float | None = None
    ) -> datetime:
        return self._do(self.ops.extend(key, owner, fencing_token, self.lease_for(lease)))

    def release(
        self, key: str, owner: str, fencing_token: int, *, handler_ran: bool = True
    ) -> Record:
        return self._do(self.ops.release(key, owner, fencing_token, handler_ran))

    def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        return self._do(self.ops.guard(guards, lease))

    def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        return self._do(self.ops.settle(settles, retention))
