"""The sequence guard on a DynamoDB store: its entities are items of the store's own table,
under a partition key no idempotency key can have (``items.ENTITY_PREFIX``), with the same
TTL attribute (``ttl``: ``expires_at`` in seconds). Nothing extra to provision.

Guard and settle are each one conditional UpdateItem that encodes the rules of
``machine.decide_guard`` and ``machine.decide_settle`` in its condition. When the condition
fails, the item that failed it (``ALL_OLD``) is judged by those very functions: most often
the answer is stale, busy or no longer held, and nothing is written; when they would write
all the same (an entity past retention starts anew, a settle that does not advance), the
entity they give is put, conditional on the item's ``version`` not having changed since,
and tried again from the start if it has.

Time is this machine's clock, as for keys (``DynamoDBCore._now``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from idemctl.errors import EntityNotFound, StoreError
from idemctl.model import (
    Entity,
    EntityPage,
    Guard,
    GuardReply,
    Settle,
    Verdict,
    validate_key,
)
from idemctl.stores.base import Progress, new_owner
from idemctl.stores.dynamodb.core import DynamoDBCore
from idemctl.stores.dynamodb.items import (
    ENTITY_PREFIX,
    entity_item,
    entity_key,
    from_ms,
    n,
    names_in,
    s,
    to_entity,
    to_ms,
    value_of,
)
from idemctl.stores.machine import decide_guard, decide_settle, entity_locked

ATTEMPTS = 20
"""How often one guard or settle starts again when other writers keep changing its entity
between reading and writing it (each time means somebody else's write went through)."""

_LIVE = "(attribute_not_exists(#exp) OR #exp > :now)"
"""Within retention (Entity.retention_over, negated)."""

_FREE = "(attribute_not_exists(#hold) OR attribute_not_exists(#lock) OR #lock <= :now)"
"""Nobody holds a live lock on it (Entity.locked, negated)."""


class DynamoDBEntities(DynamoDBCore):
    """The sequence guard: a part of DynamoDBStore."""

    def _guard_many(self, guards: Sequence[Guard], lease: float) -> list[GuardReply]:
        def guard(i: int) -> GuardReply:
            return self._guard_one(guards[i], lease)

        return self._each([g.entity for g in guards], guard)

    def _guard_one(self, g: Guard, lease: float) -> GuardReply:
        pk = entity_key(g.entity)
        retention = self.default_retention
        for _ in range(ATTEMPTS):
            now = self._now()
            until = now + to_ms(lease)
            expires = until + to_ms(retention)
            values: dict[str, Any] = {
                ":now": n(now),
                ":name": s(g.entity),
                ":seq": n(g.sequence),
                ":key": s(g.key),
                ":tok": n(g.fencing_token),
                ":until": n(until),
                ":exp": n(expires),
                ":ttl": n(expires // 1000),
                ":zero": n(0),
                ":one": n(1),
            }
            update = (
                "SET #ent = :name, #hold = :key, #htok = :tok, #lock = :until, #up = :now, "
                "#exp = :exp, #ttl = :ttl, #ver = if_not_exists(#ver, :zero) + :one"
            )
            # Go: absent (every attribute_not_exists holds) or within retention; newer than
            # the last applied sequence; and free, or held by this key's attempt or an
            # earlier one of it (taken over, so fenced by the key).
            condition = (
                f"{_LIVE} AND (attribute_not_exists(#seq) OR #seq < :seq) AND "
                f"({_FREE} OR (#hold = :key AND (attribute_not_exists(#htok) OR #htok <= :tok)))"
            )
            try:
                old = self._update(pk, update, condition, values, "ALL_OLD")
            except ClientError as exc:
                item = exc.response.get("Item")
            else:
                return GuardReply(Verdict.GO, value_of(old, "sequence"))
            if not item:  # deleted meanwhile (forget_entity, purge, TTL): as if absent
                continue
            at = _time(now)
            reply, entity = decide_guard(to_entity(item), g, at, lease, retention)
            if entity is None:
                return reply  # stale or busy, judged on the item that failed the condition
            # Go by the rules, though the condition said no: its retention is over, and it
            # starts anew.
            if self._put_entity(entity, item):
                return reply
        raise _kept_changing(g.entity)

    def _settle_many(self, settles: Sequence[Settle], retention: float) -> list[bool]:
        def settle(i: int) -> bool:
            return self._settle_one(settles[i], retention)

        return self._each([x.entity for x in settles], settle)

    def _settle_one(self, x: Settle, retention: float) -> bool:
        pk = entity_key(x.entity)
        # What this settle writes on the item, so that a repeat of its request (botocore
        # retries one whose answer was lost) is recognised as done rather than fenced.
        # Another call, even with the same key and token, has another, and is fenced.
        mark = new_owner()
        for _ in range(ATTEMPTS):
            now = self._now()
            values: dict[str, Any] = {
                ":now": n(now),
                ":key": s(x.key),
                ":tok": n(x.fencing_token),
                ":by": s(mark),
                ":zero": n(0),
                ":one": n(1),
            }
            condition = f"#hold = :key AND #htok = :tok AND {_LIVE}"
            version = "#ver = if_not_exists(#ver, :zero) + :one"
            if x.applied:
                expires = now + to_ms(retention)
                values.update(
                    {":seq": n(x.sequence), ":exp": n(expires), ":ttl": n(expires // 1000)}
                )
                condition += " AND (attribute_not_exists(#seq) OR #seq < :seq)"
                update = (
                    "SET #seq = :seq, #akey = :key, #aat = :now, #up = :now, #exp = :exp, "
                    f"#ttl = :ttl, #sby = :by, {version} REMOVE #hold, #htok, #lock"
                )
            else:
                update = f"SET #up = :now, #sby = :by, {version} REMOVE #hold, #htok, #lock"
            try:
                self._update(pk, update, condition, values, "NONE")
            except ClientError as exc:
                item = exc.response.get("Item")
            else:
                return True
            if item and value_of(item, "settled_by") == mark:
                return True  # this very settle, sent again after its answer was lost
            held, entity = decide_settle(
                to_entity(item) if item else None, x, _time(now), retention
            )
            if entity is None:
                return held  # another attempt holds it, or nobody does, or it is gone
            # Still held, but the sequence is not newer than the entity's: let go of it
            # without advancing.
            if self._put_entity(entity, item, settled_by=mark):
                return True
        raise _kept_changing(x.entity)

    def _put_entity(
        self, entity: Entity, old: dict[str, Any], settled_by: str | None = None
    ) -> bool:
        """Write ``entity`` whole if its item is still ``old`` (by ``version``); False if
        somebody changed it since."""
        version = value_of(old, "version")
        item = entity_item(entity, (version or 0) + 1)
        if settled_by is not None:
            item["settled_by"] = s(settled_by)
        if version is None:
            condition, values = "attribute_not_exists(#ver)", None
        else:
            condition, values = "#ver = :ver", {":ver": n(version)}
        kwargs: dict[str, Any] = {"ExpressionAttributeNames": names_in(condition)}
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            self._call("put_item", Item=item, ConditionExpression=condition, **kwargs)
        except ClientError:
            return False
        return True

    # The operator's side -------------------------------------------------------------------

    def get_entity(self, entity: str) -> Entity | None:
        item = self._call("get_item", Key={"key": s(entity_key(entity))}, ConsistentRead=True).get(
            "Item"
        )
        if not item:
            return None
        found = to_entity(item)
        return None if found.retention_over(_time(self._now())) else found

    def _entity_items(self, prefix: str = "") -> Iterator[list[dict[str, Any]]]:
        """Every entity item whose name starts with ``prefix`` (past retention included),
        a scan page at a time."""
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "ConsistentRead": True,
                "FilterExpression": "begins_with(#k, :pfx)",
                "ExpressionAttributeNames": {"#k": "key"},
                "ExpressionAttributeValues": {":pfx": s(ENTITY_PREFIX + prefix)},
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("scan", **kwargs)
            yield response.get("Items", [])
            start = response.get("LastEvaluatedKey")
            if not start:
                return

    def scan_entities(
        self, prefix: str | None = None, limit: int = 100, cursor: str | None = None
    ) -> EntityPage:
        """Live entities in name order. DynamoDB scans in hash order, so every entity under
        ``prefix`` is read and sorted for each page: an operator's command, not a hot path.
        The cursor is the last name of the page before."""
        now = _time(self._now())
        found = sorted(
            (e for items in self._entity_items(prefix or "") for e in map(to_entity, items)),
            key=lambda e: e.entity,
        )
        live = [
            e for e in found if not e.retention_over(now) and (cursor is None or e.entity > cursor)
        ]
        page = live[: max(limit, 0)]
        return EntityPage(page, page[-1].entity if len(live) > len(page) and page else None)

    def count_entities(self) -> int:
        values = {":pfx": s(ENTITY_PREFIX), ":now": n(self._now())}
        expression = f"begins_with(#k, :pfx) AND {_LIVE}"
        total = 0
        start: dict[str, Any] | None = None
        while True:
            kwargs: dict[str, Any] = {
                "ConsistentRead": True,
                "Select": "COUNT",
                "FilterExpression": expression,
                "ExpressionAttributeNames": names_in(expression),
                "ExpressionAttributeValues": values,
            }
            if start:
                kwargs["ExclusiveStartKey"] = start
            response = self._call("scan", **kwargs)
            total += int(response.get("Count", 0))
            start = response.get("LastEvaluatedKey")
            if not start:
                return total

    def forget_entity(self, entity: str, force: bool = False) -> Entity:
        """One conditional DeleteItem: within retention, and (unless ``force``) with no live
        hold on it; the item that failed the condition says which it was."""
        validate_key(entity, "entity")
        now = self._now()
        condition = f"attribute_exists(#k) AND {_LIVE}"
        if not force:
            condition += f" AND {_FREE}"
        try:
            response = self._call(
                "delete_item",
                Key={"key": s(entity_key(entity))},
                ConditionExpression=condition,
                ExpressionAttributeNames=names_in(condition),
                ExpressionAttributeValues={":now": n(now)},
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            item = exc.response.get("Item")
            found = to_entity(item) if item else None
            if found is None or found.retention_over(_time(now)):
                raise EntityNotFound(entity) from None
            raise entity_locked(found) from None
        return to_entity(response["Attributes"])

    def _purge_entities(
        self, cutoff: int, dry_run: bool, size: int, progress: Progress | None
    ) -> int:
        """Delete the entities whose retention ended by ``cutoff`` (ms), each by a
        conditional DeleteItem that skips one guarded again since; how many (with
        ``dry_run``, how many would be). ``progress`` as for keys, ``size`` a batch."""
        over = [
            value_of(item, "key")
            for items in self._entity_items()
            for item in items
            if (expires := value_of(item, "expires_at")) is not None and expires <= cutoff
        ]
        if dry_run:
            return len(over)
        purged = 0
        for i in range(0, len(over), size):
            batch = over[i : i + size]
            purged += sum(1 for pk in batch if self._delete_over(pk, cutoff))
            if progress is not None:
                progress(len(batch))
        return purged

    def _delete_over(self, key: str, cutoff: int) -> bool:
        """Delete the item of ``key`` if its retention ended by ``cutoff`` (ms); False if
        it was claimed (or guarded) again."""
        try:
            self._call(
                "delete_item",
                Key={"key": s(key)},
                ConditionExpression="#exp <= :cut",
                ExpressionAttributeNames={"#exp": "expires_at"},
                ExpressionAttributeValues={":cut": n(cutoff)},
            )
        except ClientError:
            return False
        return True


def _time(ms: int) -> datetime:
    """A time the store wrote (ms) as the rules of ``machine`` take it."""
    return from_ms(ms) or datetime.now(UTC)


def _kept_changing(entity: str) -> StoreError:
    return StoreError(
        f"entity {entity!r} kept changing under this request ({ATTEMPTS} tries); try again"
    )
