"""What a python block of the manual left behind, checked after it ran (a block names one
with ``<!-- test: check=NAME -->``); most blocks check themselves with ``assert``."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def wrote_the_default_store(namespace: dict[str, Any]) -> None:
    """The block made and used ``./idemctl.db``, the default store, in its directory."""
    assert Path("idemctl.db").exists()
