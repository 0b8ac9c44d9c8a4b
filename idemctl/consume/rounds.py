"""What a lane does with a round (``consume.lanes``), in the lane's thread: claim its keys
in one round trip a chunk, run the handlers of the keys it holds (a partition's messages in
order, up to the first that must wait), complete each as its handler returns (the batch's
completer) and give back the claims of messages that will not run now. A key twice in a
round waits for the next pass, after the first is finished (then it replays); so does an
entity's second event.

Nothing here touches Kafka: where a partition stops, and for how long, is written on the
round (``Round.block``); the loop pauses, seeks and stores offsets when it takes it back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from idemctl.consume.acting import Acting
from idemctl.consume.hooks import Hooks
from idemctl.consume.item import LETTER, Item, Pause, Stop, about, chunks, fields
from idemctl.consume.lanes import Lane, Round, Running
from idemctl.consume.watch import log
from idemctl.durations import format_duration
from idemctl.errors import HandlerTimeout, IdemctlError, LeaseLost, StoreUnavailable
from idemctl.model import ClaimRequest
from idemctl.runner import Context, Outcome, RunResult, Step
from idemctl.runner.limits import Abandoned
from idemctl.runner.ordering import missing_predecessor

if TYPE_CHECKING:
    from idemctl.consume.event import Handler
    from idemctl.consume.options import ConsumeOptions
    from idemctl.kafka.acts import Acts
    from idemctl.kafka.policy import Keying
    from idemctl.runner import Batch

HELD, RAN, EXECUTED = Step.HELD, Step.RAN, Outcome.EXECUTED


class Rounds(Acting):
    """Runs the rounds the loop hands the lanes, in the lanes' threads. Of the loop it only
    reads ``halted``; what it finds is written on the round (where each partition stopped,
    and why; the messages to dead-letter) and on its messages, which the loop reads when
    it takes the round back."""

    def __init__(
        self,
        handler: Handler,
        options: ConsumeOptions,
        keying: Keying,
        acts: Acts,
        hooks: Hooks,
        halted: Callable[[], bool],
    ) -> None:
        super().__init__(options, acts)
        self.handler, self._keying, self.hooks = handler, keying, hooks
        self.halted = halted
        """Draining (stop()), or stopping (the dead-letter breaker tripped)."""
        self._gap_since: dict[tuple[str, int, int], float] = {}
        """--contiguous: when the partition was first paused at each message whose
        predecessor is missing."""

    @property
    def hooks(self) -> Hooks:
        return self._hooks

    @hooks.setter
    def hooks(self, hooks: Hooks) -> None:
        self._hooks = hooks
        self._around = type(hooks).run is not Hooks.run
        """A hook wraps the handler's run (tracing's span): else it is called bare."""
        self._timed = type(hooks).handler_ran is not Hooks.handler_ran
        """A hook is told each handler's seconds (metrics)."""

    def work(self, lane: Lane, rnd: Round) -> None:
        """Run ``rnd`` in passes of distinct keys and entities; a partition that stopped
        skips the rest of it."""
        pending = [items for items in rnd.partitions.values() if items]
        while pending:
            round_items: list[Item] = []
            seen: set[str] = set()
            entities: set[str] = set()
            later: list[list[Item]] = []
            for items in pending:
                for i, item in enumerate(items):
                    entity = None if item.order is None else item.order.entity
                    if item.key is not None and (item.key in seen or entity in entities):
                        later.append(items[i:])
                        break
                    if item.key is not None:
                        seen.add(item.key)
                        if entity is not None:
                            entities.add(entity)
                    round_items.append(item)
            self._pass(lane, rnd, round_items)
            if self.halted():
                return  # draining, or stopping: later passes were never claimed
            pending = [items for items in later if rnd.usable(items[0])]

    def block(self, rnd: Round, item: Item, wait: Pause) -> None:
        if wait is not LETTER:
            self._count(wait[1])
        rnd.block(item, wait)

    def _pass(self, lane: Lane, rnd: Round, items: list[Item]) -> None:
        """Claim, run and complete ``items`` (distinct keys), a partition after another.
        The claims go in chunks of the store's ``claim_chunk`` keys, each answered while
        the handlers of the chunk before it run."""
        o = self.options
        batch = lane.batch
        rnd.claimed, rnd.current, rnd.started = {}, items, set()
        claimed = rnd.claimed

        def release(part: list[Item]) -> None:
            """Give back the claims of messages that will not run now."""
            for item in part:
                if item.tp in rnd.moved:
                    continue  # given back by the loop, which moved its partition
                if item.key is not None and claimed[item.key].outcome is HELD:
                    batch.give_back(item.key)

        def run_partition(part: list[Item]) -> Stop:
            """One partition's messages in order; stops at the first that must wait, on
            stop() (SIGTERM: the handler in hand finishes, no more) or a tripped breaker."""
            for i, item in enumerate(part):
                if item.tp in rnd.moved:
                    return None  # moved to another lane while this one's handler was overdue
                if self.halted():
                    release(part[i:])
                    return None
                wait = self._process(lane, rnd, item, claimed.get(item.key) if item.key else None)
                if wait is not None:
                    release(part[i + 1 :])  # behind a stopped message: not now
                    return item, wait
            return None

        asks = batch.start_round(
            [ClaimRequest(i.key, i.fingerprint) for i in items if i.key is not None],
            [i.order for i in items if i.key is not None] if self._keying.ordered else (),
        )
        parts = chunks(items, [len(ask.requests) for ask in asks])
        taken = 0
        try:
            for chunk, ask in zip(parts, asks, strict=True):
                if self.halted():
                    break
                taken += 1
                try:
                    claimed.update((r.key, r) for r in ask.take())
                    self.hooks.claimed(chunk, ask.sent)
                except StoreUnavailable as exc:
                    log.warning(
                        "store unavailable, pausing every partition: %s",
                        exc,
                        extra=fields(outcome="store_unavailable"),
                    )
                    for item in (i for later in parts[taken - 1 :] for i in later):
                        if rnd.usable(item):
                            self.block(rnd, item, (o.backoff, "store_unavailable"))
                    break
                release([i for i in chunk if not rnd.usable(i)])
                for part in self._by_partition(claimed, [i for i in chunk if rnd.usable(i)]):
                    stop = run_partition(part)
                    if stop is not None:
                        self.block(rnd, *stop)
        finally:  # chunks sent but not run now are given back; every completion answered
            if lane.abandoned is None:  # else the loop settled the round without this thread
                completed = batch.end_round()
        self.completed(rnd, items, completed)

    @staticmethod
    def _by_partition(claimed: dict[str, RunResult], items: list[Item]) -> list[list[Item]]:
        """``items`` by partition; a partition whose next message is on a retry after the
        fresh ones, so that a key that hangs every time delays the others least."""
        partitions: dict[tuple[str, int], list[Item]] = {}
        for item in items:
            partitions.setdefault(item.tp, []).append(item)

        def attempt(part: list[Item]) -> int:
            first = claimed.get(part[0].key) if part[0].key else None
            return (first.attempt or 0) if first is not None else 0

        return sorted(partitions.values(), key=attempt)

    def completed(self, rnd: Round, items: list[Item], completed: list[RunResult]) -> None:
        """The pass's completions answered: executed ones are finished; one that failed
        stops its partition at its message, even where a later message of it stopped the
        partition already: nothing past it may be stored."""
        keyed = {i.key: i for i in items if i.key is not None}
        failed = []
        executed = 0
        for result in completed:
            item = keyed[result.key]
            if item.tp in rnd.moved:
                continue  # its partition went on in another lane, from its Kafka offset
            if result.outcome is EXECUTED:
                item.done, item.outcome = True, EXECUTED.value
                executed += 1
            else:
                failed.append(result)
        self._count(EXECUTED.value, executed)
        for result in sorted(failed, key=lambda r: keyed[r.key].offset):
            item = keyed[result.key]
            if rnd.usable(item):
                wait = self.act(item, result)
                if wait is not None:
                    self.block(rnd, item, wait)
        hooks = self.hooks
        for result in completed:
            item = keyed[result.key]
            hooks.completed(item, result)
            if item.letter is None:  # else it ends once its dead letter is answered
                hooks.end(item, item.outcome or result.outcome.value)

    def _process(
        self, lane: Lane, rnd: Round, item: Item, claimed: RunResult | None
    ) -> Pause | None:
        """Run a held key's handler; then what its result comes to. The hooks hear it
        begin, and end here unless a completion or a dead letter is on its way."""
        hooks = self.hooks
        hooks.begin(item, claimed)
        try:
            wait = self._handle(lane, rnd, item, claimed)
        except BaseException as exc:
            hooks.failed(item, exc)
            hooks.end(item, None)
            raise
        if item.letter is None and (item.done or wait is not None):
            hooks.end(item, item.outcome if wait is None else wait[1])
        return wait

    def _handle(
        self, lane: Lane, rnd: Round, item: Item, claimed: RunResult | None
    ) -> Pause | None:
        if claimed is None:
            return self._unusable(item)
        if claimed.outcome is not HELD:
            return self.act(item, claimed)
        batch = lane.batch
        if self.options.contiguous and item.order is not None:
            wait = self._gap(batch, item, claimed)
            if wait is not None:
                return wait
        event = self._event(item)
        hooks, timed = self.hooks, self._timed
        rnd.started.add(claimed.key)

        def call(ctx: Context) -> Any:
            running = lane.started(item)
            try:
                value = self.handler(event, ctx)
            except BaseException as exc:
                if lane.returned(running):
                    self._late(batch, ctx, running, None, exc)
                    raise Abandoned from None
                if running.interrupted and isinstance(exc, HandlerTimeout):
                    soft = format_duration(self.options.handler_timeout)
                    raise HandlerTimeout(
                        f"the handler ran past --handler-timeout {soft}: HandlerTimeout was "
                        "raised in it"
                    ) from None
                raise
            finally:
                if timed:
                    hooks.handler_ran(time.monotonic() - running.started)
            if lane.returned(running):
                self._late(batch, ctx, running, value, None)
                raise Abandoned
            return value

        if self._around:
            ran = hooks.run(item, lambda: batch.run(claimed.key, call))
        else:
            ran = batch.run(claimed.key, call)
        return None if ran.outcome is RAN else self.act(item, ran)  # RAN: completion on its way

    def _late(
        self,
        batch: Batch,
        ctx: Context,
        running: Running,
        value: Any,
        error: BaseException | None,
    ) -> None:
        """An abandoned handler came back: its key was failed as timed out meanwhile, so
        its result goes to the store with the attempt's fencing token, which refuses it
        (unless no other attempt took the key yet: then it is stored, and the retry
        replays it). In transactional mode its transaction rolls back instead."""
        item, seconds = running.item, time.monotonic() - running.started
        where = about(item, "abandoned_returned", seconds=round(seconds, 1))
        if error is not None or self.options.transactional:
            log.warning(
                "the abandoned handler of key %r came back after %.0fs%s; nothing of it is "
                "recorded",
                ctx.key,
                seconds,
                "" if error is None else f" raising {type(error).__name__}: {error}",
                extra=where,
            )
            return
        try:
            batch.late(ctx, value)
        except LeaseLost as lost:
            log.warning(
                "the abandoned handler of key %r returned after %.0fs; the store refused its "
                "result (fencing token %d no longer holds the key): %s",
                ctx.key,
                seconds,
                ctx.fencing_token,
                lost,
                extra=where,
            )
        except IdemctlError as exc:
            log.warning(
                "the abandoned handler of key %r returned after %.0fs; its result was not "
                "stored: %s",
                ctx.key,
                seconds,
                exc,
                extra=where,
            )
        else:
            log.warning(
                "the abandoned handler of key %r returned after %.0fs, before another attempt "
                "took the key: its result was stored (the next delivery replays it)",
                ctx.key,
                seconds,
                extra=where,
            )

    def _gap(self, batch: Batch, item: Item, claimed: RunResult) -> Pause | None:
        """--contiguous: pause the partition at an event whose predecessor is not applied
        yet, the busy path's way, until ``gap_timeout`` has passed since it was first
        paused; then it runs (a gap counted)."""
        assert item.order is not None
        m = item.msg
        at = (m.topic(), m.partition(), m.offset())
        last = claimed.last
        if self.options.transactional:  # the guard is asked inside the transaction
            last = batch.last_applied(item.order.entity)
        if not missing_predecessor(item.order, last):
            self._gap_since.pop(at, None)
            return None
        now = time.monotonic()
        since = self._gap_since.setdefault(at, now)
        if now - since < self.options.gap_timeout:
            batch.give_back(claimed.key)
            left = self.options.gap_timeout - (now - since)
            return min(self.options.backoff, left), "gap_wait"
        del self._gap_since[at]
        self._count("gaps")
        log.warning(
            "%s[%d]@%d: entity %r applied up to %s, not %d; applying %d after waiting "
            "%.1fs (--gap-timeout)",
            m.topic(),
            m.partition(),
            m.offset(),
            item.order.entity,
            last,
            item.order.sequence - 1,
            item.order.sequence,
            now - since,
            extra=about(item, "gaps", entity=item.order.entity, sequence=item.order.sequence),
        )
        return None
