"""verify's plan and judgement, pure: what to produce, when to kill or rebalance, and what
the effects recorded come to. No process, Kafka client or store here."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from idemctl import backends
from idemctl.consume.options import COMPLETE_BATCH, repeats_per_kill
from idemctl.errors import ConfigError
from idemctl.stores.limits import LEASE_RANGE, in_range

HANDLER = "idemctl.harness.recorder:record"
POISON = "idemctl.harness.recorder.Poison"
SABOTAGE = ("no-claim", "lose")
"""Test-only ways to break the guarantee, so a test can see verify fail: ``no-claim``
runs consume with ``--key offset`` (each delivery its own key: no duplicate is caught);
``lose`` plants messages whose handler returns without recording its effect."""
KAFKA_DEFAULTS = {
    "session.timeout.ms": "6000",
    "heartbeat.interval.ms": "500",
    "auto.offset.reset": "earliest",
}
"""What verify's consumers run with unless --kafka-config says otherwise: a killed member
holds its partitions until its session times out, and 6 s is Apache Kafka's least."""
_CLIENT_PREFIXES = ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.", "api.")
"""--kafka-config settings verify's own clients (admin, producer, reader) take too."""


@dataclass(frozen=True)
class Plan:
    store: str
    brokers: str
    kafka_config: dict[str, str] = field(default_factory=dict)
    default_store: bool = False
    """The store is idemctl's default (not chosen): SQLite in a temporary folder."""
    messages: int = 20_000
    duplicates: float = 0.3
    poison: int = 20
    partitions: int = 6
    consumers: int = 3
    kill_every: float = 2.0
    rebalance: bool = False
    store_pause: float = 0.0
    store_fault_cmd: str | None = None
    transactional: bool = False
    fenced: bool = False
    """The recording handler writes its effect through the fence (``idemctl.fence``) into a
    ledger of its own: no duplicate effect allowed, and each key's standing effect must be
    the one its completing attempt wrote."""
    batch_size: int = 1
    lease: float = 5.0
    rate: float = 0.0
    """Messages produced a second (0: as fast as the broker takes them)."""
    timeout: float = 600.0
    keep: bool = False
    run_id: str | None = None
    sabotage: str | None = None

    def check(self) -> None:
        if self.messages < 10:
            raise ConfigError("--messages must be at least 10")
        in_range("--lease", self.lease, LEASE_RANGE)
        if not 0 <= self.duplicates <= 0.9:
            raise ConfigError("--duplicates is a share of --messages, between 0 and 0.9")
        if self.poison < 0 or self.poison > self.messages // 10:
            raise ConfigError("--poison must be between 0 and a tenth of --messages")
        if self.transactional and not backends.for_url(self.store).transactional:
            kinds = " or ".join(f"{s}://" for s in backends.transactional())
            raise ConfigError(f"--transactional needs a {kinds} store")
        if self.fenced and self.transactional:
            raise ConfigError(
                "--fenced and --transactional are two ways to keep effects once: choose one"
            )
        if self.sabotage is not None and self.sabotage not in SABOTAGE:
            raise ConfigError(f"--sabotage must be one of {', '.join(SABOTAGE)}")
        if self.run_id is not None and not self.run_id.replace("-", "").isalnum():
            raise ConfigError("--run-id may hold letters, digits and '-' only")


@dataclass
class Progress:
    phase: str = "prepare"
    produced: int = 0
    handled: int = 0
    kills: int = 0
    rebalances: int = 0
    faults: int = 0


@dataclass
class Fault:
    kind: str
    """``pause`` (SIGSTOP of the local server), ``lock`` (SQLite: an exclusive lock held),
    ``command`` (--store-fault-cmd)."""
    seconds: float
    started: float = 0.0
    ended: float = 0.0
    effects_during: int = 0
    """Effects recorded while the store was out: handlers claimed before it went."""
    consumer_exits: int = 0
    failed_closed: bool = True
    """Whether the outage cost nothing: no key lost, no effect repeated but those it and
    the kills explain (the consumers waited instead of passing messages unfinished)."""


@dataclass
class Effect:
    key: str
    pid: int
    sent: float
    handled: float


@dataclass
class VerifyReport:
    run_id: str
    topic: str
    store: str
    mode: str
    guarantee: str
    messages: int
    keys: int
    partitions: int
    consumers: int
    poison_planted: int
    kills: int = 0
    kills_mid_handler: int = 0
    rebalances: int = 0
    consumer_exits: int = 0
    faults: list[Fault] = field(default_factory=list)
    effects: int = 0
    lost: list[str] = field(default_factory=list)
    duplicate_effects: int = 0
    duplicates_allowed: int = 0
    duplicates_unexplained: int = 0
    dead_letters: int = 0
    poison_missing: list[str] = field(default_factory=list)
    dead_letters_unexpected: list[str] = field(default_factory=list)
    lag_left: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    seconds: float = 0.0
    throughput: float = 0.0
    kept: bool = False
    timed_out: bool = False
    fenced: bool = False
    effects_replaced: int = 0
    """--fenced: effects a takeover's write replaced (a killed attempt's, left before its
    completion)."""
    late_writes_refused: int = 0
    """--fenced: writes refused by the fence (a zombie's, under an older token)."""
    fence_mismatches: list[str] = field(default_factory=list)
    """--fenced: keys whose standing effect carries another token than the attempt that
    completed the key (a stale write that landed: the fence failed)."""

    @property
    def problems(self) -> list[str]:
        found = []
        if self.timed_out:
            found.append(f"not drained in time: {self.lag_left} message(s) not committed")
        if self.lost:
            found.append(f"{len(self.lost)} key(s) lost")
        if self.duplicate_effects > self.duplicates_allowed:
            found.append(
                f"{self.duplicate_effects} duplicate effect(s), the guarantee allows "
                f"{self.duplicates_allowed}"
            )
        if self.fence_mismatches:
            found.append(
                f"{len(self.fence_mismatches)} key(s) whose effect is not their completing "
                "attempt's (a stale write landed)"
            )
        if self.poison_missing:
            found.append(f"{len(self.poison_missing)} poison key(s) not dead-lettered")
        if self.dead_letters_unexpected:
            found.append(f"{len(self.dead_letters_unexpected)} good key(s) dead-lettered")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document["lost"] = len(self.lost)
        document["lost_keys"] = self.lost[:100]
        document["poison_missing"] = self.poison_missing[:100]
        document["dead_letters_unexpected"] = self.dead_letters_unexpected[:100]
        document["fence_mismatches"] = self.fence_mismatches[:100]
        document["problems"] = self.problems
        document["ok"] = self.ok
        return document


def guarantee_of(plan: Plan) -> tuple[str, str]:
    """The mode under test and what it promises."""
    if plan.transactional:
        return "transactional", "effect and completion commit together: no duplicate effect"
    if plan.fenced:
        return "fenced effects", (
            "each effect written through the fence: a takeover's replaces what a killed "
            "attempt left, a late one is refused by its token: no duplicate effect"
        )
    return "at-least-once effects", (
        f"an effect repeats only when a SIGKILL lands between it and its key's completion: "
        f"at most {repeats_per_kill()} a kill (the handler running and 2 x --complete-batch "
        f"{COMPLETE_BATCH} completions not acknowledged yet)"
    )


class Duplicates(NamedTuple):
    duplicate_effects: int
    duplicates_allowed: int
    duplicates_unexplained: int
    kills_mid_handler: int


def judge(
    effects: list[Effect],
    killed: dict[int, float],
    faults: list[Fault],
    plan: Plan,
    most: int | None = None,
) -> Duplicates:
    """The duplicate effects, those the guarantee allows, the unexplained ones and the kills
    that landed mid-handler, for the ledger's ``effects`` in the order written, ``killed`` PID ->
    when it was SIGKILLed (wall clock). Every effect of a key but its last was repeated: it is
    explained when its process was killed after it (at most ``most`` a kill, by default
    ``repeats_per_kill()``: consume's own bound with the defaults verify's consumers run), or, out
    of transactional mode, when it was recorded while a store fault could keep its key from
    being completed (from a lease before the fault to its end)."""
    by_key: dict[str, list[Effect]] = {}
    for effect in effects:
        by_key.setdefault(effect.key, []).append(effect)
    cut_off: Counter[int] = Counter()
    by_fault = unexplained = duplicates = 0
    for repeated in by_key.values():
        for effect in repeated[:-1]:
            duplicates += 1
            if effect.pid in killed and effect.handled <= killed[effect.pid]:
                cut_off[effect.pid] += 1
            elif any(f.started - plan.lease <= effect.handled <= f.ended for f in faults):
                by_fault += 1
            else:
                unexplained += 1
    if plan.transactional or plan.fenced:
        return Duplicates(duplicates, 0, duplicates, len(cut_off))
    most = repeats_per_kill() if most is None else most
    over = sum(max(0, n - most) for n in cut_off.values())
    allowed = sum(min(n, most) for n in cut_off.values()) + by_fault
    return Duplicates(duplicates, allowed, unexplained + over, len(cut_off))


def fence_mismatches(tokens: dict[str, int], completed: Callable[[str], int | None]) -> list[str]:
    """--fenced: the keys whose standing effect carries another token (``tokens``: key ->
    the token its effect was written under) than the attempt that completed the key
    (``completed``: key -> its record's token, None if it never completed)."""
    return sorted(k for k, token in tokens.items() if completed(k) != token)


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


@dataclass
class _Messages:
    """What verify produces: each key once, its duplicates, and the poison among them."""

    keys: list[str]
    poison: set[str]
    dropped: set[str]
    order: list[tuple[str, bool]]
    """(key, whether this copy goes to another partition than the key's first)."""

    @classmethod
    def plan(cls, plan: Plan, run: str) -> _Messages:
        rng = random.Random(run)
        unique = plan.messages - int(plan.messages * plan.duplicates)
        keys = [f"verify-{run}-{i}" for i in range(unique)]
        poison = set(rng.sample(keys, plan.poison))
        dropped = set()
        if plan.sabotage == "lose":
            dropped = {k for i, k in enumerate(keys) if i % 50 == 7 and k not in poison}
        order = [(k, False) for k in keys]
        order += [(rng.choice(keys), i % 2 == 1) for i in range(plan.messages - unique)]
        rng.shuffle(order)
        return cls(keys, poison, dropped, order)

    @property
    def expected(self) -> set[str]:
        """Keys that must end with an effect."""
        return set(self.keys) - self.poison


REBALANCE_EVERY = 5.0
"""Seconds between a consumer joining and leaving, under --rebalance (the first joins 1 s
into the run)."""
STALLED = 15.0
"""Seconds without a message handled after which a kill or a rebalance that is due goes
ahead all the same."""


class _Chaos:
    """When to kill a consumer (every ``kill_every`` seconds) and, under --rebalance, when
    one joins or leaves (1 s in, then every REBALANCE_EVERY). Either waits until a message
    was handled since the last of them, or STALLED seconds have gone by without one. Each
    makes the group rebalance: where that takes longer than ``kill_every`` (a loaded
    machine), kills on the clock alone would keep the group from ever settling. After
    STALLED seconds with nothing handled, the chaos goes on all the same: a run without
    progress is not held back by verify."""

    def __init__(self, started: float, kill_every: float, rebalance: bool) -> None:
        self.every = {"kill": kill_every, "rebalance": REBALANCE_EVERY}
        self.next = {
            "kill": started + kill_every if kill_every > 0 else float("inf"),
            "rebalance": started + 1.0 if rebalance else float("inf"),
        }
        self.handled, self.last = 0, started  # at the last kill or rebalance

    def due(self, now: float, handled: int) -> list[str]:
        """What to do at ``now`` with ``handled`` messages handled: "kill", "rebalance"."""
        acts = []
        for act, at in self.next.items():
            if now >= at and (handled > self.handled or now - self.last >= STALLED):
                acts.append(act)
                self.next[act] = now + self.every[act]
                self.handled, self.last = handled, now
        return acts
