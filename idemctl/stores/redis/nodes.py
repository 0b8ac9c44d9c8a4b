"""A cluster's script calls sent to each node on connections of the store's own: the sync
runner's fast way on a cluster (redis-py's cluster pipeline costs the client about ten
times as much a key). The async runner has no such way: it pipelines."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from idemctl.stores.redis.client import ClusterClient
from idemctl.stores.redis.connections import Connections
from idemctl.stores.redis.runner import ScriptRunner
from idemctl.stores.redis.scripts import IndexKeys, Item, item_keys


class ClusterRunner(ScriptRunner):
    """``ScriptRunner`` on a cluster: a call without durable=1's confirmation goes to the
    nodes directly, and through the cluster pipeline when that fails."""

    def __init__(
        self, cluster: ClusterClient, url: str, *, index: IndexKeys, replicas: int, timeout: float
    ) -> None:
        super().__init__(
            cluster, None, url, index=index, replicas=replicas, timeout=timeout,
            keyslot=cluster.keyslot,
        )  # fmt: skip
        self._cluster = cluster
        self._nodes: dict[str, Connections] = {}
        """The nodes' own connections, by node name."""

    def _grouped(
        self, sha: str, shared: Sequence[Any], items: Sequence[Item], confirm: bool
    ) -> list[Any]:
        if not confirm:
            replies = self._on_nodes(sha, shared, items)
            if replies is not None:
                return replies
        return self._pipelined(sha, shared, items, confirm)

    def _on_nodes(self, sha: str, shared: Sequence[Any], items: Sequence[Item]) -> list[Any] | None:
        """The call's commands sent to each node over a connection of the store's own, all
        nodes' calls written before any reply is read, so the nodes run theirs side by
        side. None when anything but the replies came back (a slot moved, a script the node
        lost, a node gone): the caller sends the whole call again through the pipeline,
        which follows redirections and refreshes the cluster's map; every script may be
        repeated."""
        nodes = self._cluster.nodes_manager
        plan: dict[str, tuple[Connections, list[list[int]], list[tuple[Any, ...]]]] = {}
        for group in self._groups([key for key, _ in items]):
            node = nodes.get_node_from_slot(self._cluster.keyslot(item_keys(items[group[0]][0])[0]))
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

    def close(self) -> None:
        super().close()
        for node in self._nodes.values():
            node.close()
