"""``idemctl.backends``: a backend family joins idemctl through its registry alone. A fake
family (a memory store under another scheme, a Powertools-layout table kept in a dict, a
scratch room) is registered here, and every front end reaches it: ``open_store``, the async
API, the operate layer with its layouts, ``verify``'s scratch room and its fault, ``audit``'s
and ``--transactional``'s checks."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from idemctl import aio, backends, open_store, operate
from idemctl.errors import ConfigError
from idemctl.harness.rooms import Room
from idemctl.harness.scratch import Scratch
from idemctl.harness.verify.plan import Plan
from idemctl.model import Acquired, Completed
from idemctl.stores.memory import MemoryStore
from tests.operate.test_operate import DictTable, powertools_target

SCHEME = "fakestore"


class FakeStore(MemoryStore):
    scheme = SCHEME

    @classmethod
    def from_url(cls, url: str) -> FakeStore:
        return cls(url)


class FakeTable(DictTable):
    @classmethod
    def from_url(cls, url: str, options: Any, layout: Any) -> FakeTable:
        table = powertools_target().table
        assert isinstance(table, DictTable)
        return cls(list(table.items.values()))


class FakeRoom(Room):
    fault = "pause"

    def __init__(self, url: str, run: str, default_store: bool) -> None:
        self.url = f"{url}/verify-{run}"

    def exists(self) -> bool:
        return False

    def left(self) -> int:
        return 0

    def remove(self) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[backends.Backend]:
    here = __name__
    backend = backends.Backend(
        SCHEME,
        (SCHEME, SCHEME + "s"),
        store=f"{here}:FakeStore",
        layouts={"powertools": f"{here}:FakeTable"},
        scratch=f"{here}:FakeRoom",
        shared=False,
    )
    backends.register(backend)
    yield backend
    backends.unregister(backend)
    assert SCHEME not in backends.schemes()


def test_a_registered_family_opens_by_each_of_its_schemes(fake: backends.Backend) -> None:
    for url in (f"{SCHEME}://a", f"{SCHEME}s://b"):
        with open_store(url) as store:
            assert isinstance(store, FakeStore)
            assert isinstance(store.claim("k"), Acquired)
    with pytest.raises(ConfigError, match=f"known: .*{SCHEME}://"):
        open_store("nosuchstore://x")


def test_the_async_api_and_the_operate_layer_reach_it(fake: backends.Backend) -> None:
    async def claimed() -> object:
        async with aio.open_store(f"{SCHEME}://a") as store:
            await store.claim("k")
            return await store.claim("k")

    assert not isinstance(asyncio.run(claimed()), (Acquired, Completed))  # busy: claimed once
    with operate.open_target(f"{SCHEME}://a") as target:
        assert isinstance(target, operate.StoreTarget)
    with operate.open_target(f"{SCHEME}://t?layout=powertools") as table:
        assert isinstance(table, operate.PowertoolsTarget)
        assert operate.inspect(table, "fn#live").key == "fn#live"


def test_verify_and_audit_ask_the_registry(fake: backends.Backend) -> None:
    scratch = Scratch(f"{SCHEME}://a", "r1")
    assert scratch.url == f"{SCHEME}://a/verify-r1" and scratch.room.fault == "pause"
    with pytest.raises(ConfigError, match="--transactional needs a postgresql:// store"):
        Plan(store=f"{SCHEME}://a", brokers="127.0.0.1:9092", transactional=True).check()
    with open_store(f"{SCHEME}://a") as store, pytest.raises(ConfigError, match="one process"):
        operate.audit(store, None)  # type: ignore[arg-type]  # refused before options are read
