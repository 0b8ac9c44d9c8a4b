# Written by scripts/unasync.py from idemctl/stores/redis/runner_async.py.
# Do not edit: change that file and run the script (scripts/test checks the two agree).
"""How a Redis store sends its script calls (``stores.redis.scripts`` makes them), and reads
a record with the server's clock.

Written by scripts/unasync.py from ``idemctl.stores.redis.runner_async``.

On one server a call is one EVALSHA on a direct connection (up to MAX_CALL_KEYS keys);
otherwise, or to confirm it under durable=1, one pipelined round trip. A server that lost
the scripts (NOSCRIPT) gets them again, and the refused calls are sent once more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from idemctl.errors import StoreError
from idemctl.stores.redis.client import Client, Pipeline
from idemctl.stores.redis.connections import Connections
from idemctl.stores.redis.errors import translate
from idemctl.stores.redis.records import server_time
from idemctl.stores.redis.scripts import MAX_CALL_KEYS, IndexKeys, Item, ScriptPlan, has_waitaof


class ScriptRunner(ScriptPlan):
    """Runs the scripts for one store on ``client``; on one server, single calls go through
    ``direct``."""

    def __init__(
        self,
        client: Client,
        direct: Connections | None,
        url: str,
        *,
        index: IndexKeys,
        replicas: int,
        timeout: float,
        keyslot: Callable[[str], int] | None = None,
    ) -> None:
        super().__init__(url, index=index, replicas=replicas, timeout=timeout, keyslot=keyslot)
        self._client = client
        self._direct = direct

    def load(self) -> None:
        for script in self.scripts.values():
            if self._direct is not None:
                self._direct.execute(("SCRIPT", "LOAD", script.source))
            else:
                self._client.script_load(script.source)

    def loaded(self) -> dict[str, bool]:
        """Whether each script is loaded (on every primary of a cluster)."""
        names = list(self.scripts)
        answers = self._client.script_exists(*(self.scripts[n].sha for n in names))
        if isinstance(answers, dict):
            answers = [all(col) for col in zip(*answers.values(), strict=True)]
        return dict(zip(names, (bool(a) for a in answers), strict=True))

    def call(
        self, name: str, shared: Sequence[Any], items: Sequence[Item], confirm: bool = False
    ) -> list[Any]:
        """Run script ``name`` over ``items``: one reply per item.

        On one server, a plain EVALSHA over ``direct``. Otherwise one EVALSHA per group of
        keys (see ScriptPlan._groups), all in one pipelined round trip, followed by what
        confirms them when ``confirm``."""
        sha = self.scripts[name].sha
        try:
            if self._direct is not None and (not confirm) and (len(items) <= MAX_CALL_KEYS):
                command = ("EVALSHA", *self._evalsha_args(sha, shared, items, range(len(items))))
                for _ in range(2):
                    try:
                        return list(self._direct.execute(command))
                    except NoScriptError:
                        self.load()
            else:
                return self._grouped(sha, shared, items, confirm)
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.url) from exc
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    def _grouped(
        self, sha: str, shared: Sequence[Any], items: Sequence[Item], confirm: bool
    ) -> list[Any]:
        """A call of more than one command: through the pipeline here (the sync runner of
        a cluster first tries each node directly, see ``stores.redis.nodes``)."""
        return self._pipelined(sha, shared, items, confirm)

    def _pipelined(
        self, sha: str, shared: Sequence[Any], items: Sequence[Item], confirm: bool
    ) -> list[Any]:
        calls = self.commands(sha, shared, items)
        replies: list[Any] = [None] * len(items)
        for _ in range(2):
            pipe: Pipeline = self._client.pipeline(transaction=False)
            for _, command in calls:
                pipe.execute_command("EVALSHA", *command)
            confirmations = self._confirmation(pipe) if confirm else 0
            results = pipe.execute(raise_on_error=False)
            calls = self.sort(calls, results, confirmations, replies)
            if not calls:
                return replies
            self.load()
        raise StoreError(f"Redis at {self.url} keeps losing idemctl's Lua scripts")

    def _confirmation(self, pipe: Pipeline) -> int:
        """Queue durable=1's confirmation (``add_confirmation``), having asked the server
        once whether it has WAITAOF, and refused one that cannot confirm at all."""
        if self.waitaof is None:
            waitaof = has_waitaof(self._client.info("server"))
            if not waitaof:
                self.check_fsync(self._client.config_get("append*"))
            self.waitaof = waitaof
        return self.add_confirmation(pipe)

    def read(self, rkey: str) -> tuple[Any, datetime]:
        """What Redis key ``rkey`` holds, and the server's clock when it was read."""
        try:
            if self.cluster:
                raw = self._client.get(rkey)
                seconds, micros = self._client.time()
            else:
                pipe: Pipeline = self._client.pipeline(transaction=False)
                pipe.get(rkey)
                pipe.time()
                raw, (seconds, micros) = pipe.execute()
        except (RedisError, RedisClusterException) as exc:
            raise translate(exc, self.url) from exc
        return (raw, server_time(seconds, micros))

    def close(self) -> None:
        """Close the runner's own connections (the client is the store's)."""
        if self._direct is not None:
            self._direct.close()
