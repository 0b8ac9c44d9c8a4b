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
