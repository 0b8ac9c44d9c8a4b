# Written by scripts/unasync.py from idemctl/stores/front_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""What every store's claim/complete path shares, before its own steps: the caller's
arguments checked (keys, entities, sequences, leases and retentions in their ranges), and
the sequence guard's finish in two round trips for a store without one of its own.

This module is the original of ``idemctl.stores.front`` (scripts/unasync.py): ``BaseStore``
stands on that one, ``Store`` on this one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from idemctl.model import (
    JSON,
    ClaimOutcome,
    ClaimRequest,
    Completion,
    Guard,
    GuardReply,
    Holder,
    Record,
    Settle,
)
from idemctl.stores.limits import check_claims, check_guards, checked


class Front(ABC):
    """The protocol's calls as a caller makes them, on the store's own steps (the methods
    whose names begin with ``_``), which take checked arguments in seconds."""

    default_lease: float
    default_retention: float

    def lease_for(self, lease: float | None) -> float:
        """The lease in seconds that an operation given ``lease`` uses: the store's default
        for None, else ``lease`` checked against LEASE_RANGE."""
        return self.default_lease if lease is None else checked("lease", lease)

    def retention_for(self, retention: float | None) -> float:
        """As ``lease_for``, for retention."""
        if retention is None:
            return self.default_retention
        return checked("retention", retention)

    def claim(
        self, key: str, fingerprint: str | None = None, lease: float | None = None
    ) -> ClaimOutcome:
        return self.claim_many([ClaimRequest(key, fingerprint)], lease)[0]

    def claim_many(
        self, requests: Sequence[ClaimRequest], lease: float | None = None
    ) -> list[ClaimOutcome]:
        """Claim each key, in order: InvalidKey before anything is claimed."""
        check_claims(requests)
        return self._claim_many(requests, self.lease_for(lease))

    @abstractmethod
    def _claim_many(self, requests: Sequence[ClaimRequest], lease: float) -> list[ClaimOutcome]:
        """``claim_many`` for keys already validated, ``lease`` in seconds."""

    def complete(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        result: JSON = None,
        retention: float | None = None,
    ) -> Record:
        done = Completion(key, owner, fencing_token, result)
        return self._complete(done, self.retention_for(retention))

    @abstractmethod
    def _complete(self, c: Completion, retention: float) -> Record:
        """``complete``, ``retention`` in seconds."""

    @abstractmethod
    def complete_many(
        self, completions: Sequence[Completion], retention: float | None = None
    ) -> list[bool]: ...

    def fail(
        self,
        key: str,
        owner: str,
        fencing_token: int,
        error: str,
        retriable: bool = True,
        retention: float | None = None,
    ) -> Record:
        held = Holder(key, owner, fencing_token)
        return self._fail(held, error, retriable, self.retention_for(retention))

    @abstractmethod
    def _fail(self, held: Holder, error: str, retriable: bool, retention: float) -> Record:
        """``fail``, ``retention`` in seconds."""

    def guard_many(self, guards: Sequence[Guard], lease: float | None = None) -> list[GuardReply]:
        check_guards(guards)
        return self._guard_many(guards, self.lease_for(lease)) if guards else []

    @abstractmethod
    def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        """``guard_many`` for valid entities and sequences, ``lease`` in seconds."""

    def settle_many(self, settles: Sequence[Settle], retention: float | None = None) -> list[bool]:
        if not settles:
            return []
        return self._settle_many(settles, self.retention_for(retention))

    @abstractmethod
    def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        """``settle_many``, ``retention`` in seconds."""

    def _settle_then_complete(
        self, completions: Sequence[Completion], settles: Sequence[Settle], retention: float | None
    ) -> list[bool]:
        """``finish_many`` in two round trips: the entities first, then the keys whose
        entity was still held."""
        held = dict.fromkeys((c.key for c in completions), True)
        if settles:
            answers = self.settle_many(settles, retention)
            held.update(zip((s.key for s in settles), answers, strict=True))
        sending = [c for c in completions if held[c.key]]
        done = iter(self.complete_many(sending, retention) if sending else ())
        return [held[c.key] and next(done) for c in completions]
