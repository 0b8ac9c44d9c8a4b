"""``redis://``, ``rediss://`` (TLS) and ``redis+cluster://``: the fastest store.

Every state change is one Lua script from ``lua/`` over one string per key (the record as
JSON), judged by the server's clock. Keys are ``PREFIX{KEY}``: the hash tag keeps each
record on one slot, so the same scripts run on Redis Cluster. A batch is one script call
(one per slot on a cluster, in one pipelined round trip).

A module per job: ``connect`` makes the redis-py client a URL asks for (``client`` declares
what the store calls on it, ``errors`` turns its errors into idemctl's); ``scripts`` loads
and runs the Lua scripts, over ``connections`` on one server; ``records`` reads their
replies. RedisStore (``store``: the protocol) stands on ``core`` (client, keys, clock, script
calls), with the operator's operations in ``admin``, the sequence guard's entities
(``PREFIXentity:{ENTITY}``, out of the records' namespace) in ``entities``, and provisioning
and health in ``provision``.
"""

from __future__ import annotations

from idemctl.stores.redis.scripts import LIB, MAX_CALL_KEYS, SCRIPT_NAMES, Script, load_scripts
from idemctl.stores.redis.store import RedisStore

SCAN_COUNT = 500
"""Keys one SCAN asks for, an admin batch. Read from here at every call: it may be set."""
WALK_KEYS = 100_000
"""Keys a page that walks the keyspace examines at most (``walk``): then it comes back
short, with a cursor that goes on. Read from here at every call: it may be set."""

__all__ = [
    "LIB",
    "MAX_CALL_KEYS",
    "SCAN_COUNT",
    "SCRIPT_NAMES",
    "WALK_KEYS",
    "RedisStore",
    "Script",
    "load_scripts",
]
