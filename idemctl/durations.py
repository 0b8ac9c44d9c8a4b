"""Durations as people write them: ``250ms``, ``30s``, ``5m``, ``1h30m``, ``7d``."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
MAX_DURATION = 3650 * 86400.0
"""The longest duration any option takes, 10 years: past it, clocks' arithmetic (a
timestamp in milliseconds, a timeout a thread waits) overflows."""
MAX_TIMEOUT_MS = (2**31 - 1) / 1000
"""The longest timeout librdkafka and PostgreSQL take: 2^31 - 1 ms, about 24.8 days."""
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``text``; a bare number is seconds. Raises ValueError with the accepted forms."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        compact = text.strip().lower().replace(" ", "")
        try:
            seconds = float(compact)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(compact):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(compact) or not compact:
                raise ValueError(
                    f"not a duration: {text!r} (use e.g. 250ms, 30s, 5m, 1h30m, 7d)"
                ) from None
    if not math.isfinite(seconds):
        raise ValueError(f"duration must be a finite number of seconds: {text!r}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {text!r}")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {text!r} is longer than {format_duration(MAX_DURATION)}")
    return seconds


def check_duration(what: str, seconds: float, least: float, most: float = MAX_DURATION) -> float:
    """``seconds`` when it lies in [``least``, ``most``], else ValueError naming ``what``
    and the range, as people write durations."""
    if not least <= seconds <= most:
        raise ValueError(
            f"{what} {format_duration(seconds)} is out of range: use from "
            f"{format_duration(least)} to {format_duration(most)}"
        )
    return seconds


def format_duration(seconds: float) -> str:
    """The inverse, rounded for people: ``90`` -> ``1m30s``."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if round(seconds * 1000) < 1000:
        return f"{round(seconds * 1000)}ms"
    if round(seconds, 1) < 60:
        return f"{seconds:.1f}s".replace(".0s", "s")
    whole = round(seconds)
    out = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            count, whole = divmod(whole, size)
            out.append(f"{count}{unit}")
        if len(out) == 2:
            break
    return "".join(out)
