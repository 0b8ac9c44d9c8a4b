"""A session-wide moto server (DynamoDB over HTTP), started on first use and stopped by PID
at the end of the session (also when tests fail). Tests share it through tables of their
own.

``aws_credentials`` puts fake AWS credentials in ``os.environ`` for the rest of the session,
so that boto3 in this process and in the processes tests spawn can sign requests without
looking anywhere else (a profile, the EC2 metadata endpoint)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servers import MotoServer, fake_aws_env


@pytest.fixture(scope="session")
def aws_credentials() -> Iterator[None]:
    with fake_aws_env():
        yield


@pytest.fixture(scope="session")
def moto_server(
    tmp_path_factory: pytest.TempPathFactory, aws_credentials: None
) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        server.start()
        yield server
    finally:
        server.stop()
