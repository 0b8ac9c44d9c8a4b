"""The Kafka message policy that consume and the FastStream middleware share, without
Kafka: keying, what each outcome comes to, the breaker and the refusal back-off."""

from __future__ import annotations

import pytest

from idemctl.consume.options import ConsumeOptions
from idemctl.errors import AttemptsExhausted, ConfigError, ConsumeAborted
from idemctl.kafka.keys import Message
from idemctl.kafka.policy import (
    MAX_BACKOFF,
    Act,
    Breaker,
    Decision,
    Keying,
    Refusals,
    decide,
    flag,
    keyword,
    log_line,
)
from idemctl.model import Order
from idemctl.runner import Outcome, RunResult, Step


def options(**kw: object) -> ConsumeOptions:
    return ConsumeOptions("127.0.0.1:9092", ["t"], "g", **kw)  # type: ignore[arg-type]


def message(value: bytes | None, headers: list[tuple[str, bytes | None]] | None = None) -> Message:
    return Message("t", 1, 7, value, headers or [])


def test_keying_takes_the_key_fingerprint_and_order() -> None:
    keying = Keying(options(order_key="acct:{a}", sequence="seq"))
    a = keying.admit(message(b'{"a": 1, "seq": 3}', [("idempotency-key", b"k-1")]))
    assert (a.key, a.order, a.bad) == ("k-1", Order("acct:1", 3), None)
    assert a.fingerprint is not None and keying.ordered


def test_a_message_without_a_key_follows_on_missing_key() -> None:
    bare = message(b'{"a": 1}')
    assert Keying(options()).admit(bare).bad == (
        "no idempotency key",
        "no 'idempotency-key' header",
    )
    assert Keying(options(on_missing_key="offset")).admit(bare).key == "t-1-7"
    with pytest.raises(ConsumeAborted, match=r"t\[1\]@7: .*stopping \(--on-missing-key stop\)"):
        Keying(options(on_missing_key="stop")).admit(bare)
    with pytest.raises(ConsumeAborted, match=r"stopping \(on_missing_key='stop'\)"):
        Keying(options(on_missing_key="stop"), keyword).admit(bare)


def test_a_template_the_first_message_cannot_fill_refuses_but_a_later_one_dead_letters() -> None:
    keying = Keying(options(key="template:{missing}"))
    with pytest.raises(ConfigError, match=r"--key template:\{missing\} cannot work"):
        keying.admit(message(b'{"a": 1}'))
    assert keying.admit(message(b'{"a": 1}')).bad is not None  # not the first any more
    with pytest.raises(ConfigError, match=r"key='template:\{missing\}' cannot work"):
        Keying(options(key="template:{missing}"), keyword).admit(message(b'{"a": 1}'))


@pytest.mark.parametrize(
    ("outcome", "act", "counted"),
    [
        (Outcome.EXECUTED, Act.FINISH, "executed"),
        (Outcome.REPLAYED, Act.FINISH, "replayed"),
        (Step.RAN, Act.PENDING, "ran"),
        (Step.RELEASED, Act.PENDING, "released"),
        (Step.HELD, Act.PENDING, "held"),
        (Outcome.BUSY, Act.PAUSE, "busy"),
        (Outcome.LEASE_LOST, Act.PAUSE, "lease_lost"),
        (Step.UNAVAILABLE, Act.PAUSE, "store_unavailable"),
        (Outcome.MISMATCH, Act.DEAD_LETTER, ""),
        (Outcome.FAILED, Act.DEAD_LETTER, ""),
    ],
)
def test_each_outcome_comes_to_one_act(outcome: Outcome, act: Act, counted: str) -> None:
    d = decide(RunResult(outcome, "k"), options(backoff=2.0), "k")
    assert (d.act, d.outcome) == (act, counted)
    if act is Act.PAUSE:
        assert d.delay == 2.0


def test_a_stale_event_is_finished_or_dead_lettered_as_on_stale_says() -> None:
    result = RunResult(Outcome.STALE, "k", last=9)
    skipped = decide(result, options(), "k", Order("acct:1", 4))
    assert (skipped.act, skipped.outcome) == (Act.FINISH, "stale")
    assert skipped.detail == "entity 'acct:1' applied sequence 9; this event is 4"
    dead = decide(result, options(on_stale="dlq"), "k", Order("acct:1", 4))
    assert (dead.act, dead.outcome, dead.reason) == (Act.DEAD_LETTER, "stale", "stale event")


def test_a_failure_is_retried_with_a_doubling_back_off_then_dead_lettered() -> None:
    boom = RuntimeError("boom")
    o = options(max_attempts=3, backoff=0.5)
    first = decide(RunResult(Outcome.ERROR, "k", error=boom, attempt=1, retriable=True), o, "k")
    second = decide(RunResult(Outcome.ERROR, "k", error=boom, attempt=2, retriable=True), o, "k")
    assert (first.act, first.delay, second.delay) == (Act.PAUSE, 0.5, 1.0)
    assert first.detail == "RuntimeError: boom" and first.attempt == 1
    last = decide(RunResult(Outcome.ERROR, "k", error=boom, attempt=3, retriable=True), o, "k")
    assert (last.act, last.reason, last.error) == (Act.DEAD_LETTER, "failed 3 times", boom)
    permanent = decide(RunResult(Outcome.ERROR, "k", error=boom, attempt=1), o, "k")
    assert permanent.reason == "permanent failure"
    exhausted = RunResult(Outcome.ERROR, "k", error=AttemptsExhausted("x"), attempt=1)
    assert decide(exhausted, o, "k").reason == "failed 3 times"


def test_log_lines_name_where_and_why() -> None:
    hold = Decision(Act.PAUSE, "busy", 1.5)
    level, text, args = log_line(hold, "t[1]@7", "k")
    assert (level, text % args) == ("debug", "busy t[1]@7: key 'k'; pausing its partition 1.5s")
    retried = Decision(Act.PAUSE, "retried", 1.0, detail="RuntimeError: boom", attempt=2)
    level, text, args = log_line(retried, "t[1]@7", "k")
    assert (level, text % args) == ("info", "k failed (attempt 2), retrying: RuntimeError: boom")


def test_the_breaker_trips_once_on_a_run_of_one_reason_and_a_success_resets_it() -> None:
    breaker = Breaker(3)
    assert [breaker.dead_lettered("a"), breaker.dead_lettered("a")] == [False, False]
    assert breaker.dead_lettered("b") is False  # another reason starts again
    assert [breaker.dead_lettered("b"), breaker.dead_lettered("b")] == [False, True]
    assert breaker.storm("x", "t.dlq", flag).startswith(
        "3 messages in a row were dead-lettered for the same reason (b: x); stopping "
        "(--dlq-breaker 3): they are in t.dlq"
    )
    breaker.ran()
    assert [breaker.dead_lettered("b") for _ in range(2)] == [False, False]
    assert not any(Breaker(0).dead_lettered("a") for _ in range(50))  # 0: never


def test_refused_dead_letters_back_off_doubling_per_partition_up_to_the_cap() -> None:
    refusals = Refusals(1.0)
    waits = [refusals.refused(("t", 0)) for _ in range(8)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, MAX_BACKOFF, MAX_BACKOFF]
    assert refusals.refused(("t", 1)) == 1.0  # partitions apart
    refusals.accepted(("t", 0))
    assert refusals.refused(("t", 0)) == 1.0
