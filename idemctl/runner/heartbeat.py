"""One heartbeat for every key an attempt or a batch holds."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from idemctl.errors import LeaseLost, StoreError

if TYPE_CHECKING:
    from idemctl.model import Acquired, Guard
    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.runner")


class Heartbeat:
    """Every ``lease/3`` seconds, extends the lease of each key it holds, in one thread, so a
    slow handler does not let its key lapse; work that ends within lease/3 costs it nothing.
    A key whose lease was lost is dropped (completing it says so); a store that does
    not answer is tried again at the next beat, while the lease may still hold."""

    def __init__(
        self,
        store: Store,
        lease: float,
        held: Iterable[Acquired] = (),
        guards: Iterable[Guard] = (),
        *,
        name: str = "idemctl-heartbeat",
    ) -> None:
        """Keys ``held`` (and the entity holds ``guards`` name) are held from the start."""
        self.store, self.lease = store, lease
        self._held: dict[str, Acquired] = {}
        self._guards: dict[str, Guard] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=name, daemon=True)
        held = list(held)
        if held:
            self.hold(held, guards)

    def hold(self, acquired: Iterable[Acquired], guards: Iterable[Guard] = ()) -> None:
        """Keep these keys' leases alive too (starts the thread the first time), and the
        holds on their entities that ``guards`` name."""
        with self._lock:
            self._held.update((a.key, a) for a in acquired)
            self._guards.update((g.key, g) for g in guards)
            if not self._thread.is_alive() and not self._wake.is_set():
                self._thread.start()

    @property
    def holding(self) -> int:
        """Keys whose leases it keeps alive now."""
        return len(self._held)

    def done(self, keys: Iterable[str]) -> None:
        """Finished (completed, failed or released): their leases need no more extending."""
        with self._lock:
            for key in keys:
                self._held.pop(key, None)
                self._guards.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._guards.clear()

    def stop(self) -> None:
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _beat(self) -> None:
        while not self._wake.wait(self.lease / 3):
            with self._lock:
                held = list(self._held.values())
                guards = list(self._guards.values())
            unanswered: StoreError | None = None
            if guards:  # asking again extends the hold; a lost one shows when it settles
                try:
                    self.store.guard_many(guards, self.lease)
                except StoreError as exc:
                    unanswered = exc
            for a in held:
                try:
                    self.store.extend(a.key, a.owner, a.fencing_token, self.lease)
                except LeaseLost as exc:  # completed meanwhile, or taken: completion says
                    log.debug("heartbeat: %s", exc)
                    self.done([a.key])
                except StoreError as exc:
                    unanswered = exc
            if unanswered is not None:
                log.warning("heartbeat could not extend the leases it holds: %s", unanswered)
