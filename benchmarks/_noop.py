"""The no-op handler of benchmarks/scale.py's `idemctl consume` processes."""

from __future__ import annotations

from typing import Any


def handle(event: Any) -> None:
    return None
