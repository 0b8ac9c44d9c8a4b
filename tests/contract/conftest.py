from __future__ import annotations

from collections.abc import Iterator

import pytest

from idemctl.stores.base import Store
from tests.backends import BACKENDS, Backend


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> Backend:
    b = BACKENDS[request.param](request)
    b.reset()
    return b


@pytest.fixture
def store(backend: Backend) -> Iterator[Store]:
    s = backend.open()
    yield s
    s.close()
