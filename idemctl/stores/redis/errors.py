"""redis-py's errors as idemctl's, naming the store by its redacted URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis.exceptions import (
    AuthenticationError,
    ClusterDownError,
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from idemctl.errors import ConfigError, StoreError, StoreUnavailable


def translate(exc: BaseException, url: str) -> StoreError | ConfigError:
    if isinstance(exc, AuthenticationError):
        missing = "" if "***@" in url else " (the URL has no password; the server wants one)"
        return ConfigError(f"Redis at {url} refused the credentials in the URL{missing}: {exc}")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | ClusterDownError) or (
        isinstance(exc, RedisClusterException) and "connect" in str(exc).lower()
    ):
        return StoreUnavailable(f"Redis at {url} is unreachable: {exc}")
    if isinstance(exc, ResponseError) and "NOPERM" in str(exc):
        return ConfigError(f"Redis at {url} denied a command to this user: {exc}")
    if isinstance(exc, ResponseError) and "DB index is out of range" in str(exc):
        return ConfigError(
            f"Redis at {url} has no such database: {exc} (the server's 'databases' setting "
            "says how many; 16 by default, 0 to 15)"
        )
    return StoreError(f"Redis at {url}: {exc}")


@contextmanager
def guard(url: str) -> Iterator[None]:
    """Turns redis-py's errors into idemctl's, naming the store by its redacted URL."""
    try:
        yield
    except NoScriptError:
        raise
    except (RedisError, RedisClusterException) as exc:
        raise translate(exc, url) from exc
