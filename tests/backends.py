"""Every store the contract suite runs on. A new backend joins by adding one entry to
BACKENDS: a function that takes pytest's request and returns a Backend (starting its server
through a session fixture if it needs one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from idemctl.stores import open_store
from idemctl.stores.base import Store


@dataclass
class Backend:
    name: str
    url: str
    """Opens the same store from another process; empty for stores that live in one process."""
    open: Callable[[], Store]
    reset: Callable[[], None] = lambda: None


def _memory(request: pytest.FixtureRequest) -> Backend:
    from idemctl.stores.memory import MemoryStore

    store = MemoryStore()
    return Backend("memory", "", lambda: store)


def _sqlite(request: pytest.FixtureRequest) -> Backend:
    tmp = request.getfixturevalue("tmp_path")
    url = f"sqlite:///{tmp}/contract.db"
    return Backend("sqlite", url, lambda: open_store(url))


BACKENDS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "memory": _memory,
    "sqlite": _sqlite,
}
