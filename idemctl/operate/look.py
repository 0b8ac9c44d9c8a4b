"""Looking without changing anything: a key, an entity, pages of either, counts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from idemctl.errors import EntityNotFound, InvalidCursor, KeyNotFound, OptionError
from idemctl.model import validate_key
from idemctl.operate.results import Counts, Page
from idemctl.operate.targets import Query, Target

if TYPE_CHECKING:
    from idemctl.model import Entity, Record
    from idemctl.powertools.model import PowertoolsRecord, PowertoolsStats

PAGE = 500
"""Items one store call fetches, at most."""

Item = TypeVar("Item")


def inspect(target: Target, key: str) -> Record | PowertoolsRecord:
    """Every field of ``key``'s record; KeyNotFound where there is none."""
    validate_key(key)
    record = target.get(key)
    if record is None:
        raise KeyNotFound(key)
    return record


def inspect_entity(target: Target, entity: str) -> Entity:
    """The sequence guard's ``entity``; EntityNotFound where there is none."""
    validate_key(entity, "entity")
    found = target.get_entity(entity)
    if found is None:
        raise EntityNotFound(entity)
    return found


def records(
    target: Target, query: Query, limit: int, cursor: str | None = None
) -> Iterator[Page[Record | PowertoolsRecord]]:
    """``query``'s records, a page at a time from ``cursor``, up to ``limit`` (0: all); the
    last page's cursor goes on from there."""
    return _pages(lambda size, after: target.scan(query, size, after), limit, cursor)


def entities(
    target: Target, prefix: str | None, limit: int, cursor: str | None = None
) -> Iterator[Page[Entity]]:
    """The sequence guard's entities in name order, paged as ``records``."""
    return _pages(lambda size, after: target.scan_entities(prefix, size, after), limit, cursor)


def _pages(
    fetch: Callable[[int, str | None], Page[Item]], limit: int, cursor: str | None
) -> Iterator[Page[Item]]:
    remaining = limit or None
    while True:
        try:
            page = fetch(PAGE if remaining is None else min(PAGE, remaining), cursor)
        except InvalidCursor as exc:
            raise OptionError("cursor", str(exc)) from None
        yield page
        cursor = page.cursor
        if remaining is not None:
            remaining -= len(page.items)
        if cursor is None or (remaining is not None and remaining <= 0):
            return


def stats(target: Target, exact: bool = False) -> Counts | PowertoolsStats:
    """Counts by status (Powertools: by state), stale and released leases, the oldest key
    in progress and the guard's entities; ``exact``: by reading every record where the
    store keeps counts otherwise."""
    return target.stats(exact)
