"""The redis-py client a store URL asks for, sync or on ``redis.asyncio``: its client
options, and the retry policy."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlunsplit

import redis
import redis.asyncio
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from idemctl.errors import ConfigError
from idemctl.stores.redis.client import AsyncClient, PlainClient
from idemctl.stores.redis.errors import translate
from idemctl.urls import UrlOptions, redact_url

T = TypeVar("T")

# redis-py options a URL may carry through to the client.
_CLIENT_DURATIONS = ("socket_timeout", "socket_connect_timeout", "health_check_interval")
_CLIENT_TEXTS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "client_name")


@dataclass(frozen=True)
class ClientTarget:
    """What a store URL asks of the client: the server's URL without idemctl's options,
    whether it is a cluster, and redis-py's client options (the async client's too)."""

    url: str
    cluster: bool
    options: dict[str, Any]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def target(url: str, options: UrlOptions) -> ClientTarget:
    """The client ``url`` asks for. Reads the client's options from ``options`` and finishes
    them: the store's own must have been read before."""
    if _version(redis.__version__) < (7, 3):  # arq, for one, requires redis-py below 6
        raise ConfigError(
            f"the Redis store needs redis-py 7.3 or later (pip install 'idemctl[redis]'); "
            f"redis-py {redis.__version__} is installed"
        )
    parts = options.parts
    cluster = parts.scheme == "redis+cluster"
    client_options: dict[str, Any] = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
    for name in _CLIENT_DURATIONS:  # a socket timeout of 0 would make every read fail at once
        least = 0.0 if name == "health_check_interval" else 0.001
        client_options[name] = options.duration(name, client_options.get(name, 0.0), least)
    for name in _CLIENT_TEXTS:
        value = options.text(name)
        if value is not None:
            client_options[name] = value
    options.finish()
    if not parts.hostname:
        raise ConfigError(f"Redis URL {redact_url(url)} names no host")
    database = parts.path.strip("/")
    if database and not database.isdigit():
        raise ConfigError(
            f"Redis URL {redact_url(url)}: the path is the database number, not {database!r}"
        )
    if cluster and database not in ("", "0"):
        raise ConfigError(f"Redis URL {redact_url(url)}: a Redis Cluster has database 0 only")
    plain = urlunsplit(parts._replace(scheme="redis" if cluster else parts.scheme, query=""))
    return ClientTarget(plain, cluster, client_options)


def connect(url: str, to: ClientTarget) -> PlainClient | RedisCluster:
    """The client for ``to`` (``url`` is what errors name, redacted)."""
    client: PlainClient | RedisCluster = _made(url, to, redis.Redis, RedisCluster, _Retry)
    return client


def connect_async(url: str, to: ClientTarget) -> AsyncClient:
    """``connect``'s client on ``redis.asyncio`` (``idemctl.aio``), with the same options."""
    client: AsyncClient = _made(url, to, redis.asyncio.Redis, AsyncCluster, _AsyncRetry)
    return client


def _made(url: str, to: ClientTarget, plain: Any, cluster: Any, retry: type[Any]) -> Any:
    """A client of class ``plain``, or ``cluster``, for ``to``, with ``retry``'s policy."""
    # A few quick retries ride out a reconnect; a dead server is reported in about a second,
    # a closed port or refused credentials at once.
    policy = retry(ExponentialBackoff(cap=0.5, base=0.05), 3)
    try:
        kind = cluster if to.cluster else plain
        return kind.from_url(to.url, decode_responses=True, retry=policy, **to.options)
    except (RedisClusterException, RedisError) as exc:
        raise translate(exc, redact_url(url)) from exc


class _Retry(Retry):
    """redis-py's retries, except for what another try cannot mend: refused credentials,
    and a connection refused (nothing listens on that port; a restarting server is waited
    for by the caller's own back-off, as any unreachable store is)."""

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        return super().call_with_retry(do, fail, mendable(is_retryable), with_failure_count)


class _AsyncRetry(AsyncRetry):
    """``_Retry`` for ``redis.asyncio``."""

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[[Exception], Any] | Callable[[Exception, int], Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        return await super().call_with_retry(do, fail, mendable(is_retryable), with_failure_count)


def mendable(is_retryable: Callable[[Exception], bool] | None) -> Callable[[Exception], bool]:
    """``is_retryable``, except for what another try cannot mend (see ``final``)."""
    return lambda error: not final(error) and (is_retryable is None or is_retryable(error))


def final(error: BaseException) -> bool:
    """True for an error no retry can mend (see _Retry)."""
    if isinstance(error, AuthenticationError):
        return True
    if not isinstance(error, RedisConnectionError):
        return False
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return True
        cause = cause.__cause__ or cause.__context__
    return "Connection refused" in str(error)
