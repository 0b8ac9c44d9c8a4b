"""audit's Judge without servers: each rule of its docstring, from a key's Record (or none)
to a class; and the AuditOptions that audit refuses."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idemctl.audit import AuditOptions, Judge, Judgement, Seen
from idemctl.errors import ConfigError
from idemctl.model import Order, Record, Status

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
RETENTION = 7 * 86400.0
FP = "f" * 64


def record(status: Status, **kw: Any) -> Record:
    fields: dict[str, Any] = {
        "key": "k",
        "status": status,
        "fingerprint": FP,
        "owner": None,
        "fencing_token": 1,
        "attempts": 1,
        "created_at": NOW - timedelta(minutes=5),
        "updated_at": NOW - timedelta(minutes=4),
    }
    if status is Status.COMPLETED:
        fields["completed_at"] = NOW - timedelta(minutes=4)
    if status is Status.FAILED:
        fields["error"] = "ValueError: card number is invalid"
    fields.update(kw)
    return Record(**fields)


def seen(offset: int = 0, *, age: timedelta | None = timedelta(minutes=5), **kw: Any) -> Seen:
    kw.setdefault("key", f"k-{offset}")
    kw.setdefault("fingerprint", FP)
    return Seen(0, offset, None if age is None else NOW - age, **kw)


def judge(**kw: Any) -> Judge:
    return Judge(NOW, RETENTION, **kw)


def test_a_completed_key_is_done() -> None:
    assert judge()(seen(), record(Status.COMPLETED, result={"ok": 1})) == Judgement("done")
    # a null result is done too, without the sequence guard
    assert judge()(seen(), record(Status.COMPLETED)) == Judgement("done")


def test_a_key_completed_for_another_payload_was_dead_lettered() -> None:
    other = record(Status.COMPLETED, fingerprint="0" * 64, result=1)
    assert judge()(seen(), other).kind == "dead_lettered"
    # the message has no fingerprint (no payload), or the record none: nothing to compare
    assert judge()(seen(fingerprint=None), other).kind == "done"
    assert judge()(seen(), record(Status.COMPLETED, fingerprint=None)).kind == "done"


def test_a_failed_key_was_dead_lettered() -> None:
    assert judge()(seen(), record(Status.FAILED)) == Judgement("dead_lettered")


def test_an_in_progress_key_with_a_live_lease_is_in_flight() -> None:
    live = record(Status.IN_PROGRESS, owner="worker-2", lease_expires_at=NOW + timedelta(seconds=1))
    assert judge()(seen(), live) == Judgement("in_flight")


def test_an_in_progress_key_whose_lease_expired_is_lost() -> None:
    expired = record(Status.IN_PROGRESS, owner="worker-2", lease_expires_at=NOW)
    verdict = judge()(seen(), expired)
    assert verdict.kind == "lost"
    assert verdict.why is not None and "expired lease" in verdict.why


def test_a_released_key_is_lost() -> None:
    released = record(Status.IN_PROGRESS, owner=None, lease_expires_at=NOW + timedelta(hours=1))
    verdict = judge()(seen(), released)
    assert verdict.kind == "lost"
    assert verdict.why is not None and "released" in verdict.why


def test_an_absent_key_is_lost_while_young_and_beyond_retention_once_older() -> None:
    young = judge()(seen(age=timedelta(days=7) - timedelta(seconds=1)), None)
    assert young.kind == "lost"
    assert young.why is not None and "no record" in young.why
    old = judge()(seen(age=timedelta(days=7, seconds=1)), None)
    assert old == Judgement("beyond_retention")
    # the store's retention decides, not a fixed week
    assert Judge(NOW, 60.0)(seen(age=timedelta(minutes=2)), None) == Judgement("beyond_retention")
    assert Judge(NOW, 600.0)(seen(age=timedelta(minutes=2)), None).kind == "lost"


def test_an_absent_key_without_a_timestamp_is_lost() -> None:
    assert judge()(seen(age=None), None).kind == "lost"


@pytest.mark.parametrize(
    ("on_missing_key", "kind"),
    [("dlq", "dead_lettered"), ("skip", "skipped"), ("stop", "lost"), ("fail", "lost")],
)
def test_a_message_without_a_usable_key_is_judged_by_on_missing_key(
    on_missing_key: str, kind: str
) -> None:
    unusable = seen(key=None, fingerprint=None, unusable="no idempotency key")
    verdict = judge(on_missing_key=on_missing_key)(unusable, None)
    assert verdict.kind == kind
    if kind == "lost":  # consume stops before such a message: the group could not pass it
        assert verdict.why is not None and "no idempotency key" in verdict.why


def test_a_dead_lettered_message_missing_from_the_dead_letter_topic_is_lost() -> None:
    checked = judge(dead_letters={(0, 1), (0, 3)})
    unusable: dict[str, Any] = {"key": None, "fingerprint": None, "unusable": "no idempotency key"}
    assert checked(seen(1, **unusable), None) == Judgement("dead_lettered")
    assert checked(seen(3), record(Status.FAILED)) == Judgement("dead_lettered")
    for verdict in (
        checked(seen(2, **unusable), None),
        checked(seen(4), record(Status.FAILED)),
        checked(seen(5), record(Status.COMPLETED, fingerprint="0" * 64)),
    ):
        assert verdict.kind == "lost"
        assert verdict.why is not None and "dead-letter topic" in verdict.why
    # another partition's offset 1 is not this one's
    assert Judge(NOW, RETENTION, dead_letters={(1, 1)})(seen(1, **unusable), None).kind == "lost"
    # the rest is judged as without the cross-check
    assert checked(seen(6), record(Status.COMPLETED)) == Judgement("done")
    assert checked(seen(7), None).kind == "lost"


def event(offset: int, sequence: int, entity: str = "account:1") -> Seen:
    return seen(offset, key=f"ev-{entity}-{sequence}", order=Order(entity, sequence))


def test_the_sequence_guard_finds_an_event_completed_without_a_result_after_a_newer_one_stale() -> (
    None
):
    j = judge()
    applied = {"balance": 1}
    assert j(event(0, 1), record(Status.COMPLETED, result=applied)).kind == "done"
    assert j(event(1, 3), record(Status.COMPLETED, result=applied)).kind == "done"
    # 2 came after 3: the guard completed its key with a null result
    assert j(event(2, 2), record(Status.COMPLETED, result=None)) == Judgement("stale")
    # another entity's history is its own
    assert j(event(3, 2, "account:2"), record(Status.COMPLETED, result=None)).kind == "done"
    # a later sequence of the first entity is done
    assert j(event(4, 4), record(Status.COMPLETED, result=None)).kind == "done"


def test_an_event_at_a_lower_sequence_completed_with_a_result_stays_done() -> None:
    j = judge()
    assert j(event(0, 1), record(Status.COMPLETED, result=None)).kind == "done"
    assert j(event(1, 3), record(Status.COMPLETED, result=None)).kind == "done"
    assert j(event(2, 2), record(Status.COMPLETED, result={"balance": 2})) == Judgement("done")
    # and it does not lower what the entity applied: another event at 2, without a result,
    # is stale (the same key again would be a replayed duplicate: done)
    again = seen(3, key="ev-account:1-2-again", order=Order("account:1", 2))
    assert j(again, record(Status.COMPLETED, result=None)) == Judgement("stale")
    assert j(event(4, 2), record(Status.COMPLETED, result=None)) == Judgement("done")


def test_without_the_sequence_guard_nothing_is_stale() -> None:
    j = judge()
    for offset, sequence in enumerate((1, 3, 2)):
        plain = seen(offset, key=f"ev-{sequence}")  # no order: audited without --order-key
        assert j(plain, record(Status.COMPLETED, result=None)).kind == "done"


def options(**kw: Any) -> AuditOptions:
    return AuditOptions("127.0.0.1:9092", "orders", "billing", **kw)


def test_audit_options_take_valid_settings() -> None:
    o = options(on_missing_key="skip", order_key="account:{account}", sequence="seq", last=1)
    assert (o.last, o.order_key, o.sequence) == (1, "account:{account}", "seq")
    assert options(rate=0.5).rate == 0.5


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"on_missing_key": "ignore"}, "--on-missing-key 'ignore'"),
        ({"order_key": "account:{account}"}, "go together"),
        ({"sequence": "seq"}, "go together"),
        ({"last": 0}, "--last"),
        ({"last": -5}, "--last"),
        ({"rate": 0}, "--rate"),
        ({"rate": -1.0}, "--rate"),
        ({"batch": 0}, "--batch"),
        ({"timeout": 0}, "timeout"),
    ],
)
def test_audit_options_refuse_bad_settings_with_a_config_error(
    kw: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        options(**kw)


def test_a_redelivered_duplicate_of_an_applied_event_is_done_not_stale() -> None:
    """consume replays a duplicate of an applied event (its key completed): it never reaches
    the guard, and the README counts a replayed duplicate done."""
    j = judge()
    assert j(event(0, 1), record(Status.COMPLETED, result=None)).kind == "done"
    assert j(event(1, 3), record(Status.COMPLETED, result=None)).kind == "done"
    assert j(event(2, 3), record(Status.COMPLETED, result=None)) == Judgement("done")


def test_a_key_that_failed_retriably_and_was_passed_is_lost() -> None:
    """consume dead-letters a key only once it failed for good (retriable False: a last
    attempt, a permanent error); a retriable failure waits for the next delivery, and below
    the committed offset none will come."""
    verdict = judge()(seen(), record(Status.FAILED, retriable=True))
    assert verdict.kind == "lost"
