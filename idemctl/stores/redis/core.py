"""What every part of the Redis store stands on: its client and settings, its keys, the
server's clock, and the script calls."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

from redis.cluster import RedisCluster
from redis.crc import key_slot

from idemctl.errors import ConfigError
from idemctl.stores.base import BaseStore
from idemctl.stores.limits import DEFAULT_LEASE, DEFAULT_RETENTION
from idemctl.stores.redis.client import Client, ClusterClient, ClusterNode, PlainClient
from idemctl.stores.redis.connect import ClientTarget
from idemctl.stores.redis.connections import Connections
from idemctl.stores.redis.errors import guard
from idemctl.stores.redis.nodes import ClusterRunner
from idemctl.stores.redis.ops import Op, Ops, ms
from idemctl.stores.redis.records import server_time
from idemctl.stores.redis.runner import ScriptRunner

if TYPE_CHECKING:
    from idemctl.stores.waiting import Watch

T = TypeVar("T")

INDEX_NAMES = ("live", "counts", "due", "gone", "failed")


def index_of(prefix: str, tag: str = "") -> tuple[str, ...]:
    """The index's keys (lua/_lib.lua's LIVE, COUNTS, DUE, GONE, FAILED) of a store under
    ``prefix``: on one server (no ``tag``), or for one hash slot's tag on a cluster."""
    braces = f"{{{tag}}}" if tag else ""
    return tuple(f"{prefix}idx:{name}{braces}" for name in INDEX_NAMES)


SLOTS = 16384


@cache
def _slot_tags() -> list[str]:
    """For each of a cluster's hash slots, a short text that hashes to it: a key with it
    in braces lives in that slot (the first 314,737 numbers in hex cover all 16,384)."""
    tags: list[str | None] = [None] * SLOTS
    left, n = SLOTS, 0
    while left:
        tag = f"{n:x}"
        slot = key_slot(tag.encode())
        if tags[slot] is None:
            tags[slot] = tag
            left -= 1
        n += 1
    return [t for t in tags if t is not None]


def slot_tag(slot: int) -> str:
    return _slot_tags()[slot]


class RedisCore(BaseStore):
    """The base of RedisStore's parts: settings, keys, clock, script calls, errors."""

    def __init__(
        self,
        client: PlainClient | RedisCluster,
        *,
        url: str,
        prefix: str = "idem:",
        lease: float = DEFAULT_LEASE,
        retention: float = DEFAULT_RETENTION,
        durable: bool = False,
        replicas: int = 0,
        durable_timeout: float = 1.0,
    ) -> None:
        super().__init__(url, lease=lease, retention=retention)
        self._client: Client = client
        self._cluster: ClusterClient | None = client if isinstance(client, RedisCluster) else None
        self.prefix = prefix
        self.cluster = self._cluster is not None
        if durable and self.cluster:
            raise ConfigError(
                "durable=1 is not available on redis+cluster: WAIT only covers writes sent on "
                "its own connection, which a cluster client does not guarantee"
            )
        self.durable = durable
        self.replicas = replicas
        self.durable_timeout = durable_timeout
        self.ops = Ops(prefix, durable, self.default_retention)
        """The claim/complete path's operations, sans-IO (run by ``_do`` here)."""
        self.script_runner: ScriptRunner
        if isinstance(client, RedisCluster):
            self.script_runner = ClusterRunner(
                client, self.url, index=self.index_keys, replicas=replicas, timeout=durable_timeout
            )
        else:
            direct = Connections(client.connection_pool)
            self.script_runner = ScriptRunner(
                client, direct, self.url, index=self.index_keys, replicas=replicas,
                timeout=durable_timeout,
            )  # fmt: skip
        self.scripts = self.script_runner.scripts
        self._all_indexes: list[tuple[str, ...]] | None = None
        self.target: ClientTarget | None = None
        """The client's settings, when the store was opened by URL (``idemctl.aio``'s too)."""

    def _rkey(self, key: str) -> str:
        return self.ops.rkey(key)

    def _key_of(self, rkey: str) -> str:
        return rkey[len(self.prefix) + 1 : -1]

    def index_keys(self, rkey: str) -> tuple[str, ...]:
        """The index's keys (lua/_lib.lua's LIVE, COUNTS, DUE, GONE, FAILED) for Redis key
        ``rkey``: the store's own on one server; on a cluster, those of rkey's hash slot."""
        if self._cluster is None:
            return self._index_of("")
        return self._index_of(slot_tag(self._cluster.keyslot(rkey)))

    def _index_of(self, tag: str) -> tuple[str, ...]:
        return index_of(self.prefix, tag)

    def _indexes(self) -> list[tuple[str, ...]]:
        """Every set of the index's keys: one on one server, one per hash slot on a cluster."""
        if self._all_indexes is None:
            tags = [""] if self._cluster is None else [slot_tag(slot) for slot in range(SLOTS)]
            self._all_indexes = [self._index_of(tag) for tag in tags]
        return self._all_indexes

    def _ready_key(self, part: str = "") -> str:
        """Set once ``idemctl init`` has counted every record written before the index;
        ``part="failed"``: once it has put every failed record in FAILED (an index built
        before FAILED came lacks those)."""
        return f"{self.prefix}idx:ready" + (f":{part}" if part else "")

    def _nodes(self) -> list[ClusterNode | None]:
        """What a SCAN walks: every primary of a cluster, or the one server (None)."""
        return list(self._cluster.get_primaries()) if self._cluster is not None else [None]

    def _guard(self) -> AbstractContextManager[None]:
        return guard(self.url)

    def _now(self) -> datetime:
        return server_time(*self._client.time())

    def _ms(self, seconds: float) -> int:
        return ms(seconds)

    def _read(self, rkey: str) -> tuple[Any, datetime]:
        """What Redis key ``rkey`` holds, and the server's clock when it was read."""
        return self.script_runner.read(rkey)

    def _do(self, op: Op[T]) -> T:
        """Run an operation's script call and read its replies (``idemctl.aio`` awaits the
        same operations on its own client)."""
        call, read = op
        return read(self.script_runner.call(call.name, call.shared, call.items, call.confirm))

    def _call(
        self,
        name: str,
        shared: Sequence[Any],
        items: Sequence[tuple[str, Sequence[Any]]],
        durable: bool = False,
        named: Callable[[str], str] | None = None,
    ) -> list[Any]:
        """The replies of script ``name``'s call (``Ops.script``), one per item."""
        return self._do((self.ops.script(name, shared, items, durable, named), list))

    def _one(
        self, name: str, shared: Sequence[Any], key: str, *args: Any, durable: bool = False
    ) -> Any:
        return self._call(name, shared, [(key, args)], durable)[0]

    def _listen(self, watch: Watch) -> Callable[[], None] | None:
        from idemctl.stores.redis.wake import listen

        return listen(self, watch)

    def close(self) -> None:
        self._close_watch()
        self.script_runner.close()
        self._client.close()


def glob_escape(literal: str) -> str:
    """``literal`` as a SCAN MATCH pattern that matches it and nothing else."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in literal)
