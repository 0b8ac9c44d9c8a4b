"""Payload fingerprints, key validation and the record's JSON shape and time rules."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from idemctl.errors import InvalidKey, InvalidPayload
from idemctl.model import MAX_KEY_BYTES, Finding, Record, Status, fingerprint, validate_key

HEX64 = re.compile(r"[0-9a-f]{64}")
T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


# fingerprint() -------------------------------------------------------------------------


def test_fingerprint_ignores_dict_key_order() -> None:
    assert fingerprint({"a": 1, "b": {"x": 1, "y": 2}}) == fingerprint(
        {"b": {"y": 2, "x": 1}, "a": 1}
    )


def test_fingerprint_ignores_json_whitespace_and_key_order_in_bytes_and_str() -> None:
    compact = b'{"a":1,"b":[1,2]}'
    spaced = b'{\n  "b": [1, 2],\n  "a": 1\n}\n'
    assert fingerprint(compact) == fingerprint(spaced)
    assert fingerprint(compact.decode()) == fingerprint(spaced.decode())
    assert fingerprint(compact) == fingerprint(spaced.decode())


def test_fingerprint_of_json_bytes_equals_fingerprint_of_the_value() -> None:
    assert fingerprint(b'{"a":1}') == fingerprint({"a": 1})
    assert fingerprint('{"a": 1}') == fingerprint({"a": 1})
    assert fingerprint(bytearray(b'{"a":1}')) == fingerprint({"a": 1})


def test_fingerprint_is_a_sha256_hex_digest() -> None:
    assert HEX64.fullmatch(fingerprint({"a": 1}))


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ({"a": 1}, {"a": 2}),
        ({"a": 1}, {"b": 1}),
        ({"a": 1}, {"a": "1"}),
        ([1, 2], [2, 1]),
        (b'{"a":1}', b'{"a":2}'),
    ],
)
def test_fingerprint_differs_for_different_values(left: object, right: object) -> None:
    assert fingerprint(left) != fingerprint(right)


def test_non_json_bytes_are_hashed_raw_and_stably() -> None:
    raw = b"\x00\xffnot json at all"
    first = fingerprint(raw)
    assert HEX64.fullmatch(first)
    assert fingerprint(raw) == first
    assert fingerprint(b"\x00\xffnot json at all!") != first


def test_non_json_text_is_hashed_raw() -> None:
    import hashlib

    assert fingerprint("hello world") == hashlib.sha256(b"hello world").hexdigest()


def test_fields_pick_parts_and_ignore_the_rest() -> None:
    one = {"order": {"id": "o1", "amount": 100}, "sent_at": "2026-01-01T00:00:00Z"}
    two = {"order": {"id": "o2", "amount": 100}, "sent_at": "2026-06-30T12:00:00Z"}
    assert fingerprint(one, fields=["order.amount"]) == fingerprint(two, fields=["order.amount"])
    assert fingerprint(one) != fingerprint(two)
    three = {"order": {"id": "o1", "amount": 101}, "sent_at": "2026-01-01T00:00:00Z"}
    assert fingerprint(one, fields=["order.amount"]) != fingerprint(three, fields=["order.amount"])


def test_fields_work_on_json_bytes_too() -> None:
    assert fingerprint(b'{"order": {"amount": 5}, "ts": 1}', fields=["order.amount"]) == (
        fingerprint({"order": {"amount": 5}, "ts": 2}, fields=["order.amount"])
    )


def test_missing_field_raises_invalid_payload_naming_it() -> None:
    with pytest.raises(InvalidPayload, match=r"order\.amount"):
        fingerprint({"order": {"id": "o1"}}, fields=["order.amount"])
    with pytest.raises(InvalidPayload):
        fingerprint({"order": 5}, fields=["order.amount"])


def test_fields_on_non_json_payload_raise_invalid_payload() -> None:
    with pytest.raises(InvalidPayload, match="not JSON"):
        fingerprint(b"\x00\xff binary", fields=["order.amount"])


@pytest.mark.parametrize("payload", [{"a": float("nan")}, float("inf"), b'{"a": NaN}'])
def test_nan_and_infinity_raise_invalid_payload(payload: object) -> None:
    with pytest.raises(InvalidPayload):
        fingerprint(payload)


def test_unserializable_value_raises_invalid_payload() -> None:
    with pytest.raises(InvalidPayload, match="not JSON-serializable"):
        fingerprint({"when": object()})


@pytest.mark.parametrize("payload", [{"name": "bad \ud800"}, ["\udfff"]])
def test_unencodable_string_raises_invalid_payload(payload: object) -> None:
    with pytest.raises(InvalidPayload):
        fingerprint(payload)


# validate_key() --------------------------------------------------------------------------


def test_empty_key_is_invalid_and_a_value_error() -> None:
    with pytest.raises(InvalidKey, match="empty"):
        validate_key("")
    with pytest.raises(ValueError, match="empty"):
        validate_key("")


def test_key_over_512_bytes_is_invalid() -> None:
    with pytest.raises(InvalidKey, match="513 bytes"):
        validate_key("k" * 513)


def test_key_of_exactly_512_bytes_is_valid() -> None:
    assert validate_key("k" * MAX_KEY_BYTES) == "k" * MAX_KEY_BYTES


def test_key_length_is_counted_in_utf8_bytes_not_characters() -> None:
    assert validate_key("é" * 256) == "é" * 256  # 512 bytes
    with pytest.raises(InvalidKey, match="514 bytes"):
        validate_key("é" * 257)  # 257 characters, 514 bytes


def test_non_string_key_is_invalid() -> None:
    with pytest.raises(InvalidKey, match="string"):
        validate_key(b"bytes-key")  # type: ignore[arg-type]


def test_key_that_cannot_be_utf8_encoded_is_invalid_key() -> None:
    with pytest.raises(InvalidKey):
        validate_key("order-\ud800")


# Record ----------------------------------------------------------------------------------


def make_record(**changes: object) -> Record:
    fields: dict[str, object] = {
        "key": "order:1",
        "status": Status.IN_PROGRESS,
        "fingerprint": "f" * 64,
        "owner": "owner-1",
        "fencing_token": 3,
        "attempts": 2,
        "created_at": T0,
        "updated_at": T0 + timedelta(seconds=1),
        "lease_expires_at": T0 + timedelta(seconds=30),
    }
    fields.update(changes)
    return Record(**fields)  # type: ignore[arg-type]


def test_to_json_gives_utc_iso_timestamps_ending_in_z_and_status_as_text() -> None:
    record = make_record(
        status=Status.COMPLETED,
        owner=None,
        lease_expires_at=None,
        completed_at=T0 + timedelta(seconds=2, milliseconds=500),
        expires_at=T0 + timedelta(days=7),
        result={"charged": 100},
    )
    doc = record.to_json()
    assert doc["status"] == "completed"
    assert type(doc["status"]) is str
    assert doc["created_at"] == "2026-01-02T03:04:05Z"
    assert doc["completed_at"] == "2026-01-02T03:04:07.500000Z"
    assert doc["expires_at"] == "2026-01-09T03:04:05Z"
    assert doc["lease_expires_at"] is None
    assert doc["owner"] is None
    assert doc["result"] == {"charged": 100}
    assert doc["fencing_token"] == 3
    assert doc["attempts"] == 2
    assert json.loads(json.dumps(doc)) == doc


def test_to_json_converts_other_timezones_to_utc() -> None:
    plus_two = datetime(2026, 1, 2, 7, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    doc = make_record(created_at=plus_two).to_json()
    assert doc["created_at"] == "2026-01-02T05:04:05Z"


def test_to_json_has_every_field_of_the_record() -> None:
    assert set(make_record().to_json()) == {
        "key",
        "status",
        "fingerprint",
        "owner",
        "fencing_token",
        "attempts",
        "lease_expires_at",
        "created_at",
        "updated_at",
        "completed_at",
        "expires_at",
        "result",
        "error",
        "retriable",
    }


def test_lease_is_live_before_it_expires_and_not_after() -> None:
    record = make_record()
    assert record.lease_live(T0 + timedelta(seconds=29))
    assert not record.stale(T0 + timedelta(seconds=29))
    assert not record.lease_live(T0 + timedelta(seconds=30))
    assert record.stale(T0 + timedelta(seconds=30))


def test_released_in_progress_record_is_released_not_stale_nor_live() -> None:
    """Freed by release or unlock: nobody holds it, but nobody lost it either: it waits for
    the next delivery. Stale is an owner's lease that ran out with nobody freeing it."""
    record = make_record(owner=None, lease_expires_at=T0)
    for at in (T0 - timedelta(seconds=10), T0 + timedelta(seconds=10)):
        assert not record.lease_live(at)
        assert not record.stale(at)
        assert record.released()
    assert not make_record().released()  # owned
    assert not make_record(status=Status.COMPLETED, owner=None).released()


def test_finding_levels() -> None:
    assert Finding("a", True, "fine").level == "ok"
    assert Finding("a", True, "a trade-off", "what it costs", warning=True).level == "warn"
    assert Finding("a", False, "broken", "the fix").level == "fail"
    assert Finding("a", False, "broken", warning=True).level == "fail"  # a failure wins


def test_completed_record_has_no_live_lease_and_is_not_stale() -> None:
    record = make_record(status=Status.COMPLETED, owner=None, lease_expires_at=None)
    assert not record.lease_live(T0)
    assert not record.stale(T0)


def test_retention_is_over_at_and_after_expires_at() -> None:
    record = make_record(status=Status.COMPLETED, expires_at=T0 + timedelta(days=7))
    assert not record.retention_over(T0 + timedelta(days=6))
    assert record.retention_over(T0 + timedelta(days=7))
    assert record.retention_over(T0 + timedelta(days=8))


def test_record_without_expiry_never_runs_out_of_retention() -> None:
    assert not make_record(expires_at=None).retention_over(T0 + timedelta(days=10_000))
