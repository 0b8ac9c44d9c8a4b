"""What idemctl calls on redis-py's clients, declared as Protocols.

mypy checks every call the store makes against these, and checks redis.Redis and
redis.cluster.RedisCluster against them where the store takes its client (``core``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from redis.retry import Retry

if TYPE_CHECKING:
    import redis.asyncio
    import redis.asyncio.client
    import redis.asyncio.cluster

AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.RedisCluster"
"""The async clients (``idemctl.aio``); their typing is redis-py's own."""
AsyncPipeline: TypeAlias = "redis.asyncio.client.Pipeline | redis.asyncio.cluster.ClusterPipeline"


class Queue(Protocol):
    """Commands queued for one round trip, on a sync or an async pipeline."""

    def execute_command(self, *args: Any) -> object: ...
    def get(self, name: str, /) -> object: ...
    def time(self) -> object: ...
    def config_get(self, pattern: str, /) -> object: ...


class Pipeline(Queue, Protocol):
    """Commands queued for one round trip; ``execute`` returns their replies in order."""

    def execute(self, raise_on_error: bool = True) -> list[Any]: ...


class Client(Protocol):
    """A client of one server (redis.Redis) or of a cluster (RedisCluster), as the store
    uses it. Replies are text, or bytes for a client made without decode_responses."""

    def pipeline(self, transaction: bool = ...) -> Pipeline: ...
    def script_load(self, script: str, /) -> str: ...
    def script_exists(self, *shas: str) -> list[bool] | dict[str, list[bool]]:
        """One answer per script; a cluster answers per primary."""
        ...

    def get(self, name: str, /) -> str | bytes | None: ...
    def set(self, name: str, value: str, /) -> object: ...
    def exists(self, *names: str) -> int: ...
    def mget(self, keys: list[str], /) -> list[str | bytes | None]: ...
    def scan(
        self,
        cursor: int = 0,
        match: str | None = None,
        count: int | None = None,
        _type: str | None = None,
    ) -> tuple[int, Sequence[str | bytes]]: ...
    def time(self) -> tuple[int, int]: ...
    def info(self, section: str, /) -> Mapping[str, Any]: ...
    def config_get(self, pattern: str, /) -> Mapping[Any, Any]:
        """The parameters matching ``pattern``; a cluster may answer per primary."""
        ...

    def ping(self) -> bool: ...
    def pubsub(self) -> Any: ...
    def close(self) -> None: ...


class Connection(Protocol):
    """One connection of a pool, used directly (see ``connections``)."""

    retry: Retry

    def send_packed_command(self, command: list[bytes], /) -> None: ...
    def pack_command(self, *args: Any) -> list[bytes]: ...
    def read_response(self) -> Any: ...
    def disconnect(self) -> None: ...


class ConnectionPool(Protocol):
    def make_connection(self) -> Any:
        """A new Connection (redis-py declares its abstract interface, which has no retry)."""
        ...


class PlainClient(Client, Protocol):
    """A client of one server: its pool makes the store's own connections."""

    @property
    def connection_pool(self) -> ConnectionPool: ...


class ClusterNode(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def redis_connection(self) -> PlainClient: ...


class NodesManager(Protocol):
    def get_node_from_slot(self, slot: int) -> ClusterNode: ...


class ClusterClient(Client, Protocol):
    @property
    def nodes_manager(self) -> NodesManager: ...

    def keyslot(self, key: str, /) -> int: ...
    def get_primaries(self) -> list[ClusterNode]: ...
