"""Fenced writes to your own Redis keys: SET, HSET and XADD that refuse a writer whose
fencing token is older than the last one the resource accepted from the same key.

Each write is one script (``lua/fence.lua``, sent by EVALSHA) that reads and writes the
resource and its fence in one atomic step. The fence is a hash beside the resource, in
its hash slot (:func:`fence_key`), so the helpers work on one server and on a cluster:

- :func:`fenced_set` and :func:`fenced_hset` keep the last writer (key and token): a write
  of the same key with an older token raises :class:`~idemctl.errors.StaleFence`; another
  key's write is accepted (tokens of two keys are never compared).
- :func:`fenced_xadd` keeps one field a key: a key appends to the stream once; a newer
  attempt of a key that already appended gets that entry's id back instead of a second
  entry, an older one is refused.

The ``a``-prefixed twins take a ``redis.asyncio`` client. Any redis-py client works,
``decode_responses`` or not. Delete a resource's fence with the resource (``DEL name
fence_key(name)``): it never expires on its own, so that no late writer finds it gone.

    from idemctl.fence.redis import fenced_set

    def ship(event, ctx):
        fenced_set(r, f"shipment:{event['order']}", "sent", ctx.fence)
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from idemctl.errors import StaleFence
from idemctl.fence import Fence
from idemctl.resources import read_resource

__all__ = [
    "afenced_hset",
    "afenced_set",
    "afenced_xadd",
    "fence_key",
    "fenced_hset",
    "fenced_set",
    "fenced_xadd",
]

_SOURCE = read_resource("lua", "fence.lua")
_SHA = hashlib.sha1(_SOURCE.encode()).hexdigest()  # noqa: S324 - Redis names scripts so
FENCE_SUFFIX = ":idemctl-fence"


def fence_key(name: str) -> str:
    """The hash that keeps ``name``'s fence, in ``name``'s hash slot: ``name`` with the
    suffix when it has a hash tag of its own, else ``{name}`` with it."""
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    tagged = start >= 0 and end > start + 1
    return f"{name}{FENCE_SUFFIX}" if tagged else f"{{{name}}}{FENCE_SUFFIX}"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _flat(mapping: Mapping[Any, Any]) -> list[Any]:
    if not mapping:
        raise ValueError("a fenced HSET or XADD needs at least one field")
    return [part for pair in mapping.items() for part in pair]


def _args(op: str, fence: Fence, rest: Sequence[Any]) -> list[Any]:
    if not 0 <= fence.token < 2**53:
        raise ValueError(f"a fencing token must be in [0, 2**53): {fence.token}")
    return [op, fence.key, fence.token, *rest]


def _set_args(value: Any, px: int | None) -> list[Any]:
    if px is not None and px <= 0:
        raise ValueError(f"px must be a positive number of milliseconds: {px}")
    return [value, "" if px is None else px]


def _reply(name: str, fence: Fence, reply: Sequence[Any]) -> Any:
    """The write's result, or the StaleFence its refusal means."""
    if int(reply[0]) == 0:
        raise StaleFence(name, fence.key, fence.token, int(_text(reply[2])))
    return reply[1]


def _is_noscript(error: Exception) -> bool:
    from redis.exceptions import NoScriptError

    return isinstance(error, NoScriptError)


def _call(client: Any, name: str, args: list[Any]) -> Any:
    keys = (name, fence_key(name))
    try:
        return client.evalsha(_SHA, 2, *keys, *args)
    except Exception as e:
        if not _is_noscript(e):
            raise
        return client.eval(_SOURCE, 2, *keys, *args)


async def _acall(client: Any, name: str, args: list[Any]) -> Any:
    keys = (name, fence_key(name))
    try:
        return await client.evalsha(_SHA, 2, *keys, *args)
    except Exception as e:
        if not _is_noscript(e):
            raise
        return await client.eval(_SOURCE, 2, *keys, *args)


def fenced_set(client: Any, name: str, value: Any, fence: Fence, *, px: int | None = None) -> None:
    """``SET name value [PX px]``, fenced; StaleFence if a newer attempt of ``fence.key``
    set it."""
    _reply(name, fence, _call(client, name, _args("set", fence, _set_args(value, px))))


def fenced_hset(client: Any, name: str, mapping: Mapping[Any, Any], fence: Fence) -> int:
    """``HSET name field value ...``, fenced: the fields added (as HSET answers);
    StaleFence if a newer attempt of ``fence.key`` wrote the hash."""
    return int(_reply(name, fence, _call(client, name, _args("hset", fence, _flat(mapping)))))


def fenced_xadd(client: Any, stream: str, fields: Mapping[Any, Any], fence: Fence) -> str:
    """``XADD stream * field value ...`` once per key, fenced: the entry's id (the one this
    key appended before, if it did); StaleFence if a newer attempt of ``fence.key`` did."""
    reply = _call(client, stream, _args("xadd", fence, _flat(fields)))
    return _text(_reply(stream, fence, reply))


async def afenced_set(
    client: Any, name: str, value: Any, fence: Fence, *, px: int | None = None
) -> None:
    """:func:`fenced_set` on a ``redis.asyncio`` client."""
    reply = await _acall(client, name, _args("set", fence, _set_args(value, px)))
    _reply(name, fence, reply)


async def afenced_hset(client: Any, name: str, mapping: Mapping[Any, Any], fence: Fence) -> int:
    """:func:`fenced_hset` on a ``redis.asyncio`` client."""
    reply = await _acall(client, name, _args("hset", fence, _flat(mapping)))
    return int(_reply(name, fence, reply))


async def afenced_xadd(client: Any, stream: str, fields: Mapping[Any, Any], fence: Fence) -> str:
    """:func:`fenced_xadd` on a ``redis.asyncio`` client."""
    reply = await _acall(client, stream, _args("xadd", fence, _flat(fields)))
    return _text(_reply(stream, fence, reply))
