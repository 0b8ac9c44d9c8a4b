"""The Lua scripts from ``lua/``, and how a store's calls of them are made (no I/O here:
``runner`` sends them).

A call is one EVALSHA per group of keys: over the store's own connections on one server
(see ``connections``), or in one pipelined round trip (one per node on a cluster, see
``nodes``), then what confirms the writes under durable=1. Every script is safe to repeat
with the same arguments, so the calls a server that lost its scripts refused (NOSCRIPT) are
simply sent again after loading them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from idemctl.errors import StoreError
from idemctl.resources import read_resource
from idemctl.stores.redis.client import Queue

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
    "index",
    "stats",
    "tally",
)
INDEX_ONLY = frozenset(("stats", "tally"))
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


def item_keys(key: str | tuple[str, str]) -> tuple[str, ...]:
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


class ScriptPlan:
    """How a store's script calls are made, without I/O: the scripts, the EVALSHA commands
    for a call's items (grouped by slot on a cluster, ``keyslot``), and how a pipeline's
    replies and durable=1's confirmation (``replicas``, ``timeout``) are read. The runner
    (``stores.redis.runner``, written from ``idemctl.stores.redis.runner_async``) sends them."""

    def __init__(
        self,
        url: str,
        *,
        index: IndexKeys,
        replicas: int,
        timeout: float,
        keyslot: Callable[[str], int] | None = None,
    ) -> None:
        self.url = url
        self.replicas = replicas
        self.timeout = timeout
        self.cluster = keyslot is not None
        self._keyslot = keyslot
        self.waitaof: bool | None = None  # whether the server has WAITAOF, found on first use
        self.scripts = load_scripts()
        self._by_sha = {script.sha: script.name for script in self.scripts.values()}
        self._index = index

    def _groups(self, keys: Sequence[str | tuple[str, str]]) -> list[list[int]]:
        """Which items go in one script call: a script may only touch keys of one slot on a
        cluster; on one server, any keys, in chunks that keep each call short."""
        if self._keyslot is not None:
            by_slot: dict[int, list[int]] = {}
            for i, key in enumerate(keys):
                by_slot.setdefault(self._keyslot(item_keys(key)[0]), []).append(i)
            return list(by_slot.values())
        return [
            list(range(i, min(i + MAX_CALL_KEYS, len(keys))))
            for i in range(0, len(keys), MAX_CALL_KEYS)
        ]

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
        keys = [k for i in group for k in item_keys(items[i][0])]
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

        WAITAOF where the server has it (7.2+, ``waitaof``, which the runner finds out
        first). Older servers have only WAIT, for replicas; that the write reached their own
        disk is read from their fsync settings, in the same round trip every time, since
        CONFIG SET can change them at any moment."""
        assert self.waitaof is not None, "the runner asks the server first"
        timeout_ms = int(self.timeout * 1000)
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
