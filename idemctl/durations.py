"""Durations as people write them: ``250ms``, ``30s``, ``5m``, ``1h30m``, ``7d``."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
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
