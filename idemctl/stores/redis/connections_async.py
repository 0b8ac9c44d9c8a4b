"""The async runner's way to send one command: the client's own ``execute_command``.

The sync store sends its script calls on connections of its own (``stores.redis.connections``,
which the sync runner is written to use in this one's place): redis-py's sync pool polls a
connection's socket before each use, which its asyncio pool does not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import redis.asyncio


class AsyncDirect:
    """One server's commands, each on a connection of the client's pool."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        # redis-py leaves execute_command untyped
        self._execute = cast(Callable[..., Awaitable[Any]], client.execute_command)

    async def execute(self, args: tuple[Any, ...]) -> Any:
        return await self._execute(*args)

    def close(self) -> None:
        """Nothing of its own to close: the client's pool is the store's."""
