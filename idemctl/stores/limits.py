"""The protocol's limits, and the checks of a caller's arguments every store makes (sync
and async alike) before it sends anything."""

from __future__ import annotations

from collections.abc import Sequence

from idemctl.durations import MAX_DURATION, check_duration
from idemctl.errors import ConfigError
from idemctl.model import ClaimRequest, Guard, validate_key, validate_sequence

DEFAULT_LEASE = 30.0
"""Seconds a claim holds a key before another worker may take it over."""
DEFAULT_RETENTION = 7 * 86400.0
"""Seconds a completed or failed key is remembered: Kafka's default topic retention."""
LEASE_RANGE = (0.001, 7 * 86400.0)
"""A lease from 1 ms (what Redis counts in) to 7 days (a heartbeat extends a longer run)."""
RETENTION_RANGE = (0.001, MAX_DURATION)
"""A retention from 1 ms to 10 years: 0 would remember no key at all."""


def check_claims(requests: Sequence[ClaimRequest]) -> None:
    """InvalidKey for the first request whose key the rule refuses, before any is claimed."""
    for r in requests:
        validate_key(r.key)


def check_guards(guards: Sequence[Guard]) -> None:
    """InvalidKey or InvalidSequence for the first guard the rules refuse."""
    for g in guards:
        validate_key(g.entity, "entity")
        validate_sequence(g.sequence)


def in_range(what: str, seconds: float, bounds: tuple[float, float]) -> float:
    """``seconds``, or ConfigError naming ``what`` and the range it must lie in."""
    try:
        return check_duration(what, seconds, *bounds)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def checked(name: str, seconds: float) -> float:
    """A lease's or a retention's seconds (``name``), checked against its range."""
    return in_range(name, seconds, LEASE_RANGE if name == "lease" else RETENTION_RANGE)
