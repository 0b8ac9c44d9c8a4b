"""What each console page shows, as the ``--json`` document of the command that shows it
(``idemctl.operate.documents``): a page renders its view's document, and ``/api/`` returns
the same document. The operate layer does the work; nothing here judges a record.

A stored result is masked (``result``/``data`` null, ``result_masked`` true) unless the
caller reveals it, which the console logs.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from idemctl import operate
from idemctl.errors import ConfigError
from idemctl.model import Status
from idemctl.operate.documents import doctor as doctor_document
from idemctl.operate.documents import item as item_document
from idemctl.operate.documents import powertools_stats
from idemctl.operate.documents import stats as stats_document
from idemctl.operate.results import Counts

if TYPE_CHECKING:
    from collections.abc import Mapping

    from idemctl.operate.targets import Target

PAGE = 50
"""Items a page of a listing shows."""
MASKED = {"result": None, "data": None}
"""The fields of a record's document that hold what the handler stored."""


@dataclass
class Where:
    """The store the console runs on and what it was given for Kafka (audit, replay)."""

    target: Target
    source: str
    """Where the store's URL came from (``store_source`` in the documents)."""
    brokers: str = "127.0.0.1:9092"
    kafka_config: dict[str, str] = field(default_factory=dict)

    @property
    def fields(self) -> dict[str, str]:
        return {"store": self.target.url, "store_source": self.source}


def overview(where: Where) -> dict[str, Any]:
    """``stats --json`` and ``doctor --json``, side by side."""
    counts = operate.stats(where.target)
    if isinstance(counts, Counts):
        stats = stats_document.document(where.fields, counts.stats, counts.at, counts.entities)
    else:
        stats = powertools_stats.document(where.fields, counts)
    report = operate.diagnose(
        where.target.url, where.source, opener=lambda: nullcontext(where.target)
    )
    return {"stats": stats, "doctor": doctor_document.document(report)}


def query(params: Mapping[str, str]) -> operate.Query:
    """A key search from a page's query string (the ``list`` options' names)."""
    status = params.get("status") or None
    if status is not None and status not in set(Status):
        raise ConfigError(f"status {status!r}: in_progress, completed or failed")
    older = params.get("older_than") or None
    return operate.Query(
        status=Status(status) if status else None,
        stale=params.get("stale") == "1",
        released=params.get("released") == "1",
        blocked=params.get("blocked") == "1",
        older_than=seconds(older, "older than") if older else None,
        prefix=params.get("prefix") or None,
    )


SORTS = {
    "key": "key", "status": "status", "attempts": "attempts", "lease": "lease_expires_at",
    "error": "error", "retriable": "retriable", "token": "fencing_token",
    "created": "created_at", "updated": "updated_at", "state": "state",
    "expiration": "expiration", "in_progress_until": "in_progress_expiration",
}  # fmt: skip
"""``?sort=NAME`` (``-NAME``: descending): the field of a listed item it orders by."""


def keys(where: Where, params: Mapping[str, str]) -> dict[str, Any]:
    """A page of ``list --json``'s records (masked) and the cursor to the next; ``?sort=``
    orders what the page holds (the store's order across pages stays the cursor's)."""
    order = sort_of(params)
    page = next(operate.records(where.target, query(params), PAGE, params.get("cursor") or None))
    at = datetime.now(UTC)
    items = [masked(item_document.document(r, at)) for r in page.items]
    if order is not None:
        items = sorted_by(items, SORTS[order[0]], order[1])
    return {
        "layout": where.target.layout,
        "items": items,
        "cursor": page.cursor,
        "skipped": page.skipped,
    }


def sort_of(params: Mapping[str, str]) -> tuple[str, bool] | None:
    """``?sort=``'s column and whether descending; None for the store's order."""
    text = (params.get("sort") or "").strip()
    if not text:
        return None
    name = text.removeprefix("-")
    if name not in SORTS:
        raise ConfigError(f"sort {text!r}: one of {', '.join(SORTS)} (-NAME: descending)")
    return name, text.startswith("-")


def sorted_by(items: list[dict[str, Any]], name: str, descending: bool) -> list[dict[str, Any]]:
    """``items`` by their ``name`` (numbers as numbers, the rest as text), those without it
    last; a stable sort, so that equal ones keep the store's order."""
    having = [i for i in items if i.get(name) is not None]
    lacking = [i for i in items if i.get(name) is None]

    def value(item: dict[str, Any]) -> tuple[int, Any]:
        found = item[name]
        return (0, float(found)) if isinstance(found, bool | int | float) else (1, str(found))

    return sorted(having, key=value, reverse=descending) + lacking


def key(where: Where, name: str, reveal: bool = False) -> dict[str, Any]:
    """``inspect --json``'s document; the result masked unless ``reveal``."""
    document = item_document.document(operate.inspect(where.target, name), datetime.now(UTC))
    return document if reveal else masked(document)


def entities(where: Where, params: Mapping[str, str]) -> dict[str, Any]:
    """A page of ``list --entities --json``."""
    prefix = params.get("prefix") or None
    page = next(operate.entities(where.target, prefix, PAGE, params.get("cursor") or None))
    at = datetime.now(UTC)
    return {"items": [item_document.document(e, at) for e in page.items], "cursor": page.cursor}


def tasks(where: Where, params: Mapping[str, str]) -> dict[str, Any]:
    """``tasks --json``'s lines, of one queue (``?queue=``) or all."""
    from idemctl.operate.documents import task as task_document

    found = operate.tasks(where.target, params.get("queue") or None)
    at = datetime.now(UTC)
    return {"items": [task_document.document(counts, at) for counts in found]}


def entity(where: Where, name: str) -> dict[str, Any]:
    """``inspect --entity --json``."""
    return item_document.document(operate.inspect_entity(where.target, name), datetime.now(UTC))


def outbox(where: Where) -> dict[str, Any]:
    """``outbox status --json`` (a PostgreSQL store's outbox)."""
    from idemctl.operate.documents import outbox_status

    return outbox_status.document(where.fields, operate.outbox_status(store_of(where)))


def no_outbox(where: Where) -> str | None:
    """Why the console's store has no outbox; None when it has one (a PostgreSQL store of
    idemctl's layout). Asks nothing of the store."""
    from idemctl.backends import for_url

    if where.target.layout != "idemctl":
        return f"a {where.target.layout} table has no outbox"
    kind = for_url(where.target.url).name
    if kind != "postgresql":
        return (
            f"the transactional outbox lives in a PostgreSQL store, and this one is {kind}: "
            "there is nothing to relay or replay here"
        )
    return None


OUTBOX_ROWS = PAGE
"""Rows the outbox page lists of each kind (unpublished, failing), the oldest first."""


def outbox_rows(where: Where) -> dict[str, Any]:
    """The oldest unpublished rows and the oldest failing ones, each with its id, what it
    is, how often its delivery failed and the last error (payload and headers left out)."""
    from idemctl.operate.brokers import outbox_pending

    store = store_of(where)

    def listed(failing: bool) -> list[dict[str, Any]]:
        rows = outbox_pending(store, OUTBOX_ROWS, failing)
        return [{k: v for k, v in r.to_json().items() if k not in ("payload", "headers")}
                for r in rows]  # fmt: skip

    return {"unpublished": listed(False), "failing": listed(True), "limit": OUTBOX_ROWS}


def audit(where: Where, params: Mapping[str, str]) -> dict[str, Any]:
    """``audit --json`` of a group on a topic, keyed as consume's defaults key (``key``
    for another template), the last ``last`` messages of each partition."""
    from idemctl.audit import AuditOptions
    from idemctl.operate.documents import audit as audit_document

    group, topic = params.get("group", "").strip(), params.get("topic", "").strip()
    if not group or not topic:
        raise ConfigError("an audit needs a group and a topic")
    extra: dict[str, Any] = {"key": params["key"]} if params.get("key") else {}
    last = params.get("last") or "10000"
    if not last.isdigit():
        raise ConfigError(f"last {last!r}: a whole number of messages")
    options = AuditOptions(
        brokers=where.brokers, topic=topic, group=group, last=int(last),
        kafka_config=where.kafka_config, **extra,
    )  # fmt: skip
    report = operate.audit(store_of(where), options)
    return audit_document.document(report, where.fields, report.failing())


def lost(
    where: Where, name: str, params: Mapping[str, str], logged: list[dict[str, Any]]
) -> dict[str, Any]:
    """What is known of the key ``name``, which an audit called lost: its record (masked)
    if the store has one, the message the link names (``group``, ``topic``, ``partition``,
    ``offset``: what the audit page said, not checked), and the operator log's lines on it
    (``logged``, the newest first)."""
    from idemctl.errors import KeyNotFound

    try:
        record: dict[str, Any] | None = key(where, name)
    except KeyNotFound:
        record = None
    message = {k: params[k] for k in ("group", "topic", "partition", "offset") if params.get(k)}
    about = [e for e in logged if name in (e.get("target"), e.get("key"))]
    return {"key": name, "record": record, "message": message, "logged": about,
            "log_read": len(logged)}  # fmt: skip


def masked(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with what the handler stored left out (``result_masked``)."""
    hidden = {k: v for k, v in MASKED.items() if document.get(k) is not None}
    return {**document, **hidden, "result_masked": bool(hidden)} if hidden else document


def store_of(where: Where) -> Any:
    """idemctl's own store under the console (the outbox's, the audited group's)."""
    store = getattr(where.target, "store", None)
    if store is None:
        raise ConfigError(f"a {where.target.name} table has no outbox and no consumer groups")
    return store


def seconds(text: str, name: str) -> float:
    """The duration ``text`` (``30s``, ``1h``), or ConfigError naming the field ``name``."""
    from idemctl.durations import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"{name} {text!r}: {exc}") from None
