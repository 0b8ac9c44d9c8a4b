"""The Redis store on ``redis.asyncio``: the protocol's steps (``idemctl.stores.redis.steps_async``,
from which the sync store's are written) send the sync store's own operations
(``stores.redis.ops``) on an async client, so the Lua, the keys and the replies' meaning are
one; the operator's operations run the sync store in a thread."""

from __future__ import annotations

from idemctl.stores.redis.steps_async import AsyncRedisSteps


class AsyncRedisStore(AsyncRedisSteps):
    """``sync``'s records on ``redis.asyncio``: one pipelined round trip an operation."""
