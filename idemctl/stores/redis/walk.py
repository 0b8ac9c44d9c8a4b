"""Pages in SCAN order, for the keys and the entities of a Redis store: what the operator's
pages read where the index does not answer (a prefix, a status other than in progress).

SCAN goes through the whole keyspace whatever its MATCH, so a page on a prefix few keys
match, or a filter few records pass, would read every key of a large store before it
answered. A page examines at most ``WALK_KEYS`` keys (``SCAN_COUNT`` a call): then it comes
back short, with a cursor that goes on from there. A caller wanting ``limit`` items asks
again with it, as ``idemctl.operate`` does for the CLI; the console shows that page, and
its Next link goes on. Each page costs the same on any store size."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from idemctl.errors import InvalidCursor
from idemctl.stores import redis as package
from idemctl.stores.redis.client import Client, ClusterNode
from idemctl.stores.redis.core import RedisCore
from idemctl.stores.redis.records import text

T = TypeVar("T")

Batch = tuple[str, list[T], str | None]
"""A SCAN call's items: the position it started at ("node:cursor"), what it found (read),
the position after it (None: the walk is over)."""


class RedisWalk(RedisCore):
    """SCAN walks: a part of RedisStore."""

    def _scan_batches(
        self,
        match: str,
        start: str | None,
        read: Callable[[ClusterNode | None, Client, list[str]], list[T]],
    ) -> Iterator[Batch[T]]:
        """Every key matching ``match`` from position ``start``, a SCAN call at a time
        (on every primary of a cluster, each through its own connection), each call's keys
        ``read`` into items on that node."""
        nodes = self._nodes()
        node_index, cursor = (0, 0) if not start else (int(p) for p in start.split(":"))
        with self._guard():
            while node_index < len(nodes):
                at = f"{node_index}:{cursor}"
                node = nodes[node_index]
                client = self._client if node is None else node.redis_connection
                # SCAN_COUNT is read from the package at each call, where it may be set.
                next_cursor, found = client.scan(
                    cursor, match=match, count=package.SCAN_COUNT, _type="string"
                )
                cursor = int(next_cursor)
                items = read(node, client, [text(k) for k in found])
                if cursor == 0:
                    node_index += 1
                yield at, items, (f"{node_index}:{cursor}" if node_index < len(nodes) else None)


def walk_page(
    batches: Iterable[Batch[T]], after: str | None, limit: int, name: Callable[[T], str]
) -> tuple[list[T], str | None]:
    """Up to ``limit`` items of ``batches`` (the first batch's after the name ``after``),
    sorted by name within each SCAN batch, and the cursor of the next page (None: none).
    A cursor is a batch's position and the last name taken from it ("node:cursor/name"):
    SCAN cannot stop mid-batch, so the next page scans that batch again and goes on after
    that name. A full page gets a cursor only if an item after it is found; a page that
    examined ``WALK_KEYS`` keys stops there, short, with the position after its last batch.
    """
    calls = max(package.WALK_KEYS // max(package.SCAN_COUNT, 1), 1)
    found: list[T] = []
    for n, (at, items, then) in enumerate(batches, 1):
        batch = sorted((i for i in items if after is None or name(i) > after), key=name)
        after = None
        if len(found) == limit and found:  # full: the next page starts at the next match
            if batch:
                return found, f"{at}/"
        else:
            room = limit - len(found)
            if len(batch) > room:
                found += batch[:room]
                return found, (f"{at}/{name(found[-1])}" if found else at)
            found += batch
        if n >= calls and then is not None:
            return found, then
    return found, None


def parse_cursor(cursor: str | None, what: str) -> tuple[str | None, str | None]:
    """A walk's cursor: its batch position ("node:cursor") and the last name taken from
    that batch ("node:cursor/" starts the batch afresh)."""
    if cursor is None:
        return None, None
    position, _, after = cursor.partition("/")
    if not re.fullmatch(r"\d+:\d+", position):
        raise InvalidCursor(f"not a cursor of this Redis store's {what}: {cursor!r}")
    return position, after or None


def read_strings(
    node: ClusterNode | None, client: Client, rkeys: Sequence[str]
) -> list[str | bytes | None]:
    """The strings at ``rkeys``, on the node that holds them: MGET on one server; a
    pipeline on a cluster node, which refuses MGET across slots, even its own."""
    if not rkeys:
        return []
    if node is None:
        return list(client.mget(list(rkeys)))
    pipe = client.pipeline(transaction=False)
    for rkey in rkeys:
        pipe.get(rkey)
    return list(pipe.execute())
