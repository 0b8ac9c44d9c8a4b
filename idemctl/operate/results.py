"""What operator actions return: data for any front end to render (the CLI's tables and
``--json`` documents, the console's pages and ``/api/``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:
    from idemctl.model import Entity, Record, Stats
    from idemctl.powertools.model import PowertoolsRecord

Item_co = TypeVar("Item_co", covariant=True)


@dataclass(frozen=True)
class Page(Generic[Item_co]):
    """One page of a listing and the cursor that goes on from it (None: the last page).
    ``skipped``: items a Powertools table passed over as none of Powertools' (None on
    idemctl's own layout)."""

    items: list[Item_co]
    cursor: str | None
    skipped: int | None = None


@dataclass(frozen=True)
class Counts:
    """``stats`` on idemctl's layout: the store's counts and the sequence guard's entities
    (None where the guard is not provisioned, or counting it is a Scan)."""

    stats: Stats
    entities: int | None
    at: datetime


class Words(NamedTuple):
    """How a bulk action's summary and question read on a layout."""

    verb: str
    noun: str
    question: str = ""
    """``{n}`` and ``{url}`` filled in."""


@dataclass(frozen=True)
class Action:
    """What ``unlock``, ``forget`` or ``purge`` did, or would do (``dry_run``), on the store
    at ``url`` (redacted): the keys it acted on (None for purge, which counts), the record or
    entity of a single-key action as it was, ``skipped`` as ``Page``'s. ``at``: when it was
    judged."""

    action: str
    url: str
    dry_run: bool
    count: int
    at: datetime
    words: Words
    keys: list[str] | None = None
    record: Record | PowertoolsRecord | None = None
    entity: Entity | None = None
    skipped: int | None = None
    left_alone: list[str] = field(default_factory=list)
    """A bulk action's keys found by its dry run that were claimed or freed meanwhile."""
