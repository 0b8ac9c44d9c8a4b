"""One verify run: make the scratch topic and store, drive the consumers, the chaos and the
faults, judge, and remove what it made."""

from __future__ import annotations

import random
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, suppress
from pathlib import Path

from idemctl.errors import Refused
from idemctl.harness.scratch import Scratch
from idemctl.harness.verify.consumers import _Consumers, _Ledger
from idemctl.harness.verify.faults import _StoreFault
from idemctl.harness.verify.kafka import _Kafka
from idemctl.harness.verify.plan import (
    Effect,
    Fault,
    Plan,
    Progress,
    VerifyReport,
    _Chaos,
    _Messages,
    fence_mismatches,
    guarantee_of,
    judge,
    percentile,
)
from idemctl.model import Status


def run_verify(
    plan: Plan,
    on_step: Callable[[str], None] = lambda step: None,
    on_progress: Callable[[Progress], None] = lambda progress: None,
) -> VerifyReport:
    """Run the proof; ``on_step`` hears each step, ``on_progress`` the counts, every
    quarter second. KeyboardInterrupt (Ctrl-C) stops it, and what it made is removed."""
    plan.check()
    return _Run(plan, on_step, on_progress).run()


class _Run:
    def __init__(
        self,
        plan: Plan,
        on_step: Callable[[str], None],
        on_progress: Callable[[Progress], None],
    ) -> None:
        self.plan, self.on_step, self.on_progress = plan, on_step, on_progress
        self.id = plan.run_id or uuid.uuid4().hex[:8]
        self.topic = f"idemctl-verify-{self.id}"
        self.scratch = Scratch(plan.store, self.id, plan.default_store)
        self.kafka = _Kafka(plan, self.topic)
        if {self.topic, self.kafka.dlq} & self.kafka.existing():
            raise Refused(
                f"topic {self.topic} already exists: verify only runs on topics it creates"
            )
        self.scratch.refuse_if_used()
        self.fault = _StoreFault(plan, self.scratch) if plan.store_pause > 0 else None
        self.messages = _Messages.plan(plan, self.id)
        self.progress = Progress()
        mode, guarantee = guarantee_of(plan)
        self.report = VerifyReport(
            self.id, self.topic, self.scratch.shown, mode, guarantee, plan.messages,
            len(self.messages.expected), plan.partitions, plan.consumers,
            len(self.messages.poison), kept=plan.keep,
        )  # fmt: skip
        self.faults: list[Fault] = []
        self.folder = Path(tempfile.mkdtemp(prefix=f"idemctl-verify-{self.id}-"))
        self.made: list[str] = []
        self.stop_producing = threading.Event()
        self._fault_thread: threading.Thread | None = None
        self._producer: threading.Thread | None = None
        self._exits_before = 0

    def phase(self, name: str) -> None:
        self.progress.phase = name
        self.on_progress(self.progress)

    def run(self) -> VerifyReport:
        consumers: _Consumers | None = None
        try:
            with ExitStack() as stack:
                self.kafka.create()
                self.made.append("topics")
                self.on_step(
                    f"topic {self.topic} ({self.plan.partitions} partitions), {self.kafka.dlq}"
                )
                self.made.append("store")
                self.scratch.provision(self.plan.transactional)
                self.on_step(f"scratch store {self.scratch.shown}")
                ledger = stack.enter_context(
                    _Ledger(self.folder, self.scratch, self.plan.transactional, self.plan.fenced)
                )
                consumers = _Consumers(self.plan, self.scratch, self.topic, ledger, self.folder)
                stack.callback(consumers.kill_all)
                consumers.start_all()
                self.phase("consume")
                r = self.report
                self.on_step(f"{self.plan.consumers} consume processes; {r.mode}: {r.guarantee}")
                self._drive(consumers, ledger)
                self.on_step(f"consumers stopped after {self.report.seconds:.1f}s")
                self.phase("check")
                self._judge(ledger.effects(), consumers)
                if self.plan.fenced:
                    self._judge_fence(ledger)
            return self.report
        finally:
            self.stop_producing.set()
            if self._producer is not None:
                self._producer.join(15)  # no message sent after the topics are deleted
            self._clean()

    def _produce(self, failed: list[BaseException]) -> None:
        try:
            self.kafka.produce(self.messages, self.progress, self.stop_producing)
        except BaseException as exc:  # raised again by the main thread
            failed.append(exc)

    def _drive(self, consumers: _Consumers, ledger: _Ledger) -> None:
        """Produce, and kill, rebalance and fault as asked, until every message produced is
        committed (or the time is up); then stop the consumers."""
        plan = self.plan
        failed: list[BaseException] = []
        producer = self._producer = threading.Thread(
            target=self._produce, args=(failed,), daemon=True
        )
        started = time.monotonic()
        producer.start()
        rng = random.Random(f"{self.id}-kills")
        chaos = _Chaos(started, plan.kill_every, plan.rebalance)
        fault_at = started + 3.0 if self.fault is not None else float("inf")
        with self.kafka.offsets_reader(self.topic) as lag:
            while producer.is_alive() or lag() > 0:
                now = time.monotonic()
                if now - started > plan.timeout:
                    self.report.timed_out = True
                    break
                if failed:
                    raise failed[0]
                consumers.watch()
                for act in chaos.due(now, self.progress.handled):
                    if act == "kill":
                        consumers.kill_one(rng)
                        self.progress.kills = len(consumers.killed)
                    else:
                        consumers.rebalance()
                        self.progress.rebalances = consumers.rebalances
                if self.fault is not None and now >= fault_at:
                    fault_at = float("inf")
                    self._start_fault(self.fault, consumers)
                if not self._faulting(consumers):  # the store may not answer meanwhile
                    with suppress(Exception):  # a count for the progress view only
                        self.progress.handled = ledger.count()
                self.on_progress(self.progress)
                time.sleep(0.25)
            if self._fault_thread is not None:
                self._fault_thread.join()
            self.report.seconds = time.monotonic() - started
            self.phase("drain")
            consumers.stop()
            self.report.lag_left = lag() if self.kafka.ends else 0

    def _start_fault(self, fault: _StoreFault, consumers: _Consumers) -> None:
        self.faults.append(Fault(fault.kind, self.plan.store_pause))
        self.progress.faults += 1
        self.on_step(f"store fault: {fault.kind} for {self.plan.store_pause:g}s")
        self._exits_before = consumers.exits
        self._fault_thread = threading.Thread(
            target=fault.run, args=(self.faults[-1],), daemon=True
        )
        self._fault_thread.start()

    def _faulting(self, consumers: _Consumers) -> bool:
        """Whether the store is out now (counting the consumers' exits meanwhile)."""
        if self._fault_thread is None or not self._fault_thread.is_alive():
            return False
        self.faults[-1].consumer_exits = consumers.exits - self._exits_before
        return True

    def _judge(self, effects: list[Effect], consumers: _Consumers) -> None:
        report, plan, messages = self.report, self.plan, self.messages
        report.kills = len(consumers.killed)
        report.rebalances = consumers.rebalances
        report.consumer_exits = consumers.exits
        report.faults = self.faults
        for f in self.faults:
            f.effects_during = sum(1 for e in effects if f.started <= e.handled <= f.ended)
        report.effects = len(effects)
        report.lost = sorted(messages.expected - {e.key for e in effects})
        (
            report.duplicate_effects,
            report.duplicates_allowed,
            report.duplicates_unexplained,
            report.kills_mid_handler,
        ) = judge(effects, consumers.killed, self.faults, plan)
        for f in self.faults:
            f.failed_closed = not report.lost and report.duplicates_unexplained == 0
        first: dict[str, Effect] = {}
        for e in effects:
            first.setdefault(e.key, e)
        latencies = [(e.handled - e.sent) * 1000 for e in first.values()]
        report.p50_ms = percentile(latencies, 0.50)
        report.p99_ms = percentile(latencies, 0.99)
        report.throughput = plan.messages / report.seconds if report.seconds else 0.0
        dead = self.kafka.dead_letter_keys(expect=len(messages.poison))
        report.dead_letters = len(dead)
        report.poison_missing = sorted(messages.poison - set(dead))
        report.dead_letters_unexpected = sorted(set(dead) - messages.poison)

    def _judge_fence(self, ledger: _Ledger) -> None:
        """--fenced: each key's standing effect must carry the token of the attempt that
        completed the key; a stale write that landed would carry an older one."""
        writes, refused, tokens = ledger.fence_figures()
        report = self.report
        report.fenced = True
        report.late_writes_refused = refused
        report.effects_replaced = writes - len(tokens)
        with self.scratch.store() as store:

            def completed(key: str) -> int | None:
                record = store.get(key)
                done = record is not None and record.status is Status.COMPLETED
                return record.fencing_token if done and record is not None else None

            report.fence_mismatches = fence_mismatches(tokens, completed)

    def _clean(self) -> None:
        if self.plan.keep:
            self.on_step(
                f"kept: topic {self.topic}, store {self.scratch.shown}, logs in {self.folder}"
            )
            return
        self.phase("clean up")
        kept = self.kafka.remove(self.topic) if "topics" in self.made else {}
        for topic, why in kept.items():
            self.on_step(f"could not delete topic {topic}: {why}")
        if "store" in self.made:
            self.scratch.remove()
        for path in self.folder.iterdir():
            path.unlink()
        self.folder.rmdir()
        self.on_step(f"removed the scratch {'store' if kept else 'topics and store'}")
