"""Shared fixtures. Backends for the contract suite live in tests/backends.py.

The suite runs in parallel pytest-xdist workers (pyproject's addopts; serially: ``-n 0``).
Each worker starts servers of its own, on ports of its own (tests/servers.py), with temp
dirs under its own basetemp: tests share nothing across workers."""

from __future__ import annotations

import os

import pytest

# Each test's CPU seconds, with IDEMCTL_TEST_CPU=FILE (tests/cputime.py).
from tests.cputime import pytest_runtest_protocol

# Session fixtures that start real servers (tests/servers.py), shared by every test folder.
from tests.fixtures_dynamodb import aws_credentials, moto_server
from tests.fixtures_kafka import kafka_broker
from tests.fixtures_postgres import postgres_server
from tests.fixtures_redis import redis_cluster, redis_server, redis_with_password

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}

# The tests' idemctl processes inherit this environment: their log lines take the default
# form (--log-format auto), whatever the developer's shell exports.
os.environ.pop("IDEMCTL_LOG_FORMAT", None)

__all__ = [
    "IN_CI",
    "aws_credentials",
    "kafka_broker",
    "moto_server",
    "need",
    "postgres_server",
    "pytest_runtest_protocol",
    "redis_cluster",
    "redis_server",
    "redis_with_password",
]


def need(condition: bool, reason: str) -> None:
    """Skip locally when a server or tool is missing; fail in CI, where it must be there."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI must provide this: {reason}")
    pytest.skip(reason)
