"""The Lua scripts from ``lua/``, and how a store runs them.

A call is one EVALSHA per group of keys: over the store's own connections on one server
(see ``connections``), or in one pipelined round trip (one per node on a cluster), then
what confirms the writes under durable=1. Every script is safe to repeat with the same
arguments, so the calls a server that lost its scripts refused (NOSCRIPT) are simply sent
again after loading them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from idemctl.errors import StoreError
from idemctl.resources import read_resource
from idemctl.stores.redis.client import Client, ClusterClient, Queue
from idemctl.stores.redis.connections import Connections
from idemctl.stores.redis.errors import translate

SCRIPT_NAMES = (
    "claim",
    "complete",
    "fail",
    "extend",
    "release",
    "unlock",
    "forget",
    "purge",
    "guard",
    "settle",
    "forget_entity",
    "finish",
    "prune",
    "index",
    "stats",
)
INDEX_ONLY = frozenset(("stats",))
"""The scripts that read the index alone: an item's key names the index (any of its keys)."""
INDEXED = frozenset(SCRIPT_NAMES) - INDEX_ONLY
"""The scripts that change records or entities: they get the index's keys after theirs
(see lua/_lib.lua's indexed())."""

IndexKeys = Callable[[str], tuple[str, ...]]
"""The index's keys for a Redis key: those in its hash slot on a cluster."""
MAX_CALL_KEYS = 500
"""Keys per script call on one server: Redis runs nothing else while a script runs."""

Item = tuple[str | tuple[str, str], Sequence[Any]]
"""A Redis key (or a pair of them, on one server) and its own values for the script."""


def _keys(key: str | tuple[str, str]) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else key


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


LIB = read_resource("lua", "_lib.lua")


def load_scripts() -> dict[str, Script]:
    """The scripts as sent to the server: ``_lib.lua`` followed by the script's own file."""
    scripts = {}
    for name in SCRIPT_NAMES:
        source = LIB + "\n" + read_resource("lua", f"{name}.lua")
        sha = hashlib.sha1(source.encode()).hexdigest()  # noqa: S324 - Redis names scripts so
        scripts[name] = Script(name, source, sha)
    return scripts


def has_waitaof(server_info: Mapping[str, Any]) -> bool:
    """Whether the server that INFO SERVER describes has WAITAOF (Redis 7.2+)."""
    version = str(server_info.get("redis_version", "0"))
    return tuple(int(p) for p in version.split(".")[:2]) >= (7, 2)


class ScriptRunner:
    """Runs the scripts for one store: on ``cluster`` when it is one, else on one server
    through ``direct``; ``replicas`` and ``timeout`` are durable=1's."""

    def __init__(
        self,
        client: Client,
        cluster: ClusterClient | None,
        direct: Connections | None,
        url: str,
        *,
        index: IndexKeys,
        replicas: int,
        timeout: float,
    ) -> None:
        self._client = client
        self._cluster = cluster
        self._direct = direct
        self.url = url
        self.replicas = replicas
        self.timeout = timeout
        self.waitaof: bool | None = None  # whether the server has WAITAOF, found on first use
        self._nodes: dict[str, Connections] = {}
        """A cluster's nodes' own connections, by node name."""
        self.scripts = load_scripts()
        self._by_sha = {script.sha: script.name for script in self.scripts.values()}
        self._index = index

    def load(self) -> None:
        for script in self.scripts.values():
            if self._direct is not None:  # on the connection the scripts then run on
                self._direct.execute(("SCRIPT", "LOAD", script.source))
            else:
                self._client.script_load(script.source)

    def loaded(self) -> dict[str, bool]:
        """Whether each script is loaded (on every primary of a cluster)."""
        names = list(self.scripts)
        answers = self._client.script_exists(*(self.scripts[n].sha for n in names))
        if isinstance(answers, dict):  # a cluster answers per primary: loaded means everywhere
            answers = [all(col) for col in zip(*answers.values(), strict=True)]
        return dict(zip(names, (bool(a) for a in answers), strict=True))

    def call(
        self, name: str, shared: Sequence[Any], items: Sequence[Item], confirm: bool = False
    ) -> list[Any]:
        """Run script ``name`` over ``items``: one reply per item.

        On one server, a plain EVALSHA over the store's own connections. Otherwise one
        EVALSHA per group of keys (see _groups), all in one pipelined round trip (one per
        node on a cluster), followed by what confirms them when ``confirm``."""
        sha = self.scripts[name].sha
        try:
            if self._direct is not None and not confirm and len(items) <= MAX_CALL_KEYS:
                command = ("EVALSHA", *self._evalsha_args(sha, shared, items, range(len(items))))
                for _ in range(2):
                    try:
                        return list(self._direct.execute(command))
                    except NoScriptError:
                        self.load()
            else:
                if self._cluster is not None and not confirm:
                    replies = self._on_nodes(sha, shared, items)
                    if replies is not None:
                        return replies
                return self._pipelined(sha, shared, items, confirm)
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.url) from exc
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        for node in self._nodes.values():
            node.close()

    def _on_nodes(self, sha: str, shared: Sequence[Any], items: Sequence[Item]) -> list[Any] | None:
        """A cluster's script calls sent to each node over a connection of the store's own,
        all nodes' calls written before any reply is read, so the nodes run theirs side by
        side; redis-py's cluster pipeline costs the client about ten times as much a key.
        None when anything but the replies came back (a slot moved, a script the node lost,
        a node gone): the caller sends the whole call again through the pipeline, which
        follows redirections and refreshes the cluster's map; every script may be repeated."""
        assert self._cluster is not None
        nodes = self._cluster.nodes_manager
        plan: dict[str, tuple[Connections, list[list[int]], list[tuple[Any, ...]]]] = {}
        for group in self._groups([key for key, _ in items]):
            node = nodes.get_node_from_slot(self._cluster.keyslot(_keys(items[group[0]][0])[0]))
            conns = self._nodes.get(node.name) or self._nodes.setdefault(
                node.name, Connections(node.redis_connection.connection_pool)
            )  # one per node, whichever thread (claimer, completer, heartbeat) comes first
            _, groups, commands = plan.setdefault(node.name, (conns, [], []))
            groups.append(group)
            commands.append(("EVALSHA", *self._evalsha_args(sha, shared, items, group)))
        sent: list[tuple[Connections, Any, list[list[int]]]] = []
        replies: list[Any] = [None] * len(items)
        failed = False
        try:
            for conns, groups, commands in plan.values():
                sent.append((conns, conns.send(commands), groups))
        except (RedisError, OSError):
            failed = True
        for conns, conn, groups in sent:
            if failed:
                conns.discard(conn)
                continue
            try:
                answers = conns.receive(conn, len(groups))
            except (RedisError, OSError):
                failed = True
                continue
            for group, answer in zip(groups, answers, strict=True):
                if isinstance(answer, Exception):
                    failed = True
                    break
                for i, reply in zip(group, answer, strict=True):
                    replies[i] = reply
        return None if failed else replies

    def _groups(self, keys: Sequence[str | tuple[str, str]]) -> list[list[int]]:
        """Which items go in one script call: a script may only touch keys of one slot on a
        cluster; on one server, any keys, in chunks that keep each call short."""
        if self._cluster is not None:
            by_slot: dict[int, list[int]] = {}
            for i, key in enumerate(keys):
                by_slot.setdefault(self._cluster.keyslot(_keys(key)[0]), []).append(i)
            return list(by_slot.values())
        return [
            list(range(i, min(i + MAX_CALL_KEYS, len(keys))))
            for i in range(0, len(keys), MAX_CALL_KEYS)
        ]

    def _pipelined(
        self, sha: str, shared: Sequence[Any], items: Sequence[Item], confirm: bool
    ) -> list[Any]:
        calls = self.commands(sha, shared, items)
        replies: list[Any] = [None] * len(items)
        for _ in range(2):
            pipe = self._client.pipeline(transaction=False)
            for _, command in calls:
                # The cluster pipeline refuses .evalsha() by name, but routes the
                # command by its first key like any other.
                pipe.execute_command("EVALSHA", *command)
            confirmations = self.add_confirmation(pipe) if confirm else 0
            calls = self.sort(calls, pipe.execute(raise_on_error=False), confirmations, replies)
            if not calls:
                return replies
            self.load()
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    def commands(
        self, sha: str, shared: Sequence[Any], items: Sequence[Item]
    ) -> list[tuple[list[int], list[Any]]]:
        """The EVALSHA calls for ``items`` (see _groups): the items' indexes, the arguments."""
        return [
            (group, self._evalsha_args(sha, shared, items, group))
            for group in self._groups([key for key, _ in items])
        ]

    def sort(
        self,
        calls: list[tuple[list[int], list[Any]]],
        results: list[Any],
        confirmations: int,
        replies: list[Any],
    ) -> list[tuple[list[int], list[Any]]]:
        """Put a pipeline's ``results`` for ``calls`` into ``replies`` at their items'
        indexes, having checked the last ``confirmations`` (durable=1); the calls a server
        that lost the scripts refused (NOSCRIPT), to send again once they are loaded."""
        if confirmations:
            self._check_confirmation(results[-confirmations:])
            del results[-confirmations:]
        lost = []
        for (group, command), result in zip(calls, results, strict=True):
            if isinstance(result, NoScriptError):
                lost.append((group, command))
            elif isinstance(result, Exception):
                raise result
            else:
                for i, reply in zip(group, result, strict=True):
                    replies[i] = reply
        return lost

    def _evalsha_args(
        self, sha: str, shared: Sequence[Any], items: Sequence[Item], group: Sequence[int]
    ) -> list[Any]:
        """EVALSHA's arguments for the items at ``group``: the keys, the shared values, then
        each key's own values in key order (as lua/_lib.lua's each() reads them). An item
        whose key is a pair (finish.lua's entity and record) gives both keys, in order. A
        script that changes records gets the index's keys for their slot after them; one
        that reads the index alone gets those keys only."""
        keys = [k for i in group for k in _keys(items[i][0])]
        name = self._by_sha[sha]
        if name in INDEX_ONLY:
            keys = list(self._index(keys[0]))
        elif name in INDEXED:
            keys += self._index(keys[-1])
        args: list[Any] = [sha, len(keys), *keys, *shared]
        for i in group:
            args += items[i][1]
        return args

    # durable=1 ------------------------------------------------------------------------------

    def add_confirmation(self, pipe: Queue) -> int:
        """Queue what confirms the writes before it on this connection; returns how many replies.

        WAITAOF where the server has it (7.2+). Older servers have only WAIT, for replicas;
        that the write reached their own disk is read from their fsync settings, in the same
        round trip every time, since CONFIG SET can change them at any moment."""
        timeout_ms = int(self.timeout * 1000)
        if self.waitaof is None:
            self.waitaof = has_waitaof(self._client.info("server"))
            if not self.waitaof:  # refuse a server that cannot confirm before writing to it
                self.check_fsync(self._client.config_get("append*"))
        if self.waitaof:
            pipe.execute_command("WAITAOF", 1, self.replicas, timeout_ms)
            return 1
        pipe.config_get("append*")
        pipe.execute_command("WAIT", self.replicas, timeout_ms)
        return 2

    def check_fsync(self, config: Mapping[Any, Any]) -> None:
        if config.get("appendonly") != "yes" or config.get("appendfsync") != "always":
            raise StoreError(
                f"durable=1: Redis at {self.url} cannot confirm writes reach its disk: it has "
                f"appendonly {config.get('appendonly')} and appendfsync "
                f"{config.get('appendfsync')}, and no WAITAOF (Redis 7.2+); set appendonly yes "
                "and appendfsync always"
            )

    def _check_confirmation(self, replies: list[Any]) -> None:
        failed = [r for r in replies if isinstance(r, Exception)]
        if failed:
            raise StoreError(
                f"durable=1: Redis at {self.url} could not confirm the write: {failed[0]}"
            )
        if self.waitaof:
            local, replicas = (int(x) for x in replies[0])
            if local < 1 or replicas < self.replicas:
                raise StoreError(
                    f"durable=1: Redis at {self.url} confirmed the write on {local} local AOF and "
                    f"{replicas} of {self.replicas} replicas within {self.timeout:g}s"
                )
            return
        config, acked = replies
        self.check_fsync(config)
        if int(acked) < self.replicas:
            raise StoreError(
                f"durable=1: only {int(acked)} of {self.replicas} replicas confirmed the write "
                f"within {self.timeout:g}s"
            )
