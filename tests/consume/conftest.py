"""What the consume tests share: a store of each kind the consumer runs on."""

from __future__ import annotations

from pathlib import Path

import pytest

from idemctl import open_store
from tests.backends import QUICK_FAMILIES, unique_prefix, unique_schema


@pytest.fixture(params=QUICK_FAMILIES)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/consume.db"
    if request.param == "redis":
        server = request.getfixturevalue("redis_server")
        return f"redis://127.0.0.1:{server.port}/0?prefix={unique_prefix()}"
    url: str = request.getfixturevalue("postgres_server").url(schema=unique_schema())
    with open_store(url) as s:
        s.provision()
    return url
