"""Durations as operators type them in URLs and flags, and as idemctl prints them."""

from __future__ import annotations

import pytest

from idemctl.durations import MAX_DURATION, check_duration, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("7d", 7 * 86400.0),
        ("2w", 14 * 86400.0),
        ("1.5s", 1.5),
        ("12", 12.0),
        ("0.5", 0.5),
        ("0s", 0.0),
        ("1h0m30s", 3630.0),
        ("1d12h", 129600.0),
        ("5M", 300.0),  # case does not matter
        ("  30s  ", 30.0),  # surrounding spaces are stripped
        ("5 m", 300.0),  # so are spaces inside
        ("1h 30m", 5400.0),
    ],
)
def test_parse_duration_reads_people_forms(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("value", "seconds"), [(12, 12.0), (0, 0.0), (2.5, 2.5)])
def test_parse_duration_takes_numbers_as_seconds(value: float, seconds: float) -> None:
    result = parse_duration(value)
    assert result == seconds
    assert isinstance(result, float)


@pytest.mark.parametrize("text", ["", "   ", "5x", "m5", "5mm", "1h30", "s", "1..5s", "five"])
def test_parse_duration_rejects_garbage_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration") as info:
        parse_duration(text)
    message = str(info.value)
    assert repr(text) in message
    assert "250ms" in message
    assert "1h30m" in message


@pytest.mark.parametrize("value", ["-3s", "-3", -3, -0.5])
def test_parse_duration_rejects_negative_durations(value: str | float) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


def test_negative_bare_number_says_it_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_duration("-3")


@pytest.mark.parametrize("text", ["nan", "inf", "infinity"])
def test_parse_duration_rejects_nan_and_infinity(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25, "250ms"),
        (0, "0ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (30, "30s"),
        (90, "1m30s"),
        (3600, "1h"),
        (5400, "1h30m"),
        (86400 * 2 + 3600, "2d1h"),
        (86400 * 7, "7d"),
    ],
)
def test_format_duration_examples(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_duration_keeps_the_two_largest_units() -> None:
    assert format_duration(86400 + 3600 + 60 + 1) == "1d1h"


def test_format_duration_of_negative_seconds_has_a_minus_sign() -> None:
    assert format_duration(-90) == "-1m30s"


@pytest.mark.parametrize("text", ["250ms", "30s", "1m30s", "2d1h", "7d"])
def test_format_then_parse_round_trips(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


@pytest.mark.parametrize("text", ["99999999999d", "1e300", "3651d"])
def test_a_duration_past_ten_years_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="longer than 3650d"):
        parse_duration(text)
    assert parse_duration("3650d") == MAX_DURATION


def test_check_duration_names_the_setting_and_its_range() -> None:
    assert check_duration("lease", 0.5, 0.001, 7 * 86400) == 0.5
    with pytest.raises(ValueError, match=r"^lease 0ms is out of range: use from 1ms to 7d$"):
        check_duration("lease", 0, 0.001, 7 * 86400)
    with pytest.raises(ValueError, match="lease 8d is out of range"):
        check_duration("lease", 8 * 86400, 0.001, 7 * 86400)
