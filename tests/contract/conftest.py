from __future__ import annotations

from collections.abc import Iterator

import pytest

from idemctl.stores.base import Store
from tests.backends import BACKENDS, Backend
from tests.contract.api import APIS, on_api


@pytest.fixture(params=APIS)
def api(request: pytest.FixtureRequest) -> str:
    """Which API the test drives the store through (see tests/contract/api.py)."""
    return str(request.param)


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, api: str) -> Backend:
    b = BACKENDS[request.param](request)
    b.reset()
    return on_api(b, api)


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    s = backend.open()
    yield s
    s.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the async API on DynamoDB: it is ``idemctl.aio.AsyncStore``, the thread
    wrapper the async runs on SQLite and memory test already, and not a driver of its own;
    on moto's server, the suite's slowest store, it cost a minute of CI."""
    dropped = [i for i in items if _params(i) == {"backend": "dynamodb", "api": "async"}]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [i for i in items if id(i) not in gone]


def _params(item: pytest.Item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return {}
    return {k: callspec.params.get(k) for k in ("backend", "api")}
