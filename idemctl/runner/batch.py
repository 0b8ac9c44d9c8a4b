"""A batch: keys claimed in one round trip, held by one heartbeat, run one by one (or side by
side), and completed together while later handlers run."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from idemctl.errors import ConfigError, IdemctlError, StoreUnavailable
from idemctl.model import Acquired, ClaimRequest, Completion, Guard, Order, Settle, Verdict
from idemctl.runner.attempt import invoke, not_run, record_failure, run
from idemctl.runner.context import Context
from idemctl.runner.heartbeat import Heartbeat
from idemctl.runner.holding import let_go
from idemctl.runner.ordering import guard_of, settle_of
from idemctl.runner.outcome import (
    Outcome,
    RunResult,
    Step,
    last_attempt,
    not_acquired,
    stored_form,
)
from idemctl.stores.base import TransactionalStore

if TYPE_CHECKING:
    from idemctl.stores.base import Store

log = logging.getLogger("idemctl.runner")


class Batch:
    """Many keys at once, round after round: what ``consume`` runs on.

    ``start_round`` claims a round's keys, a chunk a round trip (each answer a RunResult:
    HELD, or how a key not acquired ended: replayed, busy, mismatch, failed), and one
    heartbeat keeps every held key's lease alive until the round ends. ``run`` runs one held
    key's handler (threads may run different keys side by side): RAN hands its completion to
    a completer thread, which sends finished keys' completions in batches while later
    handlers run, so a kill repeats only the handlers it cut off and the few completions not
    yet sent. ``give_back`` returns a held key that will not run now; ``end_round`` waits
    for every completion and says how each ended (executed, lease_lost, unavailable).

    ``transactional=True`` (PostgreSQL): ``start_round`` claims nothing; ``run`` claims,
    runs and completes each key in a transaction of its own, with the handler's SQL.
    """

    def __init__(
        self,
        store: Store,
        *,
        lease: float | None = None,
        retention: float | None = None,
        permanent: tuple[type[BaseException], ...] = (),
        max_attempts: int | None = None,
        transactional: bool = False,
        complete_batch: int = 100,  # consume.options.COMPLETE_BATCH (runner imports no consume)
        complete_wait: float = 0.005,
        logger: logging.Logger = log,
    ) -> None:
        if transactional and not isinstance(store, TransactionalStore):
            raise ConfigError(f"transactional mode needs a PostgreSQL store, not {store.url}")
        self.store, self.transactional, self.logger = store, transactional, logger
        self._lease, self._retention, self._permanent = lease, retention, permanent
        self._max_attempts = max_attempts
        self._heartbeat = Heartbeat(store, store.default_lease if lease is None else lease)
        self._completer = _Completer(
            self, complete_batch, complete_wait, retention, self._heartbeat.done
        )
        self._held: dict[str, Acquired] = {}
        self._fingerprints: dict[str, str | None] = {}
        self._orders: dict[str, Order] = {}
        self._claimer: ThreadPoolExecutor | None = None
        self._round: list[Ahead] = []
        self._handed: set[str] = set()
        """Keys of this round given back by ``hand_over``: the round skips them."""
        self.timed: Callable[[str, float], None] | None = None
        """Told each claim and completion round trip: ``"claim"`` or ``"complete"``, seconds."""

    @property
    def in_flight(self) -> int:
        """Keys this batch holds now: claimed, not yet completed or given back."""
        return self._heartbeat.holding

    def last_applied(self, entity: str) -> int | None:
        """The sequence guard's last applied sequence of ``entity`` (None: none yet), read
        now: in transactional mode the guard is asked inside the key's transaction, so a
        HELD claim carries none."""
        found = self.store.get_entity(entity)
        return None if found is None else found.sequence

    def start_round(
        self, requests: Sequence[ClaimRequest], orders: Sequence[Order | None] = ()
    ) -> list[Ahead]:
        """Start a round: claim its keys (all different, and none held), in chunks of the
        store's ``claim_chunk`` (all at once for a store in this process), one round trip
        after another from the batch's claimer thread while the caller runs the handlers
        of the chunks before. Take each chunk's answers in order (each HELD, or how a key
        not acquired ended: replayed, busy, mismatch, failed), and ``end_round``.

        ``orders`` (one per request, or none) adds the sequence guard, asked for every held
        key with an order in one more round trip: STALE or BUSY keys do not stay held, and
        a HELD one carries the entity's last applied sequence in ``last``. A round of no
        request is one chunk of none."""
        size = self.store.claim_chunk or len(requests) or 1
        chunks = [
            (requests[i : i + size], orders[i : i + size])
            for i in range(0, max(len(requests), 1), size)
        ]
        if self.transactional or len(chunks) < 2:  # nothing to overlap
            self._round = [Ahead(self, requests, orders, None) for requests, orders in chunks]
            return self._round
        if self._claimer is None:
            self._claimer = ThreadPoolExecutor(1, thread_name_prefix="idemctl-claimer")
        self._round = [
            Ahead(self, requests, orders, self._claimer.submit(self._ask, requests, orders))
            for requests, orders in chunks
        ]
        return self._round

    def _ask(self, requests: Sequence[ClaimRequest], orders: Sequence[Order | None]) -> _Asked:
        """The round trips of a claim, which touch nothing of the round: any thread."""
        if self.transactional or not requests:
            return {r.key: RunResult(Step.HELD, r.key) for r in requests}, {}, None
        by_key = {r.key: o for r, o in zip(requests, orders, strict=False) if o is not None}
        timed, started, sent = self.timed, time.perf_counter(), time.time_ns()
        outcomes = self.store.claim_many(requests, self._lease)
        answered = time.time_ns()
        if timed is not None:
            timed("claim", time.perf_counter() - started)
        results: dict[str, RunResult] = {}
        held: dict[str, Acquired] = {}
        for r, outcome in zip(requests, outcomes, strict=True):
            if isinstance(outcome, Acquired):
                held[r.key] = outcome
                results[r.key] = RunResult(
                    Step.HELD,
                    r.key,
                    attempt=outcome.attempt,
                    fencing_token=outcome.fencing_token,
                )
            else:
                results[r.key] = not_acquired(r.key, outcome)
        guards = [guard_of(a, by_key[k]) for k, a in held.items() if k in by_key]
        if guards:
            self._guard(guards, results, held)
        self._heartbeat.hold(held.values(), [g for g in guards if g.key in held])
        return results, held, (sent, answered)

    def _accept(
        self, requests: Sequence[ClaimRequest], orders: Sequence[Order | None], asked: _Asked
    ) -> list[RunResult]:
        """Add what a claim holds to the round."""
        results, held, _ = asked
        self._held.update(held)
        self._orders.update(
            (r.key, order) for r, order in zip(requests, orders, strict=False) if order is not None
        )
        if self.transactional:
            self._fingerprints.update((r.key, r.fingerprint) for r in requests)
        return [results[r.key] for r in requests]

    def _guard(
        self, guards: list[Guard], results: dict[str, RunResult], held: dict[str, Acquired]
    ) -> None:
        """Ask the guard for the held keys with an order; settle those it does not let run."""
        try:
            replies = self.store.guard_many(guards, self._lease)
        except BaseException:
            # Nothing was decided: the keys go back for the next delivery, while the store
            # answers (those it does not take back wait out their leases).
            for a in held.values():
                try:
                    self.store.release(a.key, a.owner, a.fencing_token, handler_ran=False)
                except IdemctlError as exc:
                    self.logger.debug("release %s: %s", a.key, exc)
                    break
            held.clear()
            raise
        stopped = []
        for g, reply in zip(guards, replies, strict=True):
            if reply.verdict is Verdict.GO:
                results[g.key] = results[g.key]._replace(last=reply.last)
            else:
                stopped.append((held.pop(g.key), reply))
        for r in not_run(self.store, stopped, self._retention, self.logger):
            results[r.key] = r

    def run(self, key: str, handler: Callable[[Context], Any]) -> RunResult:
        """Run the handler of a key this round holds: RAN (its completion is on its way),
        ERROR (recorded: ``retriable`` or not), LEASE_LOST, or UNAVAILABLE (the store did not
        answer while the failure was recorded: nothing is decided)."""
        if self.transactional:
            try:
                return run(
                    self.store,
                    key,
                    handler,
                    fingerprint=self._fingerprints[key],
                    lease=self._lease,
                    retention=self._retention,
                    permanent=self._permanent,
                    transactional=True,
                    max_attempts=self._max_attempts,
                    order=self._orders.get(key),
                    logger=self.logger,
                )
            except StoreUnavailable as exc:
                return RunResult(Step.UNAVAILABLE, key, error=exc)
        a = self._held[key]
        try:
            did = invoke(
                self.store,
                a,
                handler,
                lease=self._lease,
                retention=self._retention,
                permanent=self._permanent,
                heartbeat=False,  # the batch's heartbeat holds it
                max_attempts=self._max_attempts,
                order=self._orders.get(key),
                logger=self.logger,
            )
        except StoreUnavailable as exc:  # recording a failure
            return RunResult(Step.UNAVAILABLE, key, None, None, exc, a.attempt, a.fencing_token)
        failed = did.failed(a)
        if failed is not None:
            self._heartbeat.done([key])
            return failed
        order = self._orders.get(key)
        self._completer.put(
            Completion(key, a.owner, a.fencing_token, did.value),
            None if order is None else settle_of(a, order),
        )
        return RunResult(Step.RAN, key, did.value, None, None, a.attempt, a.fencing_token)

    def give_back(self, key: str, *, ran: bool = False) -> RunResult:
        """Give back a key this round holds and will not run now: its attempt is not
        counted, so ``max_attempts`` counts runs. ``ran``: its handler was started (and is
        left running: a drain that ran out of time), so the attempt counts."""
        a = self._held.get(key)
        if key in self._handed:
            return RunResult(Step.RELEASED, key)
        if a is None:  # transactional: nothing was claimed
            self._heartbeat.done([key])
            return RunResult(Step.RELEASED, key)
        self._release(a, ran)
        return RunResult(Step.RELEASED, key, attempt=a.attempt, fencing_token=a.fencing_token)

    def hand_over(self, keys: Collection[str]) -> None:
        """Give back held keys of this round from another thread while one of its handlers
        runs (the consumer moved their partitions to another lane): those claimed, and those
        whose claims are on their way (waited for). The round skips them from now on."""
        keys = set(keys) - self._handed
        self._handed |= keys
        for ahead in list(self._round):
            if ahead.done or ahead.future is None:
                continue
            try:
                _, held, _ = ahead.future.result()
            except Exception as exc:  # not claimed (the store did not answer, or dropped)
                self.logger.debug("claims handed over: %s", exc)
                continue
            for key in keys & held.keys():
                self._release(held[key])
        for key in keys & self._held.keys():
            self._release(self._held[key])

    def _release(self, a: Acquired, ran: bool = False) -> None:
        self._heartbeat.done([a.key])
        order = self._orders.get(a.key)
        if order is not None:
            let_go(self.store, a, order, self.logger)
        try:
            self.store.release(a.key, a.owner, a.fencing_token, handler_ran=ran)
        except IdemctlError as exc:  # its lease runs out by itself
            self.logger.debug("release %s: %s", a.key, exc)

    def abandon(self, key: str, error: Exception) -> RunResult:
        """A held key whose handler passed its hard time limit in a thread left to itself:
        its lease is no longer extended and ``error`` is recorded as its failure (retriable
        unless it was the last attempt), so the key may run again at once and the stuck
        attempt's late writes are refused. ERROR, or LEASE_LOST where the attempt had
        finished or lost the key meanwhile, or UNAVAILABLE."""
        self._heartbeat.done([key])
        a = self._held[key]
        final = last_attempt(a, self._max_attempts)
        order = self._orders.get(key)
        try:
            did = record_failure(
                self.store, a, error, True, self._retention, final=final, order=order
            )
        except StoreUnavailable as exc:
            return RunResult(Step.UNAVAILABLE, key, None, None, exc, a.attempt, a.fencing_token)
        failed = did.failed(a)
        assert failed is not None
        return failed

    def late(self, ctx: Context, value: Any) -> None:
        """An abandoned handler came back with ``value``: its key was failed for it
        (``abandon``), so the result is offered to the store with its attempt's fencing
        token, which refuses it (LeaseLost) once another attempt took the key; else it is
        stored, and the retry replays it. Other store errors propagate."""
        self.store.complete(ctx.key, ctx.owner, ctx.fencing_token, stored_form(value))

    def end_round(self) -> list[RunResult]:
        """End the round: the chunks not taken are dropped (given back if claimed), what
        completions are left are sent, and every answer since the round began is waited
        for: EXECUTED, LEASE_LOST, or UNAVAILABLE (nothing decided)."""
        try:
            for ahead in self._round:
                if not ahead.done:
                    ahead.drop()
            return self._completer.drain()
        finally:
            self._round, self._handed = [], set()
            self._heartbeat.clear()
            self._held, self._orders, self._fingerprints = {}, {}, {}

    def close(self) -> None:
        self._heartbeat.stop()
        self._completer.stop()
        if self._claimer is not None:
            self._claimer.shutdown()

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_Asked = tuple[dict[str, RunResult], dict[str, Acquired], tuple[int, int] | None]
"""A claim's answers by key, the keys it holds, and when it was sent and answered (ns
since the epoch; None where nothing was sent)."""


class Ahead:
    """One chunk of a round's claims, on their way (``Batch.start_round``)."""

    def __init__(
        self,
        batch: Batch,
        requests: Sequence[ClaimRequest],
        orders: Sequence[Order | None],
        future: Future[_Asked] | None,
    ) -> None:
        self._batch, self.requests, self._orders, self.future = batch, requests, orders, future
        self.sent: tuple[int, int] | None = None
        """Once taken: when the claim was sent and answered, in ns since the epoch."""
        self.done = False
        """Taken or dropped: the round is through with it."""

    def take(self) -> list[RunResult]:
        """Wait for the answers and add what they hold to the round (StoreUnavailable:
        nothing of this chunk was claimed)."""
        self.done = True
        b = self._batch
        asked = b._ask(self.requests, self._orders) if self.future is None else self.future.result()
        self.sent = asked[2]
        return b._accept(self.requests, self._orders, asked)

    def drop(self) -> None:
        """Not wanted now: not claimed if it was not sent yet, else given back."""
        self.done = True
        if self.future is None or self.future.cancel():
            return
        try:
            taken = self.take()
        except IdemctlError as exc:
            self._batch.logger.debug("claims dropped: %s", exc)
            return
        for r in taken:
            if r.outcome is Step.HELD:
                self._batch.give_back(r.key)


class _Completer:
    """Sends finished keys' completions while later handlers run: a batch leaves once it
    holds ``batch`` completions or its oldest has waited ``wait`` seconds, whichever comes
    first; one round trip at a time, those finished meanwhile go in the next. A completion
    that finds ``batch`` waiting waits for them to leave: what a SIGKILL can cost beyond the
    handlers it cuts off is at most ``2 * batch`` completions (one batch on its way, one
    waiting), however slow the store or the machine."""

    def __init__(
        self,
        owner: Batch,
        batch: int,
        wait: float,
        retention: float | None,
        completed: Callable[[list[str]], None],
    ) -> None:
        self.owner, self.store = owner, owner.store
        self.batch, self.wait, self.retention = batch, wait, retention
        self._completed = completed
        self._cond = threading.Condition()
        self._queue: list[Completion] = []
        self._settles: dict[str, Settle] = {}
        self._since = 0.0
        self._sending = 0
        self._answers: list[RunResult] = []
        self._failure: BaseException | None = None
        self._now = self._stopped = False
        self._thread: threading.Thread | None = None

    def put(self, completion: Completion, settle: Settle | None = None) -> None:
        """Complete ``completion``; with ``settle``, advance its entity first."""
        with self._cond:
            if settle is not None:
                self._settles[completion.key] = settle
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="idemctl-completer", daemon=True
                )
                self._thread.start()
            while len(self._queue) >= self.batch:
                # Back-pressure: a full batch waits to leave (its round trip's turn, or the
                # completer thread's, on a busy machine), so no more than ``batch`` wait.
                self._cond.wait()
            if not self._queue:
                self._since = time.monotonic()
            self._queue.append(completion)
            if len(self._queue) in (1, self.batch):
                self._cond.notify_all()  # the first starts the wait for company

    def drain(self) -> list[RunResult]:
        """Send what is left at once; every answer since the last drain. An error other
        than StoreUnavailable is raised here, in the caller's thread."""
        with self._cond:
            self._now = True
            self._cond.notify_all()
            while self._queue or self._sending:
                self._cond.wait()
            self._now = False
            answers, self._answers = self._answers, []
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        return answers

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopped:
                    self._cond.wait()
                if not self._queue:
                    return
                while len(self._queue) < self.batch and not (self._now or self._stopped):
                    left = self._since + self.wait - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                sending, self._queue = self._queue, []
                settles = [self._settles.pop(c.key) for c in sending if c.key in self._settles]
                self._sending = len(sending)
                self._cond.notify_all()  # the next batch may gather while this one is sent
            answers = self._send(sending, settles)
            with self._cond:
                self._answers += answers
                self._sending = 0
                self._cond.notify_all()

    def _send(self, sending: list[Completion], settles: list[Settle]) -> list[RunResult]:
        timed, started = self.owner.timed, time.perf_counter()
        try:
            done = (
                self.store.finish_many(sending, settles, self.retention)
                if settles
                else self.store.complete_many(sending, self.retention)
            )
            if timed is not None:
                timed("complete", time.perf_counter() - started)
        except StoreUnavailable as exc:
            return [RunResult(Step.UNAVAILABLE, c.key, c.result, error=exc) for c in sending]
        except BaseException as exc:  # raised again by drain(), in the consumer's thread
            with self._cond:
                self._failure = exc
            return []
        self._completed([c.key for c, ok in zip(sending, done, strict=True) if ok])
        executed, lost = Outcome.EXECUTED, Outcome.LEASE_LOST
        return [  # positional: a named tuple's keywords cost a fifth more, a key each
            RunResult(executed if ok else lost, c.key, c.result, None, None, None, c.fencing_token)
            for c, ok in zip(sending, done, strict=True)
        ]
